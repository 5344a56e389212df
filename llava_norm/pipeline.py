"""``scripts/pipeline.sh``: stage 1 -> stage 2 -> evaluation -> results table, per arm.

Owns the chain and its bookkeeping: a run directory per arm (``<runs>/<arm>/{stage1,stage2,eval}``),
a step is skipped when its output is complete (``train_summary.json`` is written last by a
finished training run; ``summary.json`` of an evaluation lists every requested benchmark for
the current weights), each step's output goes to a log file beside its results, and one
progress bar with time left covers the whole chain. Training and evaluation run through the
launch scripts, so the pipeline uses exactly the multi-process paths users launch by hand.
``make demo`` builds on ``plan`` and ``run_steps``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Step:
    name: str
    done: Callable[[], bool]
    run: Callable[[], None]


@dataclass
class PipelineConfig:
    arms: list[str]  # config directories holding stage1.yaml and stage2.yaml; the first is the baseline
    runs_dir: str = "runs/pipeline"
    data_root: str = "data/eval"
    benchmarks: str = "all"
    stage1_overrides: list[str] = field(default_factory=list)
    stage2_overrides: list[str] = field(default_factory=list)
    eval_args: list[str] = field(default_factory=list)
    table: str | None = None  # output prefix; default <runs>/results
    stream: bool = False  # show the launched processes' output instead of logging it to files
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the launches (GPUS_PER_NODE, ...)


def arm_name(config_dir: str | Path) -> str:
    return Path(config_dir).resolve().name


def launch(command: list[str], log: Path | None, env: dict | None = None) -> None:
    """Run a launch script from the repo root; on failure, show the log's tail and stop."""
    environment = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    if log is None:
        subprocess.run(command, cwd=REPO, env=environment, check=True)
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as handle:
        handle.write(f"\n$ {' '.join(command)}\n")
        handle.flush()
        code = subprocess.run(command, cwd=REPO, env=environment, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise RuntimeError(f"step failed (exit {code}): {' '.join(command)}\n--- last lines of {log} ---\n{tail}")


def _evaluated(eval_dir: Path, checkpoint: Path, benchmarks: str) -> bool:
    from llava_norm.evaluation.benchmarks import BENCHMARKS
    from llava_norm.evaluation.runner import checkpoint_fingerprint

    summary = eval_dir / "summary.json"
    if not summary.exists():
        return False
    results = json.loads(summary.read_text())["benchmarks"]
    wanted = list(BENCHMARKS) if benchmarks == "all" else benchmarks.split(",")
    fingerprint = checkpoint_fingerprint(checkpoint)
    return all(b in results and results[b]["settings"]["checkpoint_fingerprint"] == fingerprint for b in wanted)


def arm_steps(config: PipelineConfig, config_dir: str) -> list[Step]:
    arm = arm_name(config_dir)
    cfg = Path(config_dir).resolve()
    runs = Path(config.runs_dir).resolve() / arm
    stage1, stage2, eval_dir = runs / "stage1", runs / "stage2", runs / "eval"
    logs = None if config.stream else runs
    for stage in ("stage1", "stage2"):
        if not (cfg / f"{stage}.yaml").is_file():
            raise FileNotFoundError(f"{cfg}: no {stage}.yaml (an arm directory needs stage1.yaml and stage2.yaml)")

    def train(stage: int) -> Callable[[], None]:
        def run() -> None:
            out = stage1 if stage == 1 else stage2
            script = "scripts/pretrain.sh" if stage == 1 else "scripts/finetune.sh"
            extra = config.stage1_overrides if stage == 1 else [
                f"model.pretrained_projector={stage1 / 'projector.safetensors'}", *config.stage2_overrides]
            launch(["bash", script, str(cfg / f"stage{stage}.yaml"), f"train.output_dir={out}", *extra],
                   logs and logs / f"stage{stage}.log", config.env)
        return run

    def evaluate() -> None:
        launch(["bash", "scripts/eval.sh", str(stage2 / "model"), config.benchmarks, "--out", str(eval_dir),
                "--name", arm, *config.eval_args], logs and logs / "eval.log",
               env={**config.env, "EVAL_DATA": str(Path(config.data_root).resolve())})

    return [
        Step(f"{arm}: stage 1", lambda: (stage1 / "train_summary.json").exists(), train(1)),
        Step(f"{arm}: stage 2", lambda: (stage2 / "train_summary.json").exists(), train(2)),
        Step(f"{arm}: eval", lambda: _evaluated(eval_dir, stage2 / "model", config.benchmarks), evaluate),
    ]


def table_step(config: PipelineConfig) -> Step:
    def run() -> None:
        from llava_norm.evaluation.table import write_table

        dirs = [Path(config.runs_dir).resolve() / arm_name(a) / "eval" for a in config.arms]
        md, _ = write_table(dirs, config.table or Path(config.runs_dir) / "results", baseline=arm_name(config.arms[0]))
        tqdm.write(md.read_text())

    return Step("results table", lambda: False, run)


def plan(config: PipelineConfig) -> list[Step]:
    names = [arm_name(a) for a in config.arms]
    if len(set(names)) != len(names):
        raise ValueError(f"arm directories must have distinct names, got {names}")
    return [step for arm in config.arms for step in arm_steps(config, arm)] + [table_step(config)]


def run_steps(steps: list[Step], desc: str = "pipeline") -> list[tuple[str, str, float]]:
    """Run the steps in order under one progress bar; returns (name, 'done'|'reused', seconds)."""
    record = []
    bar = tqdm(steps, desc=desc, unit="step", dynamic_ncols=True,
               bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")
    for step in bar:
        bar.set_postfix_str(step.name)
        start = time.perf_counter()
        if step.done():
            record.append((step.name, "reused", 0.0))
            continue
        step.run()
        record.append((step.name, "done", time.perf_counter() - start))
    bar.close()
    return record
