"""The arguments of ``llava-norm eval`` and the ``EvalConfig`` they resolve to.

Owns one translation from command-line words to an evaluation, shared by the ``eval``
subcommand and by ``scripts/pipeline.sh``, which must know what an evaluation launched with
the same words would record before deciding to reuse one.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

from llava_norm.config_schema import PROMPT_FORMATS, is_hub_id
from llava_norm.layout import MODEL_DIR
from llava_norm.saved_model import check_saved_model


DEFAULT_DATA_ROOT = "data/eval"  # where scripts/eval.sh and the pipeline look without EVAL_DATA / --data-root


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse names the option when it is not)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def add_eval_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("checkpoint", help="a saved model directory (e.g. runs/x/stage2/model)")
    p.add_argument("--benchmarks", default="all", help="comma-separated names, or 'all'")
    p.add_argument("--data-root", default=os.environ.get("EVAL_DATA") or None,
                   help="directory holding one sub-directory per benchmark (see eval/README.md; default: $EVAL_DATA)")
    p.add_argument("--data", action="append", default=[], metavar="NAME=PATH", help="data path of one benchmark")
    p.add_argument("--option", action="append", default=[], metavar="NAME.KEY=VALUE",
                   help="benchmark option, e.g. mmlu.num_fewshot=5, ai2d.variant=no_mask, pope.split=adversarial")
    p.add_argument("--out", help="output directory (default: RUN/eval for a run's RUN/model, else eval-NAME "
                                 "beside the folder NAME)")
    p.add_argument("--name", help="run name in the results table (default: the training run's train.run_name, "
                                  "else its arm, model.norm_alignment, else the checkpoint folder's name)")
    p.add_argument("--batch-size", type=positive_int, default=8,
                   help="items per batch (default: 8; a quarter of it for log-likelihood benchmarks); recorded, and "
                        "predictions made with another are not kept")
    p.add_argument("--limit", type=int, default=None, help="first N items per benchmark (smoke runs)")
    p.add_argument("--max-new-tokens-cap", type=positive_int, default=None,
                   help="cap every task's max_new_tokens (smoke runs; recorded in the results)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--prompt-format", choices=PROMPT_FORMATS, help="default: the training config's")
    p.add_argument("--system-prompt", default=None, help="default: the training config's ('' for none)")
    p.add_argument("--overwrite", action="store_true", help="recompute instead of resuming")
    p.add_argument("--replace-stale", action="store_true",
                   help="recompute a benchmark whose stored predictions were made under other settings "
                        "(default: refuse, naming the settings that differ)")
    p.add_argument("--trust-remote-code", action="store_true")
    return p


def key_values(pairs: list[str], flag: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {pair!r}: expected KEY=VALUE")
        out[key] = value
    return out


def benchmark_options(pairs: list[str]) -> dict[str, dict]:
    """``--option`` values (``BENCHMARK.OPTION=VALUE``) -> ``{benchmark: {option: value}}``."""
    options: dict[str, dict] = {}
    for key, value in key_values(pairs, "--option").items():
        bench, sep, name = key.partition(".")
        if not sep:
            raise ValueError(f"--option {key}={value}: expected BENCHMARK.OPTION=VALUE, e.g. mmlu.num_fewshot=5")
        options.setdefault(bench, {})[name] = yaml.safe_load(value)
    return options


def default_out_dir(checkpoint: str) -> Path:
    """Where an evaluation writes without ``--out``: beside the run's saved model (RUN/model ->
    RUN/eval), else ``eval-NAME`` beside any other folder NAME (a hub model's in the working
    directory), so that a merged model's results never land in another model's folder or in this
    checkout's eval/, and no ``checkpoint-*`` folder a restart clears holds them."""
    folder = Path(checkpoint).expanduser()
    if not folder.exists() and is_hub_id(checkpoint):
        return Path.cwd() / f"eval-{folder.name}"
    folder = folder.resolve()
    return folder.parent / ("eval" if folder.name == MODEL_DIR else f"eval-{folder.name}")


