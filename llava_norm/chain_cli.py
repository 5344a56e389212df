"""The ``pipeline`` and ``sweep`` subcommands: their arguments, and the checks they make before a
chain of launches starts (evaluation words, seed overrides, the grid).

Owns the chains' command-line side; ``llava_norm.pipeline`` and ``llava_norm.sweep`` do the work.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from llava_norm.worker import frozen_imports, how_stopped, stop_on_sigterm


PIPELINE_RUNS = "runs/pipeline"  # the pipeline's default --runs, in the checkout


def register_chains(sub) -> None:
    """Add ``pipeline`` and ``sweep`` to the command line's subparsers."""
    p = sub.add_parser("pipeline", help="stage 1 -> stage 2 -> eval -> table for arm config dirs (reuses a step only if its provenance matches)")
    p.add_argument("arms", nargs="+", help="config dirs with stage1.yaml + stage2.yaml; the first is the baseline")
    _add_chain_arguments(p, PIPELINE_RUNS)
    p.set_defaults(func=_pipeline)

    p = sub.add_parser("sweep", help="arms x seeds of one backbone through the pipeline, here or as a Slurm array; "
                                     "the table carries intervals over seeds")
    p.add_argument("backbone", help="a directory of arm config dirs, e.g. configs/llama3.2-3b")
    p.add_argument("--arms", default="all", help="all (every arm with a directory there) or a,b,c")
    p.add_argument("--baseline", default="none", help="the arm the deltas are against (default none)")
    p.add_argument("--seeds", default="0,1,2", help="training seeds: 0,1,2 or 0-2 (default 0,1,2)")
    _add_chain_arguments(p, "runs/sweep")
    p.add_argument("--task", type=int, help="run only chain N of the grid (arm-major), no table: one array task")
    p.add_argument("--table-only", action="store_true", help="tabulate the finished evaluations; run nothing")
    p.add_argument("--slurm", metavar="DIR", help="write DIR/sweep.sbatch (an array, one task per chain), "
                                                  "DIR/table.sbatch and DIR/submit.sh instead of running")
    p.add_argument("--slurm-gpus", type=int, default=1, help="GPUs (processes) per array task (default 1)")
    p.add_argument("--slurm-cpus-per-task", type=int, help="CPUs per array task (default 8 per GPU)")
    p.add_argument("--slurm-mem", help="host memory per array task, e.g. 400G (default: the plan's start-up "
                                       "estimate for the task's processes, plus a quarter, plus 1 GiB per process)")
    p.add_argument("--slurm-time", default="24:00:00", help="time limit per array task (default 24:00:00)")
    p.add_argument("--slurm-arg", action="append", default=[], metavar="FLAG",
                   help="extra #SBATCH line, e.g. --slurm-arg=--partition=gpu")
    p.set_defaults(func=_sweep)


def _chain_config(args, arms: list[str], **grid):
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.evaluation.arguments import absolute_data_words, check_eval_words, eval_data_problem
    from llava_norm.pipeline import PipelineConfig

    try:  # before anything trains: a misspelt flag would otherwise stop each chain at its evaluation
        check_eval_words(args.eval_arg)
    except ValueError as error:
        sys.exit(f"{args.command}: --eval-arg: {error}")
    # the benchmark data too (--slurm lists it among the grid's problems; a table reads results only)
    if not (getattr(args, "slurm", None) or grid.get("table_only")):
        problem = eval_data_problem(args.eval_arg, args.benchmarks, args.data_root)
        if problem:
            sys.exit(f"{args.command}: evaluation: {problem}")

    return PipelineConfig(arms=arms, runs_dir=args.runs, data_root=args.data_root, benchmarks=args.benchmarks,
                          stage1_overrides=args.stage1, stage2_overrides=args.stage2,
                          eval_args=absolute_data_words(args.eval_arg),
                          table=args.table, stream=args.stream, code_counts=args.code_counts,
                          reuse_stale=args.reuse_stale, **grid)


def _run_chain(config, command: str, dry_run: bool) -> None:
    with frozen_imports():
        # lazy: start-up; a subcommand loads only the stages it runs
        from llava_norm.config import ConfigError
        from llava_norm.pipeline import plan, run_steps

    stop_on_sigterm()
    try:
        steps, marks = plan(config)
        for name, status, seconds in run_steps(steps, reuse_stale=config.reuse_stale, marks=marks, dry_run=dry_run):
            print(f"{name:40s} {status:9s} {seconds:7.1f} s")
    except (RuntimeError, OSError, ValueError, ConfigError) as error:  # OSError: a file where a folder goes, say
        sys.exit(f"{command}: {error}")
    except KeyboardInterrupt as stop:  # Ctrl-C reaches the launched step too, which says where it stands
        word, status = how_stopped(stop)  # or SIGTERM (a scancel reaches every process of the job)
        print(f"\n{command}: {word}; finished steps are kept, and the same command goes on from them",
              file=sys.stderr, flush=True)
        sys.exit(status)


# Set by scripts/pipeline.sh: where the user typed the command, which runs in the checkout (the
# configs' own relative paths are the checkout's)
CALLED_FROM = "LLAVA_NORM_CALLED_FROM"


