"""What an evaluation of a checkpoint would record as its settings, without loading any model.

Owns the evaluation's request (``EvalConfig``, one ``BenchmarkRequest`` per benchmark), the
resolution of benchmark names to data paths, and the settings each ``<benchmark>.json``
records: everything that can change a prediction. The runner evaluates with them; the
pipeline compares them with a stored result to decide whether it can be reused, in a process
that never loads the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from llava_norm.config_schema import resolve_dtype
from llava_norm.data.prompts import PromptSettings, run_config
from llava_norm.evaluation.benchmarks import BENCHMARKS, get_benchmark
from llava_norm.evaluation.predictions import differing_keys
from llava_norm.provenance import fingerprint, flatten


@dataclass
class BenchmarkRequest:
    name: str
    path: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalConfig:
    checkpoint: str
    out_dir: str
    benchmarks: list[BenchmarkRequest]
    run_name: str
    prompt: PromptSettings
    batch_size: int = 8
    limit: int | None = None
    dtype: str = "auto"  # auto: bf16 on GPU, fp32 on CPU
    # Caps each task's max_new_tokens (smoke runs of untrained models); None keeps the
    # community budgets. Recorded in the settings, so capped results never pass as real ones.
    max_new_tokens_cap: int | None = None
    overwrite: bool = False
    # Predictions on disk made under other settings (another checkpoint, data file, prompt):
    # refused by default, so nothing is lost by accident; replaced when set (the pipeline sets it).
    replace_stale: bool = False
    trust_remote_code: bool = False

    @cached_property
    def checkpoint_fingerprint(self) -> str:
        """Read once per evaluation, not once per benchmark (a 7B checkpoint is many files)."""
        return checkpoint_fingerprint(self.checkpoint)


def resolve_benchmarks(names: list[str], data_root: str | None, paths: dict[str, str],
                       options: dict[str, dict[str, Any]]) -> list[BenchmarkRequest]:
    """Benchmark names (or ``all``) -> requests with a data path and options each: ``paths``
    where given, else ``data_root`` / the benchmark's declared ``data_dir``."""
    if names in (["all"], []):
        names = list(BENCHMARKS)
    unknown = list(dict.fromkeys(n for n in [*names, *paths, *options] if n not in BENCHMARKS))
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; valid names: {', '.join(BENCHMARKS)}")
    unused = [n for n in [*paths, *options] if n not in names]
    if unused:  # a setting for a benchmark this run does not evaluate would be dropped without a word
        raise ValueError(f"--data or --option for {unused[0]}, which is not among the benchmarks evaluated "
                         f"({', '.join(names)})")
    requests = []
    for name in names:
        if name in paths:
            path = paths[name]
        elif data_root:
            path = str(Path(data_root) / BENCHMARKS[name].declaration.data_dir)
        else:
            raise ValueError(f"{name}: no data path; pass --data-root DIR or set EVAL_DATA=DIR (expects "
                             f"DIR/{BENCHMARKS[name].declaration.data_dir}), or pass --data {name}=PATH")
        if not Path(path).exists():
            root = "" if name in paths else \
                f"; the data root is {data_root}: --data-root DIR or EVAL_DATA=DIR names another"
            raise FileNotFoundError(f"{name}: data path does not exist: {path}{root} (see eval/README.md for where to "
                                    "get it)")
        get_benchmark(name, **options.get(name, {}))  # fail on a bad option before loading any model
        requests.append(BenchmarkRequest(name, path, dict(options.get(name, {}))))
    return requests


def default_run_name(checkpoint: str | Path) -> str:
    """The training run's ``train.run_name``, else its arm (``model.norm_alignment``), else the
    directory name: the table's rows are named after what differs between runs."""
    tree = run_config(checkpoint)
    if tree is not None:
        name = OmegaConf.select(tree, "train.run_name") or OmegaConf.select(tree, "model.norm_alignment")
        if name:
            return str(name)
    return Path(checkpoint).resolve().name


def checkpoint_fingerprint(checkpoint: str | Path) -> str:
    """The checkpoint folder's content fingerprint (``llava_norm.provenance``): retraining into
    the same directory changes it, copying the folder elsewhere does not."""
    return fingerprint(checkpoint)


def settings_differences(recorded: dict, expected: dict) -> list[str]:
    """The settings keys (dotted) whose values differ, locations aside."""
    return differing_keys(flatten(recorded), flatten(expected))


def benchmark_settings(config: EvalConfig, request: BenchmarkRequest) -> dict[str, Any]:
    """What ``<benchmark>.json`` will record as its settings if evaluated now."""
    return settings_for(config, request, get_benchmark(request.name, **request.options))


def batch_items(config: EvalConfig, bench) -> int:
    """Items per batch: a log-likelihood item is several continuations, each a row of the batch."""
    return config.batch_size if bench.kind == "generate" else max(1, config.batch_size // 4)


def settings_for(config: EvalConfig, request: BenchmarkRequest, bench) -> dict[str, Any]:
    """Everything that can change a prediction: the batch too (a padded row's logits move in the
    last bits, a bf16 one's enough to change a near-tie greedy token); the process count cannot
    (the runner's batches are fixed over the file)."""
    return {
        "checkpoint": str(Path(config.checkpoint).resolve()),
        "checkpoint_fingerprint": config.checkpoint_fingerprint,
        "data_path": str(Path(request.path).resolve()),
        "data_fingerprint": fingerprint(request.path),
        "limit": config.limit,
        "benchmark": bench.settings(),
        "prompt": asdict(config.prompt),
        # resolved: "auto" is fp32 on a CPU and bf16 on a GPU, and those are different results
        "dtype": resolve_dtype(config.dtype, torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "decoding": "greedy",
        "batch_items": batch_items(config, bench),
        "max_new_tokens_cap": config.max_new_tokens_cap,
    }
