"""The ``llava-norm`` command line: one subcommand per stage of the data flow.

Owns argument parsing only; every subcommand calls into the module that does the work.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def _train(args) -> None:
    import torch.distributed as dist

    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.config import ConfigError, load_config
    from llava_norm.train.relaunch import RelaunchError
    from llava_norm.train.run import run_training
    from llava_norm.train.trainer import ResumeError

    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as error:
        sys.exit(f"config error: {error}")
    try:
        run_training(config)
    except (RelaunchError, ResumeError) as error:
        sys.exit(f"relaunch refused: {error}")
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # leave together: no rank tears the group down under one still saving
        dist.destroy_process_group()


def _die_with_launcher() -> None:
    """Make a launched worker die the moment its launcher does.

    Why: torchrun starts each worker in a session of its own, so when the launcher or its
    process group is killed (preemption, a scheduler's SIGKILL, a test) the workers used to go
    on training and writing checkpoints into a run that was meant to be stopped. Linux's
    parent-death signal ends them with SIGKILL, before they can write anything more.
    """
    if not (os.environ.get("TORCHELASTIC_RUN_ID") or "LOCAL_RANK" in os.environ) or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the launcher died before the line above took effect
        os._exit(1)


def _exit_launched_worker() -> None:
    """End a torchrun worker without interpreter finalisation, once its work is written.

    Why: gloo's worker threads drop the last collectives' tensors a moment after the caller
    has moved on. Freeing a tensor that Python owns takes the GIL; if the interpreter is
    already finalising, that thread is killed inside C++ and the whole process aborts
    ("terminate called without an active exception", SIGABRT), failing the launch after
    every file was saved. It is rare and load-dependent (seen once in CI under ZeRO-3).
    So the atexit handlers run and the streams are flushed while the interpreter is fully
    alive, and the process then leaves with ``os._exit``. Only under torchrun (its agent
    sets TORCHELASTIC_RUN_ID): called in-process, as from the tests, this returns.
    """
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return
    import atexit

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _merge_lora(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.model.builder import merge_lora_dir

    print(f"merged model in {merge_lora_dir(args.in_dir, args.out_dir, args.dtype)}")


def _eval(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.evaluation.arguments import eval_config_from_args
    from llava_norm.evaluation.runner import run_evaluation

    try:
        config = eval_config_from_args(args)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"eval: {error}")
    summary = run_evaluation(config)
    if summary is not None:
        print(f"results in {config.out_dir}: " + ", ".join(summary["benchmarks"]))


def _table(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.evaluation.table import write_table

    try:
        md, csv_path = write_table(args.eval_dirs, args.out, baseline=args.baseline)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"table: {error}")
    print(md.read_text())
    print(f"written: {md} and {csv_path}")


def _pipeline(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.config import ConfigError
    from llava_norm.pipeline import PipelineConfig, plan, run_steps

    config = PipelineConfig(arms=args.arms, runs_dir=args.runs, data_root=args.data_root, benchmarks=args.benchmarks,
                            stage1_overrides=args.stage1, stage2_overrides=args.stage2, eval_args=args.eval_arg,
                            table=args.table, stream=args.stream, code_counts=args.code_counts,
                            reuse_stale=args.reuse_stale)
    try:
        steps, marks = plan(config)
        for name, status, seconds in run_steps(steps, reuse_stale=config.reuse_stale, marks=marks,
                                               dry_run=args.dry_run):
            print(f"{name:40s} {status:9s} {seconds:7.1f} s")
    except (RuntimeError, FileNotFoundError, ValueError, ConfigError) as error:
        sys.exit(f"pipeline: {error}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llava-norm", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="show library warnings and info logs")
    # The `deepspeed` launcher passes --local_rank; the rank itself is read from the environment.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="run stage 1 or 2 from a YAML config")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=2e-5 train.max_steps=10")
    p.set_defaults(func=_train)

    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.evaluation.arguments import DEFAULT_DATA_ROOT, add_eval_arguments

    p = add_eval_arguments(sub.add_parser(
        "eval", help="evaluate a checkpoint on benchmarks (data-parallel under torchrun, resumable)"))
    p.set_defaults(func=_eval)

    p = sub.add_parser("table", help="results table (Markdown + CSV) from eval output directories")
    p.add_argument("eval_dirs", nargs="+")
    p.add_argument("--baseline", help="run name the deltas are against (default: the first)")
    p.add_argument("--out", default="results/table", help="output prefix: writes PREFIX.md and PREFIX.csv")
    p.set_defaults(func=_table)

    p = sub.add_parser("pipeline", help="stage 1 -> stage 2 -> eval -> table for arm config dirs (reuses a step only if its provenance matches)")
    p.add_argument("arms", nargs="+", help="config dirs with stage1.yaml + stage2.yaml; the first is the baseline")
    p.add_argument("--runs", default="runs/pipeline", help="runs go to RUNS/<arm>/{stage1,stage2,eval}")
    p.add_argument("--data-root", default=os.environ.get("EVAL_DATA", DEFAULT_DATA_ROOT), help="benchmark data root")
    p.add_argument("--benchmarks", default="all")
    p.add_argument("--stage1", action="append", default=[], metavar="KEY=VALUE", help="override for every stage 1")
    p.add_argument("--stage2", action="append", default=[], metavar="KEY=VALUE", help="override for every stage 2")
    p.add_argument("--eval-arg", action="append", default=[], help="extra argument for llava-norm eval")
    p.add_argument("--table", help="results prefix (default RUNS/results): writes .md and .csv")
    p.add_argument("--stream", action="store_true", help="show training/eval output instead of logging to files")
    p.add_argument("--code-counts", action="store_true",
                   help="rerun steps recorded with another code version or library versions (default: note them)")
    p.add_argument("--reuse-stale", action="store_true",
                   help="keep finished steps whose record no longer matches; the table marks their rows")
    p.add_argument("--dry-run", action="store_true", help="say which steps would run and why; run none")
    p.set_defaults(func=_pipeline)

    p = sub.add_parser("merge-lora", help="fold a LoRA run's adapter into a plain model dir (safetensors)")
    p.add_argument("in_dir", help="a LoRA run's model/ dir (or its output_dir)")
    p.add_argument("out_dir")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype to merge in and save (default float32)")
    p.set_defaults(func=_merge_lora)

    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.analysis.cli import register as register_analyses

    register_analyses(sub.add_parser("analyze", help="the paper's diagnostics: a JSON and a PNG each, and a report"))
    _register_plugins(sub)
    return parser


# Installed packages add subcommands through this entry-point group (the demo's guest wing
# adds make-tiny, synth, warmup and demo): the core names no plugin.
COMMANDS_GROUP = "llava_norm.commands"


def _register_plugins(sub) -> None:
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        entry.load()(sub)


def main(argv: list[str] | None = None) -> None:
    _die_with_launcher()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    logging.getLogger("llava_norm").setLevel(logging.INFO)
    args.func(args)
    _exit_launched_worker()  # train and data-parallel eval end on gloo collectives


if __name__ == "__main__":
    main()
