"""The ``llava-norm`` command line: one subcommand per stage of the data flow.

Owns argument parsing only; every subcommand calls into the module that does the work.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

from llava_norm.chain_cli import register_chains
from llava_norm.worker import (die_with_launcher, exit_launched_worker, frozen_imports, how_stopped,
                               one_scan_of_transformers_models, quiet_transformers, stop_on_sigterm)


def _config_errors(args, first) -> str:
    """Every key ``args.config`` with ``args.overrides`` refuses, one ``config error:`` line each
    (as `llava-norm check` lists them), not ``first`` alone: a launch fixed one key at a time would
    meet the next only on its next try."""
    from llava_norm.config import each_config_error  # lazy: start-up (config errors only)

    return "\n".join(f"config error: {problem}" for problem in each_config_error(args.config, args.overrides, first))


def _train(args) -> None:
    with frozen_imports():
        # lazy: start-up; a config error is said before torch and transformers load (seconds per process)
        from llava_norm.config import ConfigError, load_config, stage_problem

        try:  # what the config names on this machine is the launch check's (below): every problem at once
            config = load_config(args.config, args.overrides, check_paths=False)
        except ConfigError as error:
            sys.exit(_config_errors(args, error))
        problem = args.stage and stage_problem(args.config, config, args.stage)  # a stage-2 file to pretrain.sh
        if problem:
            script = "scripts/pretrain.sh" if args.stage == 1 else "scripts/finetune.sh"
            sys.exit(f"config error: {problem} ({script} runs stage {args.stage}): use the other script, or give "
                     f"train.stage={args.stage}")

        import torch.distributed as dist

        # lazy: start-up; a subcommand loads only the stages it runs
        from llava_norm.data.dataset import BadSampleError
        from llava_norm.provenance import RELAUNCH_PAST_A_DAMAGED_RECORD, DamagedRecordError
        from llava_norm.train.preflight import preflight
        from llava_norm.train.relaunch import RelaunchError
        from llava_norm.train.run import LaunchCheckError, run_training
        from llava_norm.train.trainer import DivergedError, ResumeError
        from llava_norm.train.universal import UnsafeFileError

    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    stop_on_sigterm()
    try:  # the checks of `llava-norm check`, on this launch's shape (the start-up plan is printed apart)
        run_training(config, check=lambda: preflight(args.config, args.overrides, per_node, max(1, world // per_node),
                                                      plan=False, launch=True))
        if dist.is_available() and dist.is_initialized():  # (a SIGTERM while one waits here is said as below)
            dist.barrier()  # leave together: no rank tears the group down under one still saving
            dist.destroy_process_group()
    except LaunchCheckError as error:  # one line per problem, as `llava-norm check` lists them before a launch
        sys.exit("\n".join(f"launch check: {problem}" for problem in str(error).splitlines()))
    except UnsafeFileError as error:  # a rank's own file (its RNG state, its optimizer partition): it says so
        rank = os.environ.get("RANK", "0")
        sys.exit(f"relaunch refused{'' if rank == '0' else f' (rank {rank})'}: {error}")
    except (RelaunchError, ResumeError) as error:  # every rank meets it alike: one says it
        sys.exit(f"relaunch refused: {error}" if os.environ.get("RANK", "0") == "0" else 1)
    except DamagedRecordError as error:  # a finished run's record, which its relaunch completes (no check first)
        sys.exit(f"relaunch refused: {error}; {RELAUNCH_PAST_A_DAMAGED_RECORD}")
    except DivergedError as error:  # every rank at the same step: one says it
        sys.exit(str(error) if os.environ.get("RANK", "0") == "0" else 1)
    except ConfigError as error:  # what only the backbones' own configs can tell (data.packing's LLM family)
        sys.exit(f"config error: {args.config}: {error}")
    except BadSampleError as error:  # data found unusable before training starts (its file and row named)
        sys.exit(f"data error: {error}")
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: where the run stands, not a traceback per rank
        word, status = how_stopped(stop)
        if os.environ.get("RANK", "0") == "0":
            # on a line of its own: a progress bar may hold the current one
            print("\n" + interrupted(config, word), file=sys.stderr, flush=True)
        sys.exit(status)  # as the shell reports a signal: not a failure of the run


def interrupted(config, word: str = "interrupted") -> str:
    """The line an interrupted training run leaves (starting with ``word``, ``how_stopped``'s): its
    last complete checkpoint and what the same command does next (``train.restart`` and
    ``train.resume`` decide, as train/relaunch.py)."""
    # lazy: only once interrupted
    from llava_norm.layout import CHAIN_LAUNCH
    from llava_norm.train.relaunch import RelaunchError, finished_step, plan_launch
    from llava_norm.train.rundir import SUMMARY, complete_checkpoints

    train = config.train
    out = Path(train.output_dir)
    if out.is_dir() and finished_step(out) is not None:  # stopped after its summary (or extending past it)
        done = f"{word}: the run had finished ({out / SUMMARY})"
        try:  # what the relaunch will do, by its own rules (train.restart, train.resume, train.extend)
            then = plan_launch(config)
        except RelaunchError as error:
            return f"{done}; the same command is refused: {error}"
        if then.action == "fresh":
            return f"{done}; the same command deletes it and trains again (train.restart=true)"
        if then.action == "resume":
            return f"{done}; the same command resumes from {then.checkpoint}"
        return f"{done}; the same command exits at once"
    found = complete_checkpoints(out) if out.is_dir() else []
    if not found:
        return f"{word}: no checkpoint was complete yet; the same command starts the run again"
    where = f"{word}: its last complete checkpoint is {found[-1]}"
    if os.environ.get(CHAIN_LAUNCH):  # the chain's rerun decides (a stale stage it restarted now resumes)
        return f"{where}; the pipeline (or sweep) that launched it resumes from it when run again"
    if train.restart:
        return f"{where}; the same command deletes it and starts over (train.restart=true): drop that to resume"
    if train.resume != "auto":
        return (f"{where}; relaunch with train.resume=auto to resume from it (this command has "
                f"train.resume={train.resume})")
    return f"{where}; relaunch the same command to resume from it"


def _check(args) -> None:
    with frozen_imports():
        # lazy: start-up; a subcommand loads only the stages it runs
        from llava_norm.chain_launch import relative_paths_hint
        from llava_norm.plan import gpu_memory
        from llava_norm.train.preflight import json_report, preflight, print_report

    for name in ("gpus", "nodes"):
        if getattr(args, name) < 1:
            sys.exit(f"check: --{name} must be at least 1")
    try:
        memory = gpu_memory(args.gpu) if args.gpu else args.gpu_memory
    except ValueError as error:
        sys.exit(f"check: {error}")
    report = preflight(args.config, args.overrides, args.gpus, args.nodes, memory, args.gpu)
    if args.json:
        print(json_report(report))
    else:
        print_report(report)
        hint = relative_paths_hint(report.problems, Path.cwd())  # (the shipped configs from elsewhere)
        if hint:
            print(f"note: {hint}")
    if not report.ok:
        sys.exit(1)


def _chat(args) -> None:
    with frozen_imports():
        from llava_norm.chat import chat  # lazy: start-up; the model stages load only for this subcommand

    chat(args)


def _plan(args) -> None:
    import json

    with frozen_imports():
        # lazy: start-up; a subcommand loads only the stages it runs
        from llava_norm.config import ConfigError, load_config
        from llava_norm.plan import format_plan, gpu_memory, make_plan
        from llava_norm.plan.report import plan_dict

    for name in ("gpus", "nodes", "seq_len", "images_per_row"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            sys.exit(f"plan: --{name.replace('_', '-')} must be at least 1")
    if args.gpu_memory is not None and args.gpu_memory <= 0:
        sys.exit("plan: --gpu-memory must be a positive number of GiB")
    try:
        memory = gpu_memory(args.gpu) if args.gpu else args.gpu_memory
        config = load_config(args.config, args.overrides, check_paths=False)  # the data may live elsewhere
    except ConfigError as error:
        sys.exit(_config_errors(args, error))
    except ValueError as error:
        sys.exit(f"plan: {error}")
    try:
        plan = make_plan(config, args.gpus, args.nodes, memory, args.gpu, args.seq_len, args.images_per_row)
    except ConfigError as error:  # what only the backbones' configs or the DeepSpeed file can tell
        sys.exit(f"config error: {args.config}: {error}")
    except ValueError as error:
        sys.exit(f"plan: {error}")
    print(json.dumps(plan_dict(plan), indent=2) if args.json else format_plan(plan, args.config))


def _merge_lora(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.model.builder import merge_lora_dir

    try:
        print(f"merged model in {merge_lora_dir(args.in_dir, args.out_dir, args.dtype)}")
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"merge-lora: {error}")


def _eval(args) -> None:
    with frozen_imports():
        # lazy: start-up; a subcommand loads only the stages it runs
        from llava_norm.evaluation.arguments import eval_config_from_args
        from llava_norm.evaluation.predictions import DamagedFileError, SettingsMismatchError
        from llava_norm.evaluation.runner import BenchmarkDataError, run_evaluation
        from llava_norm.evaluation.table import headline

    try:
        config = eval_config_from_args(args)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"eval: {error}")
    main_rank = os.environ.get("RANK", "0") == "0"
    stop_on_sigterm()
    try:
        summary = run_evaluation(config)
    # every rank meets these alike: one says it
    except (SettingsMismatchError, BenchmarkDataError, DamagedFileError, FileNotFoundError) as error:
        sys.exit(f"eval: {error}" if main_rank else 1)
    except KeyboardInterrupt as stop:  # Ctrl-C: what is kept and how it goes on, not a traceback per rank
        word, status = how_stopped(stop)  # or SIGTERM
        if main_rank:  # on a line of its own: a progress bar may hold the current one
            print(f"\n{word}: the predictions so far are kept in {config.out_dir}; the same command continues "
                  "from them", file=sys.stderr, flush=True)
        sys.exit(status)
    if summary is not None:  # each benchmark's headline, as the results table heads its column
        print(f"results in {config.out_dir}:")
        for name, result in summary["benchmarks"].items():
            print(f"  {headline_line(headline(name), result)}")


def headline_line(mark, result: dict) -> str:
    """A benchmark's headline as ``eval`` prints it, and how many replies its rule could not read
    where the benchmark counts them (POPE, MMBench): a 0.0 whose every reply was unreadable says
    so, not a model that answered wrong."""
    unread = result["metrics"].get("unparsable_replies", 0)
    said = f"; {unread} repl{'y' if unread == 1 else 'ies'} its answer rule could not read" if unread else ""
    return f"{mark.label(result['settings'])}: {mark.value(result['metrics']):.1f} ({mark.metric}, percent{said})"


def _table(args) -> None:
    with frozen_imports():
        # lazy: start-up; a subcommand loads only the stages it runs
        from llava_norm.analysis.ablation import split_name, write_tables
        from llava_norm.evaluation.arguments import benchmark_options, key_values
        from llava_norm.evaluation.table import benchmark_files_now, runs_by_name

    out = args.out  # a folder (there, or named with a trailing /): the tables go inside it
    if out.endswith(("/", os.sep)) or Path(out).is_dir():
        out = str(Path(out) / "table")
    try:
        found = runs_by_name(args.eval_dirs)
        names = {name: run_dir for name, (run_dir, _) in found.items()}
        baseline = args.baseline or next(iter(names))
        arm = split_name(baseline)[0]
        first_run = baseline if baseline in names else next((n for n in names if split_name(n)[0] == arm), baseline)
        data = benchmark_files_now(found, args.data_root, key_values(args.data, "--data"))
        md, csv_path, stats = write_tables(names, out, arm, first_run, options=benchmark_options(args.option),
                                           data=data, paper=args.paper)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"table: {error}")
    print(stats.read_text())
    figure = ", _forest.png" if Path(f"{out}_forest.png").exists() else ""
    print(f"written: {stats} (and its .csv{figure}); per run: {md} and {csv_path}")


def _launch_shape(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A config, its overrides and the launch it is for: what `plan` and `check` share (one GPU
    unless told, as `train` launched alone; the two must not judge a config on different shapes)."""
    p.add_argument("config")
    # default=[]: without one, argparse names a '*' positional among the required ones
    p.add_argument("overrides", nargs="*", default=[], help="dotted overrides, as for train")
    p.add_argument("--gpus", type=int, default=1, help="GPUs (processes) per node (default 1)")
    p.add_argument("--nodes", type=int, default=1)
    memory = p.add_mutually_exclusive_group()
    memory.add_argument("--gpu", help="GPU by name, e.g. h100-80gb (an unknown name lists the known ones)")
    memory.add_argument("--gpu-memory", type=float, help="GPU memory in GiB")
    return p


DESCRIPTION = ("Train, check, plan, evaluate and analyse LLaVA-style models with norm alignment (llava-norm). "
               "Each subcommand takes --help; the README has the whole workflow.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llava-norm", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="show library warnings and info logs")
    # The `deepspeed` launcher passes --local_rank; the rank itself is read from the environment.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="run stage 1 or 2 from a YAML config")
    p.add_argument("--stage", type=int, choices=(1, 2), help="the stage this launch is for (scripts/pretrain.sh and "
                   "finetune.sh give it): a config whose train.stage differs is refused")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", default=[], help="dotted overrides, e.g. optim.lr=2e-5 train.max_steps=10")
    p.set_defaults(func=_train)

    p = _launch_shape(sub.add_parser("check", help="everything that can fail at launch, one line each: config, "
                                                   "environment, world size, DeepSpeed JSON, data, backbones, the "
                                                   "plan's fit"))
    p.add_argument("--json", action="store_true", help="problems and summary as JSON")
    p.set_defaults(func=_check)

    # lazy: start-up; a subcommand loads only the stages it runs (argparse's types are light)
    from llava_norm.evaluation.arguments import positive_int

    p = sub.add_parser("chat", help="ask a trained model about an image, with its run's own prompt settings "
                                    "(greedy, as evaluation; the reply streams)")
    p.add_argument("model_dir", help="a saved model directory (e.g. RUN/model)")
    p.add_argument("question", nargs="?", help="the question (omit with --interactive)")
    p.add_argument("--image", help="an image file the question is about")
    p.add_argument("--interactive", action="store_true",
                   help="then read questions from stdin, one a line, until EOF, 'exit' or 'quit' (blank lines skipped)")
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.set_defaults(func=_chat)

    p = _launch_shape(sub.add_parser("plan", help="memory and compute per GPU of a config before launch (configs "
                                                  "only, no weights)"))
    p.add_argument("--seq-len", type=int, help="tokens per row (default: data.max_length, or pack_max_tokens)")
    p.add_argument("--images-per-row", type=int, help="default 1; packed rows: one per 1.25 x tokens per image")
    p.add_argument("--json", action="store_true", help="the numbers as JSON")
    p.set_defaults(func=_plan)

    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.evaluation.arguments import add_eval_arguments

    p = add_eval_arguments(sub.add_parser(
        "eval", help="evaluate a checkpoint on benchmarks (data-parallel under torchrun, resumable)"))
    p.set_defaults(func=_eval)

    # lazy: start-up; the paper's numbers are plain data, read here for the --paper help text
    from llava_norm.evaluation.paper import describe as paper_source

    p = sub.add_parser("table", help="results table (Markdown + CSV) from eval output directories")
    p.add_argument("eval_dirs", nargs="+")
    p.add_argument("--baseline", help="arm (or run name) the deltas are against (default: the first run's arm)")
    p.add_argument("--out", default="results/table",
                   help="output prefix (default results/table; a folder: FOLDER/table): PREFIX_stats.md/.csv (arms "
                        "over seeds), PREFIX_forest.png, PREFIX.md/.csv (per run)")
    p.add_argument("--option", action="append", default=[], metavar="NAME.KEY=VALUE",
                   help="a benchmark option the runs were evaluated with, as given to llava-norm eval")
    p.add_argument("--data-root", help="where the benchmark files are now, as eval's --data-root, every benchmark "
                                       "tabulated (default: where each result says they were when evaluated)")
    p.add_argument("--data", action="append", default=[], metavar="NAME=PATH", help="one benchmark's files, now")
    p.add_argument("--paper", action="store_true",
                   help="in PREFIX_stats.md/.csv, beside each arm whose backbone and arm the paper reports, the "
                        "paper's published number (labelled as the paper's), ours minus it, and whether it lies "
                        f"inside our 95%% interval ({paper_source()})")
    p.set_defaults(func=_table)

    register_chains(sub)

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


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "chat" and args.question is None and len(extra) == 1 and \
            not extra[0].startswith("-"):  # `chat MODEL --image I "question"`: argparse gave it away
        args.question, extra = extra[0], []
    if extra:  # `plan CONFIG --gpus 8 train.loss=fused`: overrides may follow the options
        if args.command not in ("plan", "check") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides += extra
    return args


def main(argv: list[str] | None = None) -> None:
    die_with_launcher()
    one_scan_of_transformers_models()
    with frozen_imports():  # the subcommands' parsers
        args = _parse(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("llava_norm").setLevel(logging.INFO)
    with contextlib.nullcontext() if args.verbose else quiet_transformers():
        args.func(args)
    exit_launched_worker()  # train and data-parallel eval end on gloo collectives


if __name__ == "__main__":
    main()
