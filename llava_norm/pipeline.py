"""``scripts/pipeline.sh``: stage 1 -> stage 2 -> evaluation -> results table, per arm and seed.

Owns the chain: a step is reused only when its decision (``llava_norm.reuse``: its provenance
record matches the record of what it would compute now, and its outputs are still the ones
recorded) says so. Otherwise it runs, with the differing keys or inputs in the log,
and so does every later step of the same arm. An interrupted stage whose record matches is
resumed, not restarted. The code version is recorded and reported but only counts with
``code_counts``; ``reuse_stale`` keeps a stale step on purpose, and the table marks its row.
Each launch's output goes to a log file beside its results; one progress bar covers the chain.
Training and evaluation run through the launch scripts, so the pipeline uses exactly the
multi-process paths users launch by hand. ``make demo`` builds on ``Step`` and ``run_steps``;
``llava-norm sweep`` (``llava_norm.sweep``) on ``seeds``, ``task`` and ``table_only``. With
seeds, each arm trains once per seed (``train.seed``) into ``<runs>/<arm>/seed<k>/`` and is
named ``<arm>@seed<k>``; the table then carries the statistics over seeds
(``analysis.ablation``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from llava_norm.analysis.ablation import run_name, write_tables
from llava_norm.chain_launch import launch
from llava_norm.config import ConfigError, load_config, stage_problem
from llava_norm.evaluation.arguments import DEFAULT_DATA_ROOT, parse_eval_args
from llava_norm.evaluation.table import EVAL_SUMMARY
from llava_norm.layout import MODEL_DIR, PROJECTOR_FILE
from llava_norm.provenance import Record, fingerprint, read_record, write_record
from llava_norm.reuse import Decision, compare, eval_decision, stage_decision


@dataclass
class Step:
    name: str
    check: Callable[[], Decision | bool]  # a plain bool: reuse when True (the demo's own steps)
    run: Callable[[], None]
    arm: str | None = None  # steps of one arm form a chain: once one runs, every later one runs
    decision: Decision | None = None  # set by run_steps before ``run``

    def decide(self) -> Decision:
        found = self.check()
        return found if isinstance(found, Decision) else Decision(bool(found), [] if found else ["not done yet"])


@dataclass
class PipelineConfig:
    arms: list[str]  # config directories holding stage1.yaml and stage2.yaml; the first is the baseline
    runs_dir: str = "runs/pipeline"
    data_root: str = DEFAULT_DATA_ROOT
    benchmarks: str = "all"
    stage1_overrides: list[str] = field(default_factory=list)
    stage2_overrides: list[str] = field(default_factory=list)
    eval_args: list[str] = field(default_factory=list)
    table: str | None = None  # output prefix; default <runs>/results
    stream: bool = False  # show the launched processes' output instead of logging it to files
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the launches (GPUS_PER_NODE, ...)
    code_counts: bool = False  # a different code version or library makes a step stale
    reuse_stale: bool = False  # keep finished but stale steps (their rows are marked in the table)
    seeds: list[int] = field(default_factory=list)  # empty: each arm once, with its config's train.seed
    task: int | None = None  # only the chain of this run (index into ``runs``), no table: one array task
    table_only: bool = False  # tabulate the evaluations that exist; decide and run nothing


def arm_name(config_dir: str | Path) -> str:
    return Path(config_dir).resolve().name


@dataclass(frozen=True)
class RunSpec:
    """One chain of the grid: an arm's config directory trained with one seed (None: the config's)."""

    config_dir: str
    seed: int | None = None

    @property
    def arm(self) -> str:
        return arm_name(self.config_dir)

    @property
    def name(self) -> str:
        return run_name(self.arm, self.seed)


def runs(config: PipelineConfig) -> list[RunSpec]:
    """Every (arm, seed) chain, arm-major, the baseline arm first."""
    names = [arm_name(a) for a in config.arms]
    if len(set(names)) != len(names):
        raise ValueError(f"arm directories must have distinct names, got {names}")
    if len(set(config.seeds)) != len(config.seeds):
        raise ValueError(f"seeds must be distinct, got {config.seeds}")
    return [RunSpec(arm, seed) for arm in config.arms for seed in (config.seeds or [None])]


def recorded_step(name: str, out: Path, expected: Callable[[], Record], run: Callable[[], None],
                  code_counts: bool = False) -> Step:
    """A step that writes one folder and leaves its provenance record in it (the demo's world,
    backbones and warm-up): reused only when the record matches ``expected()`` and the folder is
    still what was recorded, like the training stages."""

    def check() -> Decision:
        want, found = expected(), read_record(out)
        if found is None:
            return Decision(False, ["its output has no provenance record" if out.exists() else "not run yet"],
                            stale=out.exists())
        reasons, notes = compare(found, want, code_counts)
        changed = found.outputs.get("folder") != fingerprint(out)  # whatever else differs: never kept then
        if changed:
            reasons.append("its output was changed after it was recorded")
        return Decision(not reasons, reasons, notes, stale=bool(reasons), finished=not changed)

    def execute() -> None:
        record = expected()
        run()  # an interrupted run leaves no record: its folder is not reused
        record.complete, record.outputs = True, {"folder": fingerprint(out)}
        write_record(out, record)

    return Step(name, check, execute)


def launch_world_size(env: dict[str, str]) -> int:
    """The processes ``scripts/_launch.sh`` will start with this environment (a recorded input)."""
    merged = {**os.environ, **env}
    per_node = merged.get("GPUS_PER_NODE")
    if not per_node:
        import torch  # only where the launcher would also ask torch for the GPU count

        per_node = str(max(torch.cuda.device_count(), 1))
    return int(per_node) * int(merged.get("NNODES") or merged.get("SLURM_NNODES") or 1)


@dataclass(frozen=True)
class ArmDirs:
    """Where one run's steps write: ``<runs>/<arm>[/seed<k>]/{stage1,stage2,eval}``, logs beside them."""

    root: Path

    @classmethod
    def of(cls, runs_dir: str | Path, arm: str, seed: int | None = None) -> ArmDirs:
        root = Path(runs_dir).resolve() / arm
        return cls(root if seed is None else root / f"seed{seed}")

    @property
    def stage1(self) -> Path:
        return self.root / "stage1"

    @property
    def stage2(self) -> Path:
        return self.root / "stage2"

    @property
    def eval(self) -> Path:
        return self.root / "eval"