def eval_config_from_args(args: argparse.Namespace):
    """The ``EvalConfig``; raises ValueError / FileNotFoundError naming the bad argument or missing data."""
    # lazy: the settings load torch; building the parser must not
    from llava_norm.data.prompts import training_prompt_settings
    from llava_norm.evaluation.benchmarks.base import check_limit
    from llava_norm.evaluation.settings import EvalConfig, default_run_name, resolve_benchmarks

    check_limit(args.limit)  # before any model loads
    check_saved_model(args.checkpoint)
    if args.out and Path(args.out).expanduser().exists() and not Path(args.out).expanduser().is_dir():
        raise ValueError(f"--out {args.out}: a file, not a folder for the results")
    options = benchmark_options(args.option)
    requests = resolve_benchmarks(args.benchmarks.split(","), args.data_root, key_values(args.data, "--data"), options)
    prompt = training_prompt_settings(args.checkpoint)
    if args.prompt_format:
        prompt.prompt_format = args.prompt_format
    if args.system_prompt is not None:
        prompt.system_prompt = args.system_prompt or None
    return EvalConfig(
        checkpoint=args.checkpoint, out_dir=args.out or str(default_out_dir(args.checkpoint)),
        benchmarks=requests, run_name=args.name or default_run_name(args.checkpoint), prompt=prompt,
        batch_size=args.batch_size, limit=args.limit, dtype=args.dtype, max_new_tokens_cap=args.max_new_tokens_cap,
        overwrite=args.overwrite, replace_stale=args.replace_stale, trust_remote_code=args.trust_remote_code)


class _Refusing(argparse.ArgumentParser):
    def error(self, message):  # argparse's own would print the usage and exit
        raise ValueError(message)


def check_eval_words(words: list[str]) -> None:
    """The words a pipeline or sweep adds to each ``llava-norm eval`` (``--eval-arg``), checked
    before anything trains: what argparse refuses (an unknown or misspelt flag, a value of the
    wrong type) and the values eval checks before loading a model. Raises ValueError."""
    from llava_norm.evaluation.benchmarks.base import check_limit  # lazy: the benchmarks load torch

    args = add_eval_arguments(_Refusing(prog="llava-norm eval")).parse_args(["MODEL", *words])
    check_limit(args.limit)
    benchmark_options(args.option)


def absolute_data_words(words: list[str], base: str | Path = ".") -> list[str]:
    """``words`` with the paths of ``--data-root DIR`` and ``--data NAME=PATH`` (either spelling)
    made absolute from ``base`` (here): a chain's evaluations run in the checkout, not where it was started."""
    def absolute(flag: str, value: str) -> str:
        if flag == "--data-root":
            return str((Path(base) / Path(value).expanduser()).resolve())
        bench, eq, path = value.partition("=")
        return f"{bench}={(Path(base) / Path(path).expanduser()).resolve()}" if eq else value

    out, pending = [], None
    for word in words:
        flag, eq, value = word.partition("=")
        if pending:
            out.append(absolute(pending, word))
            pending = None
        elif flag in ("--data-root", "--data") and eq:
            out.append(f"{flag}={absolute(flag, value)}")
        else:
            pending = word if word in ("--data-root", "--data") else None
            out.append(word)
    return out


def eval_data_problem(words: list[str], benchmarks: str, data_root: str) -> str | None:
    """Where a chain's evaluations (``llava-norm eval MODEL --benchmarks B --data-root R`` and the
    ``--eval-arg`` words, which win as they come last) would find no benchmark data: said before
    anything trains, not after both stages. None when every benchmark's data path exists (what is
    in it is read when the evaluation loads it)."""
    from llava_norm.evaluation.settings import resolve_benchmarks  # lazy: the settings load torch

    args = add_eval_arguments(_Refusing(prog="llava-norm eval")).parse_args(
        ["MODEL", "--benchmarks", benchmarks, "--data-root", data_root, *words])
    try:
        resolve_benchmarks(args.benchmarks.split(","), args.data_root, key_values(args.data, "--data"),
                           benchmark_options(args.option))
    except (ValueError, FileNotFoundError) as error:
        return str(error)
    return None


def parse_eval_args(argv: list[str]):
    return eval_config_from_args(add_eval_arguments(argparse.ArgumentParser(prog="llava-norm eval")).parse_args(argv))
