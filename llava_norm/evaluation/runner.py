"""``llava-norm eval``: one checkpoint on a list of benchmarks, data-parallel and resumable.

Owns the evaluation run: which prompt settings apply (read from the training run's
``config.yaml`` beside the checkpoint unless given), how items are split over ranks (fixed
batches of the file's items, those not yet all predicted, round-robin, identical on every
rank), when predictions hit disk (per batch, via ``PredictionStore``), and the outputs of rank 0:

- ``<out>/<benchmark>.json``: metrics plus the exact settings (checkpoint, data, prompt
  variant, shots, split, decoding);
- ``<out>/summary.json``: the run name and every benchmark's result, what ``table`` reads.

A benchmark whose JSON already exists with the same settings is not recomputed; one with
predictions on disk continues from them, so a killed evaluation loses at most one batch.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm import tqdm

from llava_norm.config_schema import resolve_dtype
from llava_norm.evaluation.benchmarks import get_benchmark
from llava_norm.evaluation.distributed import Ranks
from llava_norm.evaluation.predictions import DamagedFileError, PredictionStore, SettingsMismatchError, read_json_output
from llava_norm.evaluation.settings import (BenchmarkRequest, EvalConfig, batch_items, settings_differences,
                                            settings_for)
from llava_norm.evaluation.table import EVAL_SUMMARY, read_results
from llava_norm.files import write_atomically
from llava_norm.inference import Predictor, Prompt
from llava_norm.model.builder import load_bundle
from llava_norm.provenance import environment, now


def _predict_batch(predictor, bench_kind: str, batch: list, cap: int | None) -> list[dict]:
    if bench_kind == "generate":
        prompts = [Prompt(i.prompt, i.image) for i in batch]  # the run's system prompt comes from predictor.settings
        budgets = [i.max_new_tokens if cap is None else min(cap, i.max_new_tokens) for i in batch]
        replies = predictor.generate_budgeted(prompts, budgets)
        return [{"item_id": i.item_id, "prediction": r} for i, r in zip(batch, replies)]
    pairs = [(item.context, c) for item in batch for c in item.continuations]
    scores = predictor.loglikelihood(pairs, batch_size=len(pairs))
    records, at = [], 0
    for item in batch:
        records.append({"item_id": item.item_id, "prediction": scores[at:at + len(item.continuations)]})
        at += len(item.continuations)
    return records


def rank_batches(items: list, done, step: int, rank: int, world_size: int) -> list[list]:
    """The batches ``rank`` predicts: the file's items in fixed batches of ``step``, those with an
    item not in ``done``, round-robin over the ranks. Fixed whatever the process count and
    wherever a kill fell, because padding moves a row's logits (a bf16 one's enough to change a
    near-tie greedy token): each prediction is made in the batch a run never stopped gives it. A
    batch a kill cut short is recomputed whole; only its missing records are appended."""
    batches = [items[start:start + step] for start in range(0, len(items), step)]
    pending = [batch for batch in batches if any(item.item_id not in done for item in batch)]
    return pending[rank::world_size]


class BenchmarkDataError(ValueError):
    """A benchmark's files cannot be read as that benchmark: the message names the benchmark and the
    file (and row, where the loader knows it)."""


def _evaluate_one(config: EvalConfig, request: BenchmarkRequest, predictor, ranks: Ranks) -> dict | None:
    bench = get_benchmark(request.name, **request.options)
    out = Path(config.out_dir)
    result_path = out / f"{request.name}.json"
    settings = settings_for(config, request, bench)
    if result_path.exists() and not config.overwrite:
        previous = read_json_output(result_path)
        if not settings_differences(previous.get("settings", {}), settings):
            return previous
    try:
        items = bench.load(request.path, config.limit)
    except (ValueError, OSError) as error:  # pyarrow's ArrowInvalid is a ValueError
        where = "" if str(request.path) in str(error) else f"{request.path}: "
        raise BenchmarkDataError(f"{request.name}: {where}{error}") from error
    if not items:  # a score over no items would read as 0%
        raise BenchmarkDataError(f"{request.name}: {request.path} holds no items: nothing to score")
    ids = [item.item_id for item in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{request.name}: {request.path} has duplicate item ids; predictions could not be matched")

    store = PredictionStore(out, request.name)
    if config.overwrite:
        if ranks.is_main:
            store.clear()
    else:
        try:
            store.verify_settings(settings)
        except SettingsMismatchError as error:
            if not config.replace_stale:
                raise
            if ranks.is_main:
                print(f"[llava-norm] {request.name}: recomputing; {error.differing}")
                store.clear()
    ranks.barrier()
    if ranks.is_main:
        store.write_settings(settings)
    store.repair(ranks.rank)
    ranks.barrier()  # every torn line is cut before anyone reads: all ranks see the same done set
    done = store.read_all().predictions
    ranks.barrier()
    mine = rank_batches(items, done, batch_items(config, bench), ranks.rank, ranks.world_size)
    kept = sum(1 for item in items if item.item_id in done)
    todo = len(items) - kept
    if kept and todo and ranks.is_main:  # said in the log, not only on a progress bar the log may not keep
        tqdm.write(f"[llava-norm] {request.name}: {kept} of {len(items)} items predicted before are kept; "
                   f"predicting the other {todo}")
    bar = tqdm(total=len(items), desc=request.name, unit="item", initial=kept, disable=not ranks.is_main,
               dynamic_ncols=True)
    bar.set_postfix_str(f"{kept} resumed" if kept else "")
    for batch in mine:
        records = _predict_batch(predictor, bench.kind, batch, config.max_new_tokens_cap)
        new = [record for record in records if record["item_id"] not in done]
        store.append(ranks.rank, new)
        bar.update(min(len(new) * ranks.world_size, len(items) - bar.n))
    bar.close()
    ranks.barrier()
    if not ranks.is_main:
        return None
    merged = store.read_all()
    metrics = bench.score(items, merged.predictions)
    result = {
        "benchmark": request.name, "run_name": config.run_name, "metrics": metrics, "settings": settings,
        "num_items": len(items), "duplicate_records_ignored": merged.duplicates,
        "predictions": [str(p) for p in store.files()],
        "finished": now(), "environment": environment(),
    }
    write_atomically(result_path, json.dumps(result, indent=2))
    return result


def _refuse_another_models_results(config: EvalConfig) -> None:
    """Results in --out, of benchmarks this evaluation does not compute, that another model gave
    (by content: a moved copy of this model is this model): the folder's summary would list them
    as this model's. A requested benchmark's own settings check guards that benchmark."""
    asked = {request.name for request in config.benchmarks}
    # Under --overwrite the asked ones' files go unread: a cut one is recomputed, not stopped at.
    try:
        found = read_results(config.out_dir, unread=asked if config.overwrite else ())
    except DamagedFileError as error:
        if error.path.stem in asked:  # its own message's ways on hold
            raise
        raise DamagedFileError(f"{error.path}: not a whole JSON file, the result of a benchmark not asked for here: "
                               "delete it, or ask for that benchmark with --overwrite", error.path) from None
    kept = {name: result["settings"] for name, result in found.items() if name not in asked}
    others = {name: settings.get("checkpoint") for name, settings in kept.items()
              if settings.get("checkpoint_fingerprint") not in (None, config.checkpoint_fingerprint)}
    if others:
        named = ", ".join(f"{name} (of {checkpoint})" for name, checkpoint in others.items())
        raise SettingsMismatchError(["checkpoint_fingerprint"], f"{config.out_dir} holds results of another model: "
                                    f"{named}; give this evaluation another --out (or delete that folder)")


def run_evaluation(config: EvalConfig) -> dict | None:
    """Evaluate; returns the summary on rank 0 (None on other ranks)."""
    ranks = Ranks.setup()
    try:
        _refuse_another_models_results(config)
        try:  # before the output folder is made: a model that is nowhere leaves nothing behind
            bundle = load_bundle(config.checkpoint, dtype=resolve_dtype(config.dtype, ranks.device),
                                 trust_remote_code=config.trust_remote_code)
        except OSError as error:
            if Path(config.checkpoint).expanduser().exists():
                raise
            raise FileNotFoundError(f"{config.checkpoint}: not a folder here, and not a model the hub (or its cache) "
                                    f"has: {' '.join(str(error).split())}") from None
        Path(config.out_dir).mkdir(parents=True, exist_ok=True)
        bundle.model.to(ranks.device)
        predictor = Predictor(bundle, config.prompt.prompt_format, config.prompt.template_kwargs,
                              config.prompt.image_aspect, device=ranks.device,
                              system_prompt=config.prompt.system_prompt)
        for request in config.benchmarks:
            _evaluate_one(config, request, predictor, ranks)
        if not ranks.is_main:
            return None
        summary = {"run_name": config.run_name, "checkpoint": str(Path(config.checkpoint).resolve()),
                   "benchmarks": {name: {"metrics": r["metrics"], "settings": r["settings"]}
                                  for name, r in read_results(config.out_dir).items()}}
        write_atomically(Path(config.out_dir) / EVAL_SUMMARY, json.dumps(summary, indent=2))
        return summary
    finally:
        ranks.close()