def eval_argv(config: PipelineConfig, dirs: ArmDirs, name: str) -> list[str]:
    """The ``llava-norm eval`` words for one run: what is launched and what its reuse is judged by."""
    return [str(dirs.stage2 / MODEL_DIR), "--benchmarks", config.benchmarks, "--out", str(dirs.eval), "--name", name,
            "--data-root", str(Path(config.data_root).resolve()), *config.eval_args]


def arm_dir_problems(config_dir: str) -> list[str]:
    """Why ``config_dir`` is not an arm directory (a folder with stage1.yaml and stage2.yaml)."""
    cfg = Path(config_dir).resolve()
    if not cfg.is_dir():
        return [f"{cfg}: no such arm directory (from {Path.cwd()}; an arm directory holds stage1.yaml and stage2.yaml)"]
    return [f"{cfg}: no {stage}.yaml (an arm directory needs stage1.yaml and stage2.yaml)"
            for stage in ("stage1", "stage2") if not (cfg / f"{stage}.yaml").is_file()]


def arm_steps(config: PipelineConfig, config_dir: str, seed: int | None = None) -> list[Step]:
    """Stage 1, stage 2 and evaluation of one arm with one seed (None: the config's own)."""
    arm = run_name(arm_name(config_dir), seed)  # the chain's name: its steps, log lines and table row
    cfg = Path(config_dir).resolve()
    dirs = ArmDirs.of(config.runs_dir, arm_name(config_dir), seed)
    runs, stage1, stage2, eval_dir = dirs.root, dirs.stage1, dirs.stage2, dirs.eval
    logs = None if config.stream else runs
    world = launch_world_size(config.env)
    missing = arm_dir_problems(config_dir)
    if missing:
        raise FileNotFoundError(missing[0])

    def overrides(stage: int) -> list[str]:
        seeded = [] if seed is None else [f"train.seed={seed}"]
        if stage == 1:
            return [*config.stage1_overrides, *seeded]
        return [f"model.pretrained_projector={stage1 / PROJECTOR_FILE}", *config.stage2_overrides, *seeded]

    def train_step(stage: int) -> Step:
        out = stage1 if stage == 1 else stage2

        def run() -> None:
            decision = step.decision
            # A stale or forced rerun replaces the run; a matching interrupted one is resumed.
            restart = ["train.restart=true"] if decision and (decision.stale or decision.forced) else []
            script = "scripts/pretrain.sh" if stage == 1 else "scripts/finetune.sh"
            launch(["bash", script, str(cfg / f"stage{stage}.yaml"), f"train.output_dir={out}", *overrides(stage),
                    *restart], logs and logs / f"stage{stage}.log", config.env)

        step = Step(f"{arm}: stage {stage}",
                    lambda: stage_decision(cfg / f"stage{stage}.yaml", overrides(stage), out, world, config.code_counts),
                    run, arm)
        return step

    def evaluate() -> None:
        decision = evaluation.decision
        # The runner itself recomputes a benchmark whose settings differ (--replace-stale); a
        # forced step, or a code change that counts, needs every result recomputed.
        redo = ["--overwrite"] if decision and (decision.forced or (config.code_counts and decision.stale)) else []
        launch(["bash", "scripts/eval.sh", *eval_argv(config, dirs, arm), "--replace-stale", *redo],
               logs and logs / "eval.log", env=config.env)

    def check_eval() -> Decision:
        return eval_decision(eval_argv(config, dirs, arm), eval_dir, config.code_counts)

    evaluation = Step(f"{arm}: eval", check_eval, evaluate, arm)
    return [train_step(1), train_step(2), evaluation]


