"""``llava-norm ablation``: the demo's world, every arm, three seeds, one statistics table.

Owns the tiny ablation profile. It shares the demo's first three steps (world, backbones,
warm-up: reused when the demo has run, by their provenance records), then sweeps every arm of
``configs/tiny`` x the seeds through the pipeline (``llava_norm.pipeline`` with ``seeds``, the
code behind ``llava-norm sweep``), and ends with the results table and its statistics over
seeds under ``<root>/ablation/``: ``results_stats.md``, ``results_stats.csv``,
``results_forest.png``, and the per-run ``results.md``. The schedule is half the demo's, so
27 chains fit in about 20 minutes on 2 cores; ``timings.json`` records what each step took on
which machine.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from llava_norm.config_schema import NORM_ARMS
from llava_norm.chain_launch import REPO
from llava_norm.pipeline import plan, run_steps
from llava_norm_demo.driver import (
    FULL,
    DemoPaths,
    DemoProfile,
    machine_facts,
    pipeline_config,
    shared_steps,
)

BASELINE = "none"
SEEDS = (0, 1, 2)
# Half the demo's steps per stage (100 x 16 captions, 250 x 8 instructions), one checkpoint at
# the end of each: the demo's world, warm-up and evaluation are kept so its steps are reused.
ABLATION = replace(FULL, name="ablation", stage1=("train.max_steps=100", "train.save_steps=100"),
                   stage2=("train.max_steps=250", "train.save_steps=250"))


def ablation_arms(arms: tuple[str, ...] | None = None) -> list[str]:
    """The arm config directories of ``configs/tiny``: every arm (or ``arms``), the baseline first."""
    names = arms or tuple(NORM_ARMS)
    unknown = [n for n in names if n not in NORM_ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; configs/tiny has {', '.join(NORM_ARMS)}")
    return [str(REPO / "configs" / "tiny" / name) for name in (BASELINE, *[n for n in names if n != BASELINE])]


def run_ablation(root: str | Path = REPO / "runs", seeds: tuple[int, ...] = SEEDS, profile: DemoProfile = ABLATION,
                 arms: tuple[str, ...] | None = None, code_counts: bool = False) -> Path:
    """Run (or resume) the ablation under ``root``; returns the path of ``results_stats.md``."""
    # lazy: transformers loads only when the ablation runs
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar, not one per weight file
    paths = DemoPaths(Path(root).resolve())
    out = paths.root / "ablation"
    out.mkdir(parents=True, exist_ok=True)
    config = replace(pipeline_config(paths, profile), arms=ablation_arms(arms), runs_dir=str(out),
                     seeds=list(seeds), code_counts=code_counts)
    sweep, marks = plan(config)
    steps = [*shared_steps(paths, profile, code_counts), *sweep]
    start = time.perf_counter()
    record = run_steps(steps, desc=f"ablation ({len(config.arms)} arms x {len(seeds)} seeds)", marks=marks)
    facts = machine_facts(profile.threads)
    timings = {"profile": profile.name, "total_s": round(time.perf_counter() - start, 1), "machine": facts,
               "steps": [{"step": name, "status": status, "seconds": round(seconds, 1)}
                         for name, status, seconds in record]}
    (out / "timings.json").write_text(json.dumps(timings, indent=1) + "\n")
    return out / "results_stats.md"
