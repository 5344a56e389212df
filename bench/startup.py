"""CPU time of a training process's start-up: its imports with and without ``frozen_imports``
(and with it, with and without ``one_scan_of_transformers_models``, as ``llava-norm`` starts:
with an empty store of transformers' scans, so the process scans and stores, and with a store
an earlier process filled), and DeepSpeed's Muon import with and without ``defer_muon_compile``.

Owns the measurement behind the start-up rules of ``llava_norm.worker`` and
``llava_norm.train.deepspeed_setup``. Each figure is the CPU time (user and system) of one fresh
process, the median of ``--repeats``; the variants alternate, so a busy machine slows them alike.

    .venv/bin/python bench/startup.py          # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from _repo import REPO_ROOT

# What `llava-norm train` imports before its work, then what a DeepSpeed launch adds, then the
# collection accelerate runs as training starts. Each prints its own CPU seconds.
PROBE = """
import gc, json, resource, sys
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
variant = sys.argv[1]
start = cpu()
from llava_norm.worker import frozen_imports, one_scan_of_transformers_models
if variant in ("one-scan", "stored"):
    one_scan_of_transformers_models()
if variant in ("frozen", "one-scan", "stored"):
    with frozen_imports():
        import torch.distributed, llava_norm.train.run, deepspeed
else:
    import torch.distributed, llava_norm.train.run, deepspeed
imports = cpu() - start
start = cpu()
if variant == "deferred":
    from llava_norm.train.deepspeed_setup import defer_muon_compile
    defer_muon_compile()
import deepspeed.runtime.zero.muon.muon_optimizer
muon = cpu() - start
start = cpu()
gc.collect()
print(json.dumps({"imports": imports, "muon": muon, "collect": cpu() - start}))
"""


def measure(variant: str, store: str) -> dict:
    """One fresh process; ``store``: where it keeps transformers' scans (llava_norm.worker.scan_store)."""
    done = subprocess.run([sys.executable, "-c", PROBE, variant], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True, env={**os.environ, "LLAVA_NORM_SCAN_STORE": store})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = {"plain": [], "frozen": [], "one-scan": [], "stored": [], "deferred": []}
    with tempfile.TemporaryDirectory() as kept:
        measure("stored", kept)  # fills the store the "stored" processes read
        for _ in range(args.repeats):
            for variant in runs:
                with tempfile.TemporaryDirectory() as empty:  # every other process starts with none
                    runs[variant].append(measure(variant, kept if variant == "stored" else empty))
    med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in runs.items()}
    plain, frozen, one_scan, stored, deferred = (med[v] for v in runs)
    print(f"imports (torch, transformers, DeepSpeed, llava_norm.train.run): {plain['imports']:.2f} CPU-s; "
          f"under frozen_imports {frozen['imports']:.2f} ({frozen['imports'] / plain['imports']:.2f}x); "
          f"and with transformers' model folders scanned once {one_scan['imports']:.2f} "
          f"({one_scan['imports'] - frozen['imports']:+.2f} CPU-s, the scans stored), or read from the store "
          f"{stored['imports']:.2f} ({stored['imports'] - frozen['imports']:+.2f})")
    print(f"gc.collect() after them (accelerate's, as training starts): {plain['collect']:.3f} CPU-s; "
          f"frozen {frozen['collect']:.3f}")
    print(f"DeepSpeed's Muon import (ZeRO's optimizer check): {plain['muon']:.2f} CPU-s; "
          f"deferred {deferred['muon']:.3f}")
    print(json.dumps({"median_of": args.repeats, **med}))


if __name__ == "__main__":
    main()