def _mark_unmatched(config: PipelineConfig, specs: list[RunSpec], marks: dict[str, list[str]]) -> None:
    """For a table of runs it did not just run: every step is decided as a rerun would decide
    it, and what would not be reused (or was made by another version) marks the run's row."""
    for spec in specs:
        for step in arm_steps(config, spec.config_dir, spec.seed):
            what = step.name.split(": ", 1)[-1]
            try:
                decision = step.decide()
            except (ValueError, OSError) as error:  # its config no longer loads (a stage 1 restarted, say)
                marks[spec.name].append(f"{what} does not match a rerun: {error}")
                continue
            if not decision.reuse:
                marks[spec.name].append(f"{what} does not match a rerun: {'; '.join(decision.reasons)}")
            marks[spec.name] += [f"{what} made by another version: {note}" for note in decision.notes]


def table_step(config: PipelineConfig, marks: dict[str, list[str]]) -> Step:
    def run() -> None:
        grid = runs(config)
        dirs = {spec.name: ArmDirs.of(config.runs_dir, spec.arm, spec.seed) for spec in grid}
        if config.table_only:  # whatever runs exist (a sweep's array tasks may not all have finished)
            unfinished = [name for name, d in dirs.items() if not (d.eval / EVAL_SUMMARY).is_file()]
            dirs = {name: d for name, d in dirs.items() if name not in unfinished}
            if not dirs:
                raise FileNotFoundError(f"no finished evaluation under {Path(config.runs_dir).resolve()}")
            if unfinished:  # a failed or unfinished array task: said, or the table looks complete
                tqdm.write(f"[pipeline] {len(unfinished)} of {len(grid)} runs have no finished evaluation and are "
                           f"left out of the tables: {', '.join(unfinished)}")
            _mark_unmatched(config, [spec for spec in grid if spec.name in dirs], marks)
        first_name, first = next(iter(dirs.items()))
        # Where the checkpoints and the benchmark files are now, which the evaluations' own
        # records (the paths at evaluation time) cannot know after a move.
        requests = parse_eval_args(eval_argv(config, first, first_name)).benchmarks
        prefix = Path(config.table or Path(config.runs_dir) / "results")
        names = [r.name for r in requests]
        md, _, stats = write_tables({name: d.eval for name, d in dirs.items()}, prefix, arm_name(config.arms[0]),
                                    first_name, names, {r.name: r.options for r in requests},
                                    {r.name: Path(r.path) for r in requests}, marks,
                                    {name: d.stage2 / MODEL_DIR for name, d in dirs.items()})
        tqdm.write(stats.read_text())
        tqdm.write(f"per-run table: {md}")

    return Step("results table", lambda: False, run)


