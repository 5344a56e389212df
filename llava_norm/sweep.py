"""``llava-norm sweep``: every arm x every seed of one backbone, in sequence here or as a Slurm array.

Owns expanding a backbone's config directory (``configs/<backbone>/<arm>/stage{1,2}.yaml``), the
requested arms and the seeds into the pipeline's grid (``pipeline.runs``), and writing the Slurm
files for it: an array job with one task per (arm, seed) chain, a table job that runs after
the array however its tasks ended, and ``submit.sh`` that submits both. A task is this same
command with ``--task $SLURM_ARRAY_TASK_ID``, so a requeued, resubmitted or rerun task resumes
or reuses its steps by their provenance records, exactly as a local rerun does.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from llava_norm.config import stage_problem
from llava_norm.config_schema import NORM_ARMS
from llava_norm.chain_launch import REPO, relative_paths_hint
from llava_norm.pipeline import PipelineConfig, runs

# Multi-GPU array tasks may share a node with each other and with other jobs: each takes a port
# from its array job and task ids. A one-GPU task leaves MASTER_PORT unset, so its single
# process picks a free port itself (``train.run``).
BASE_PORT, PORT_RANGE = 20000, 40000


class GridProblems(ValueError):
    """Problems ``llava-norm check`` found in a grid's stage configs; nothing was written."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


DATA_VARIABLES = ("LLAVA_DATA", "EVAL_DATA")


def arm_dirs(backbone: str | Path, arms: str = "all", baseline: str = "none") -> list[str]:
    """The arm config directories of ``backbone``, the baseline first. ``arms``: ``all`` (every
    arm in ``NORM_ARMS`` that has a directory there) or a comma-separated list of directory names."""
    root = Path(backbone)
    if not root.is_dir():
        raise FileNotFoundError(f"backbone config directory not found: {root}")
    if (root / "stage1.yaml").is_file():
        raise ValueError(f"{root} is an arm directory; give the backbone directory above it ({root.parent})")
    names = [a for a in NORM_ARMS if (root / a).is_dir()] if arms == "all" else [a for a in arms.split(",") if a]
    if not names:
        raise FileNotFoundError(f"{root}: no arm directories ({', '.join(NORM_ARMS)})")
    missing = [a for a in names if not (root / a / "stage1.yaml").is_file() or not (root / a / "stage2.yaml").is_file()]
    if missing:
        raise FileNotFoundError(f"{root}: no stage1.yaml + stage2.yaml for arm(s) {missing}")
    if baseline not in names:
        raise ValueError(f"baseline arm {baseline!r} is not among the arms {names}")
    return [str(root / name) for name in [baseline, *[n for n in names if n != baseline]]]


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-2"`` -> ``[0, 1, 2]``: non-negative, at least one."""
    problem = ValueError(f"--seeds {text!r}: expected non-negative seeds as a list like 0,1,2 or a range like 0-2")
    parts = text.split("-")
    if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
        seeds = list(range(int(parts[0]), int(parts[1]) + 1))
    elif all(p.strip().isdigit() for p in text.split(",")):
        seeds = [int(p) for p in text.split(",")]
    else:
        raise problem
    if not seeds:
        raise problem
    return seeds


@dataclass
class SlurmSettings:
    gpus: int = 1  # per task: one node, this many processes (>= 1)
    cpus_per_task: int | None = None  # None: 8 per GPU
    time: str = "24:00:00"
    extra: list[str] = field(default_factory=list)  # more #SBATCH lines, e.g. "--partition=gpu"
    mem: str | None = None  # per task, e.g. "400G"; None: from the plan (``check_grid``)


# A task's host memory: the plan's start-up estimate (every process holds the fp32 model before
# DeepSpeed partitions it) and a quarter more for data workers and buffers, plus each process's
# own: the interpreter with torch, transformers and DeepSpeed loaded peaks at about half a GiB
# with a tiny model on a CPU (README, "Arms x seeds"), so a small model's task was given less than
# its processes hold (a CUDA process maps its libraries on top: --slurm-mem sets it exactly).
MEMORY_MARGIN = 1.25
PROCESS_HOST_GIB = 1.0


def check_grid(config: PipelineConfig, gpus: int) -> tuple[list[str], float | None]:
    """What the grid's launches would meet on one node of ``gpus`` processes (``llava-norm check``
    for every arm's two stage configs; seeds change nothing it reads), each problem prefixed with
    the arm and stage, and the host memory a task needs in GiB (None without a plan)."""
    # lazy: the checks load the configs, the data sources' footers and the plan
    from llava_norm.evaluation.arguments import eval_data_problem
    from llava_norm.train.preflight import preflight

    problems, host, sources, found = [], None, {}, {}  # found: problem -> {arm: [stages]}
    data_problem = eval_data_problem(config.eval_args, config.benchmarks, config.data_root)
    if data_problem:
        problems.append(f"evaluation: {data_problem}")
    for i, arm in enumerate(config.arms):
        for stage in (1, 2):
            # stage 2 starts from the projector its chain's stage 1 writes: checked when stage 2 starts
            overrides = [*config.stage1_overrides] if stage == 1 else [*config.stage2_overrides,
                                                                     "model.pretrained_projector=null"]
            # each chain writes under --runs, not where the YAML's own train.output_dir points
            path = Path(arm) / f"stage{stage}.yaml"
            report = preflight(path, overrides, gpus, plan=i == 0, sources=sources, output_dir=False)
            mismatch = report.config and stage_problem(path, report.config, stage)
            for problem in [*report.problems, *([mismatch] if mismatch else [])]:  # a stage its script refuses
                # the file is said by its arm and stage: the same cause in every arm's file is one problem
                found.setdefault(problem.removeprefix(f"{path}: "), {}).setdefault(Path(arm).name, []).append(stage)
            if report.plan is not None:
                host = max(host or 0.0, report.plan.host_memory_gib())
    return problems + [f"{_where(places, len(config.arms))}: {problem}" for problem, places in found.items()], host