def _paths_from_caller(args) -> None:
    """The paths the user typed (arm directories, --runs, --data-root or EVAL_DATA, --table, the
    evaluation's --data-root and --data), read from where they typed them; the built-in defaults
    (``_defaults``) stay the checkout's."""
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.evaluation.arguments import absolute_data_words

    base = os.environ.pop(CALLED_FROM, None)
    if not base:
        return

    def typed(path: str) -> str:
        return path if Path(path).expanduser().is_absolute() else str(Path(base) / path)

    args.arms = [typed(arm) for arm in args.arms]
    if args.data_root is None and os.environ.get("EVAL_DATA"):  # set in the shell the command was typed in
        args.data_root = os.environ["EVAL_DATA"]
    for key in ("runs", "data_root", "table"):
        if getattr(args, key) is not None:  # typed: a value that equals a default is read from there too
            setattr(args, key, typed(getattr(args, key)))
    args.eval_arg = absolute_data_words(args.eval_arg, base)


def _defaults(args) -> None:
    """What was not typed: --runs the subcommand's own folder, --data-root EVAL_DATA, else data/eval."""
    from llava_norm.evaluation.arguments import DEFAULT_DATA_ROOT  # lazy: start-up

    if args.runs is None:
        args.runs = args.default_runs
    if args.data_root is None:
        args.data_root = os.environ.get("EVAL_DATA") or DEFAULT_DATA_ROOT


def _pipeline(args) -> None:
    _paths_from_caller(args)
    _defaults(args)
    _run_chain(_chain_config(args, args.arms), "pipeline", args.dry_run)


def _sweep_argv(args, arms: list[str]) -> list[str]:
    """The sweep's own words with absolute paths, for the Slurm tasks to repeat; ``arms`` (the grid's
    arm directories) named one by one: an arm directory added later must not shift the tasks' chains."""
    def absolute(path: str) -> str:
        return str(Path(path).resolve())

    argv = [absolute(args.backbone), "--arms", ",".join(Path(arm).name for arm in arms), "--baseline", args.baseline,
            "--seeds", args.seeds,
            "--runs", absolute(args.runs), "--data-root", absolute(args.data_root), "--benchmarks", args.benchmarks]
    argv += [f"--stage1={o}" for o in args.stage1] + [f"--stage2={o}" for o in args.stage2]
    argv += [f"--eval-arg={a}" for a in args.eval_arg]
    argv += ["--table", absolute(args.table)] if args.table else []
    return argv + [flag for flag, on in (("--code-counts", args.code_counts), ("--reuse-stale", args.reuse_stale))
                   if on]


def _sweep(args) -> None:
    _defaults(args)
    with frozen_imports():
        # lazy: start-up; a subcommand loads only the stages it runs
        from llava_norm.sweep import GridProblems, SlurmSettings, arm_dirs, parse_seeds, write_slurm

    try:
        seeded = [o for o in [*args.stage1, *args.stage2] if o.split("=", 1)[0].strip() == "train.seed"]
        if seeded:  # each run's seed is the sweep's, given last: this one would be dropped without a word
            raise ValueError(f"{seeded[0]}: the sweep sets train.seed from --seeds; give --seeds instead")
        config = _chain_config(args, arm_dirs(args.backbone, args.arms, args.baseline), seeds=parse_seeds(args.seeds),
                               task=args.task, table_only=args.table_only)
        if args.slurm:
            if args.task is not None or args.table_only:
                raise ValueError("--slurm writes the whole grid's files; --task and --table-only are what they run")
            settings = SlurmSettings(args.slurm_gpus, args.slurm_cpus_per_task, args.slurm_time, args.slurm_arg,
                                     args.slurm_mem)
            for path in write_slurm(config, _sweep_argv(args, config.arms), args.slurm, settings):
                print(f"written: {path}")
            return
    except GridProblems as error:
        for problem in error.problems:
            print(f"problem: {problem}")
        sys.exit(f"sweep: {len(error.problems)} problem(s) a launch would meet (llava-norm check); nothing written")
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"sweep: {error}")
    _run_chain(config, "sweep", args.dry_run)


def _add_chain_arguments(p: argparse.ArgumentParser, runs: str) -> None:
    """What the pipeline and the sweep share: where runs go, the overrides, evaluation, reuse.
    --runs and --data-root have no argparse default: a path typed equal to a default is still a
    typed path (``_paths_from_caller``); ``_defaults`` fills them."""
    p.add_argument("--runs", help=f"runs go to RUNS/<arm>[/seed<k>]/{{stage1,stage2,eval}} (default {runs})")
    p.add_argument("--data-root", help="benchmark data root (default: EVAL_DATA, else data/eval)")
    p.set_defaults(default_runs=runs)
    p.add_argument("--benchmarks", default="all")
    p.add_argument("--stage1", action="append", default=[], metavar="KEY=VALUE", help="override for every stage 1")
    p.add_argument("--stage2", action="append", default=[], metavar="KEY=VALUE", help="override for every stage 2")
    p.add_argument("--eval-arg", action="append", default=[], help="extra argument for llava-norm eval")
    p.add_argument("--table", help="results prefix (default RUNS/results): writes .md, .csv, _stats.md/.csv, "
                                   "_forest.png")
    p.add_argument("--stream", action="store_true", help="show training/eval output instead of logging to files")
    p.add_argument("--code-counts", action="store_true",
                   help="rerun steps recorded with another code version or library versions (default: note them)")
    p.add_argument("--reuse-stale", action="store_true",
                   help="keep finished steps whose record no longer matches; the table marks their rows")
    p.add_argument("--dry-run", action="store_true", help="say which steps would run and why; run none")