def plan(config: PipelineConfig) -> tuple[list[Step], dict[str, list[str]]]:
    """The steps, and the marks ``run_steps`` fills in for the table (per run: stale reuse, code)."""
    grid = runs(config)
    marks: dict[str, list[str]] = {spec.name: [] for spec in grid}
    if config.table_only:
        return [table_step(config, marks)], marks
    if config.task is not None:
        if not 0 <= config.task < len(grid):
            raise ValueError(f"task {config.task} is not in 0..{len(grid) - 1} ({len(grid)} runs: arms x seeds)")
        grid = [grid[config.task]]
    folders = list(dict.fromkeys(spec.config_dir for spec in grid))
    missing = [problem for config_dir in folders for problem in arm_dir_problems(config_dir)]
    if missing:  # every arm's at once
        raise FileNotFoundError("\n".join(missing))
    steps = [step for spec in grid for step in arm_steps(config, spec.config_dir, spec.seed)]
    problems = [problem for config_dir in folders for problem in stage_problems(config, config_dir)]
    if problems:  # before any stage trains: finetune.sh would refuse its file only after stage 1
        raise ValueError("\n".join(problems))
    return steps + ([] if config.task is not None else [table_step(config, marks)]), marks


def stage_problems(config: PipelineConfig, config_dir: str) -> list[str]:
    """Each of an arm's stage files that does not load, or trains the other stage (its script
    would refuse it when that stage starts), with the chain's overrides applied: every arm's at once."""
    found = []
    for stage, overrides in ((1, config.stage1_overrides), (2, config.stage2_overrides)):
        path = Path(config_dir).resolve() / f"stage{stage}.yaml"
        try:
            problem = stage_problem(path, load_config(path, overrides, check_paths=False), stage)
        except ConfigError as error:
            problem = str(error)
        found += [f"{arm_name(config_dir)} stage {stage}: {problem}"] if problem else []
    return found


def run_steps(steps: list[Step], desc: str = "pipeline", reuse_stale: bool = False,
              marks: dict[str, list[str]] | None = None, dry_run: bool = False,
              decisions: dict[str, Decision] | None = None) -> list[tuple[str, str, float]]:
    """Run the steps in order under one progress bar; returns (name, 'done'|'reused'|'would run', seconds).

    Every decision is logged with its reasons; ``marks`` collects, per arm, what the table must
    show next to its row (a stale step kept with ``reuse_stale``, a different code version).
    ``dry_run`` decides and logs every step and runs none (a step after one that would run is
    taken to run too, as it would). ``decisions`` receives each step's final decision by name.
    """
    record, ran_arms = [], set()
    bar = tqdm(steps, desc=desc, unit="step", dynamic_ncols=True,
               bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")
    for step in bar:
        bar.set_postfix_str(step.name)
        start = time.perf_counter()
        if step.arm in ran_arms:  # its inputs are being recomputed: no record can match them yet
            decision = Decision(False, [f"an earlier step of this arm {'would run' if dry_run else 'ran'}"],
                                forced=True)
        else:
            decision = step.decide()
        for difference in decision.kept:  # the process count: each step the same samples, kept or resumed
            tqdm.write(f"[pipeline] {step.name}: {difference} processes, kept: train.global_batch_size is fixed")
        for note in decision.notes:
            tqdm.write(f"[pipeline] {step.name}: recorded with another version ({note}); not rerun for it "
                       "(--code-counts reruns it)")
            if marks is not None and step.arm:
                marks[step.arm].append(f"{step.name.split(': ', 1)[-1]} made by another version: {note}")
        if not decision.reuse and decision.stale and decision.finished and reuse_stale and not decision.forced:
            tqdm.write(f"[pipeline] {step.name}: STALE, reused on purpose (--reuse-stale): {'; '.join(decision.reasons)}")
            if marks is not None and step.arm:
                marks[step.arm].append(f"{step.name.split(': ', 1)[-1]} stale, reused: {'; '.join(decision.reasons)}")
            decision = Decision(True, decision.reasons, decision.notes, stale=True)
        if decisions is not None:
            decisions[step.name] = decision
        if decision.reuse:
            record.append((step.name, "reused", time.perf_counter() - start))
            continue
        if step.arm and (dry_run or decision.reasons != ["not run yet"]):
            tqdm.write(f"[pipeline] {step.name}: {'would run' if dry_run else 'running'} "
                       f"({'; '.join(decision.reasons)})")
        if step.arm:
            ran_arms.add(step.arm)
        if dry_run:
            record.append((step.name, "would run", time.perf_counter() - start))
            continue
        step.decision = decision
        step.run()
        record.append((step.name, "done", time.perf_counter() - start))
    bar.close()
    return record
