"""The host time DeepSpeed ZeRO-2 adds to a training step, by gradient bucket size, on one process.

Owns the measurement behind a finding of the GPU trainer runs: `llava-norm train` at the 3B shape
is bound by its host, and DeepSpeed's gradient hooks are its largest host cost (bench/RESULTS.md).
ZeRO-2 copies each gradient into a bucket of ``reduce_bucket_size`` elements and reduces the bucket
when the next gradient does not fit (a gradient larger than the bucket on its own). With ``auto``
(as configs/deepspeed/zero2.json had it) transformers fills in hidden_size squared: at
Llama-3.2-3B 9.4M elements, 1.8 times the mean of its 679 trained tensors. The shipped zero2.json
now sets 5e7 elements, 5.3 times that (bench/zero2_bucket_auto.json keeps the ``auto`` config for
a GPU comparison).

This script keeps the bucket's size against the tensors at a scale a CPU trains in milliseconds:
tiny backbones as deep as the paper's 3B stack (SigLIP-SO400M's 27 encoder layers, Llama-3.2-3B's
28 decoder layers, 679 trained tensors), whose ``auto`` bucket (hidden 96, squared) is 1.7 times
their mean tensor, and a bucket of 5e4 elements 5.4 times ``auto``, as 5e7 is at the 3B. The ratio
to the mean is nominal: how many reductions a step makes also depends on the spread of the sizes.
It runs `llava-norm train` (stage 2, one process, every parameter trained, batch 1) without
DeepSpeed and with ZeRO-2 at each bucket size, the variants alternating round by round, and prints
each one's median step time, what ZeRO-2 adds over no DeepSpeed, and whether the losses moved. On
a CPU DeepSpeed skips the CUDA stream work (events, waits, copies between streams) each reduction
does on a GPU: this measures the host's Python per gradient and per bucket, not that.

    .venv/bin/python bench/zero_overhead.py                       # auto, 5e4, 5e5 elements; about 3 min
    .venv/bin/python bench/zero_overhead.py --buckets auto 5e4 2e5 5e5 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _repo import REPO_ROOT

DEPTH = {"vision": 27, "text": 28}  # SigLIP-SO400M-384's encoder layers, Llama-3.2-3B's decoder layers
SKIP = 5  # first steps: warm-up (allocations, DeepSpeed's first bucket set-up)


def setup(work: Path) -> Path:
    """Tiny deep backbones, the demo's synthetic stage-2 rows and the run's YAML (made once)."""
    from llava_norm_demo.synth import build_world
    from llava_norm_demo.tiny import TinySizes, Tower, make_tiny

    if not (work / "tiny" / "llama" / "config.json").is_file():
        sizes = TinySizes(vision=Tower(hidden=64, layers=DEPTH["vision"], heads=4, intermediate=256),
                          text=Tower(hidden=96, layers=DEPTH["text"], heads=4, intermediate=192, kv_heads=2))
        make_tiny(work / "tiny", seed=0, sizes=sizes)
    if not (work / "world" / "manifest.json").is_file():
        build_world(work / "world", n_pretrain=0, n_instruct=400, n_text=0, n_bench=0)
    config = work / "run.yaml"
    config.write_text(
        f"base: [{REPO_ROOT}/configs/_base/tiny_stage2.yaml]\n"
        f"model: {{vision_tower: {work}/tiny/siglip, llm: {work}/tiny/llama, norm_alignment: ln_textnorm_gwc}}\n"
        f"data: {{mixture: [{{path: {work}/world/instruct/synth_instruct.json, image_folder: {work}/world/images}}], "
        f"num_workers: 0}}\n"
        f"train: {{output_dir: {work}/runs/none, per_device_batch_size: 1, global_batch_size: 1, grad_accum: 1, "
        "save_steps: 0, report_to: [], restart: true, logging_steps: 1, train_vision_tower: true}\n")
    return config


def deepspeed_json(work: Path, bucket: str) -> str:
    """configs/deepspeed/zero2.json with ``reduce_bucket_size`` set (``auto``: hidden_size squared); ``none``: no
    DeepSpeed."""
    if bucket == "none":
        return "null"
    ds = json.loads((REPO_ROOT / "configs" / "deepspeed" / "zero2.json").read_text())
    ds["zero_optimization"]["reduce_bucket_size"] = bucket if bucket == "auto" else int(float(bucket))
    path = work / f"zero2_bucket{bucket}.json"
    path.write_text(json.dumps(ds, indent=1))
    return str(path)


def step_seconds(config: Path, work: Path, bucket: str, steps: int, threads: int) -> tuple[list[float], list[float]]:
    """(seconds of each step after the first SKIP, the loss of every step) of one run."""
    out = work / "runs" / bucket
    command = [sys.executable, "-m", "llava_norm.cli", "train", str(config), f"train.output_dir={out}",
               f"train.max_steps={steps}", f"train.deepspeed={deepspeed_json(work, bucket)}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    run = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"bucket {bucket}: llava-norm train failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    history = json.loads((out / "train_summary.json").read_text())["log_history"]
    steps = [h for h in history if "tokens_per_second" in h]
    return [h["tokens"] / h["tokens_per_second"] for h in steps][SKIP:], [h["loss"] for h in steps]


def trained_tensors(config: Path) -> tuple[int, int]:
    """(trained elements, trained tensors) of the run's model, as the trainer freezes it."""
    from llava_norm.config import load_config
    from llava_norm.model.builder import ModelSpec, build_model
    from llava_norm.train.params import freeze_backbones

    run = load_config(config, check_paths=False)
    m = run.model
    model = build_model(ModelSpec(vision_tower=m.vision_tower, llm=m.llm, norm_alignment=m.norm_alignment)).model
    freeze_backbones(model, run.train.stage, run.train.train_vision_tower)
    trained = [p for p in model.parameters() if p.requires_grad]
    return sum(p.numel() for p in trained), len(trained)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--buckets", nargs="+", default=["auto", "5e4", "5e5"],
                        help="reduce_bucket_size values in elements ('auto': hidden_size squared, as shipped)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("/tmp/llava-norm-zero-overhead"))
    args = parser.parse_args()
    config = setup(args.work)
    elements, tensors = trained_tensors(config)
    variants = ["none", *args.buckets]
    times: dict[str, list[float]] = {v: [] for v in variants}
    losses: dict[str, list[float]] = {}
    for round_ in range(args.rounds):  # alternating, order flipped each round: load hits all alike
        for bucket in variants if round_ % 2 == 0 else variants[::-1]:
            seconds, losses[bucket] = step_seconds(config, args.work, bucket, args.steps, args.threads)
            times[bucket] += seconds
            print(f"round {round_ + 1}: {bucket}: median step {statistics.median(seconds) * 1e3:.1f} ms", flush=True)
    # bucketing changes when a gradient is reduced, not its value: the losses must not move
    zero2 = [losses[b] for b in args.buckets]
    print(f"losses (last round): the ZeRO-2 variants equal at every step: {all(l == zero2[0] for l in zero2)}; "
          f"against no DeepSpeed at most {max(abs(a - b) for a, b in zip(zero2[0], losses['none'])):.1e} apart")
    base = statistics.median(times["none"])
    print(f"trained: {elements:,} elements in {tensors} tensors; {args.steps - SKIP} steps x {args.rounds} rounds each")
    print(f"no DeepSpeed: median step {base * 1e3:.1f} ms")
    for bucket in args.buckets:
        size = 96 ** 2 if bucket == "auto" else int(float(bucket))  # the tiny LLM's hidden size, squared
        median = statistics.median(times[bucket])
        print(f"ZeRO-2, reduce_bucket_size {bucket} ({size:,} elements, {tensors * size / elements:.1f}x the mean "
              f"trained tensor): median step {median * 1e3:.1f} ms, "
              f"{(median - base) * 1e3:+.1f} ms over no DeepSpeed ({median / base:.2f}x)")


if __name__ == "__main__":
    main()