def _where(places: dict[str, list[int]], arms: int) -> str:
    """Where one problem was found, e.g. "none, stage 1", "every arm, stages 1 and 2": a cause the
    configs share (an unset data variable, a backbone not downloaded) is said once."""
    by_stages = {}
    for arm, numbers in places.items():
        by_stages.setdefault(tuple(sorted(set(numbers))), []).append(arm)
    return "; ".join(f"{'every arm' if len(names) == arms > 1 else ', '.join(names)}, "
                     f"{'stages 1 and 2' if numbers == (1, 2) else f'stage {numbers[0]}'}"
                     for numbers, names in by_stages.items())


def launch_dir() -> Path:
    """Where the Slurm jobs run: the checkout this command runs in, which must be the one the
    package is installed from (its scripts and code are what the jobs run)."""
    here = Path.cwd().resolve()
    if (here / "llava_norm" / "__init__.py").is_file() and here != REPO.resolve():
        raise ValueError(f"this command runs in the checkout {here}, but the llava_norm package is installed from "
                         f"{REPO}: install this checkout (pip install -e .) or run the command from {REPO}")
    return here


# Each task is one node: what the submitting shell left (sbatch hands its environment on) of
# another job's rendezvous would send the chain's launches through srun over several nodes, or
# have one node's processes wait for another host.
ONE_NODE = "export NNODES=1 NODE_RANK=0\nunset MASTER_ADDR MASTER_PORT\n"


def write_slurm(config: PipelineConfig, argv: list[str], out_dir: str | Path, slurm: SlurmSettings) -> list[Path]:
    """Write ``sweep.sbatch`` (the array), ``table.sbatch`` and ``submit.sh`` under ``out_dir``.

    ``argv``: the sweep's own arguments with absolute paths and no Slurm or task flags; each
    task runs them with ``--task``, the table job with ``--table-only``."""
    if slurm.gpus < 1:
        raise ValueError(f"--slurm-gpus must be at least 1, got {slurm.gpus}")
    workdir = launch_dir()
    problems, host = check_grid(config, slurm.gpus)
    hint = relative_paths_hint(problems, workdir)
    problems += [hint] if hint else []
    if problems:
        raise GridProblems(problems)
    mem = slurm.mem or (f"{math.ceil(host * MEMORY_MARGIN + slurm.gpus * PROCESS_HOST_GIB)}G" if host else None)
    cpus = slurm.cpus_per_task or 8 * slurm.gpus
    out = Path(out_dir).resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    grid = runs(config)
    listing = "\n".join(f"#   {i}: {spec.name}" for i, spec in enumerate(grid))
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "llava_norm.cli", "sweep", *argv])
    extra = "".join(f"#SBATCH {line}\n" for line in slurm.extra)
    # The data roots the configs and the evaluation read, as they are now, not on the node.
    data_env = "".join(f"export {key}={shlex.quote(os.environ[key])}\n" for key in DATA_VARIABLES if key in os.environ)
    port = (f"export MASTER_PORT=$(({BASE_PORT} + (SLURM_ARRAY_JOB_ID * 97 + SLURM_ARRAY_TASK_ID) % {PORT_RANGE}))\n"
            if slurm.gpus > 1 else "")
    header = "#!/usr/bin/env bash\n# Written by `llava-norm sweep --slurm`; submit with submit.sh.\n"
    array = (
        f"{header}# {len(grid)} tasks, one (arm, seed) chain each:\n{listing}\n"
        f"#SBATCH --job-name=llava-norm-sweep\n#SBATCH --array=0-{len(grid) - 1}\n#SBATCH --nodes=1\n"
        f"#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node={slurm.gpus}\n"
        f"#SBATCH --cpus-per-task={cpus}\n{f'#SBATCH --mem={mem}' + chr(10) if mem else ''}#SBATCH --time={slurm.time}\n"
        f"#SBATCH --requeue\n#SBATCH --output=\"{logs}/task_%a_job_%A.out\"\n{extra}"
        f"set -euo pipefail\ncd {shlex.quote(str(workdir))}\n{data_env}"
        f"export GPUS_PER_NODE={slurm.gpus}\n{ONE_NODE}{port}"
        f'exec {command} --task "$SLURM_ARRAY_TASK_ID"\n'
    )
    table = (
        f"{header}# The statistics table of whatever tasks finished.\n#SBATCH --job-name=llava-norm-table\n"
        f"#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=4\n#SBATCH --time=01:00:00\n"
        f"#SBATCH --output=\"{logs}/table_job_%j.out\"\n{extra}"
        f"set -euo pipefail\ncd {shlex.quote(str(workdir))}\n{data_env}"
        # The tasks' process count: what each run's record is checked against.
        f"export GPUS_PER_NODE={slurm.gpus}\n{ONE_NODE}exec {command} --table-only\n"
    )
    submit = (
        "#!/usr/bin/env bash\n# Submit the sweep's array, then its table once every task has ended.\n"
        'set -euo pipefail\ncd "$(dirname "$0")"\narray=$(sbatch --parsable sweep.sbatch)\n'
        'array=${array%%;*}  # --parsable prints "id" or "id;cluster"\n'
        'echo "array job $array"\nsbatch --dependency=afterany:"$array" table.sbatch\n'
    )
    paths = []
    for name, text in (("sweep.sbatch", array), ("table.sbatch", table), ("submit.sh", submit)):
        path = out / name
        path.write_text(text)
        path.chmod(0o755)
        paths.append(path)
    return paths
