"""HellaSwag (validation, 10,042 items; text only): lm-eval preprocessing and acc / acc_norm.

Owns: reading the ``Rowan/hellaswag`` columns (activity_label, ctx_a, ctx_b, endings,
label) from JSONL / JSON / parquet, lm-eval's context and ending cleaning, and its two
metrics: argmax of summed log-probability (acc) and of log-probability divided by the
ending's character length (acc_norm). Zero-shot.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from llava_norm.evaluation.benchmarks.base import (
    Benchmark,
    LoglikelihoodItem,
    continuation_logprobs,
    first_argmax,
    mean,
    per_character,
    register_benchmark,
)
from llava_norm.evaluation.benchmarks.tabular import Row, read_benchmark_rows

FILE_PATTERNS = (
    "hellaswag_val.jsonl",
    "data/validation-*.parquet",
    "validation-*.parquet",
    "**/validation/*.parquet",
    "**/*validation*.parquet",
    "**/*val*.jsonl",
)


def clean(text: str) -> str:
    """lm-eval's ``preprocess``: " [title]" -> ". ", bracketed WikiHow artefacts removed,
    double spaces collapsed once."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def build_context(activity_label: str, ctx_a: str, ctx_b: str) -> str:
    return clean(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())


@register_benchmark
@dataclass(frozen=True)
class HellaSwag(Benchmark):
    name: ClassVar[str] = "hellaswag"
    kind: ClassVar[str] = "loglikelihood"

    def load(self, path: str | Path, limit: int | None = None) -> list[LoglikelihoodItem]:
        rows, ids = read_benchmark_rows(path, FILE_PATTERNS, "HellaSwag validation", ("ind", "index", "id"), limit)
        return [self._item(row, item_id) for row, item_id in zip(rows, ids)]

    def _item(self, row: Row, item_id: str) -> LoglikelihoodItem:
        endings = row.string_list("endings")
        if len(endings) != 4:
            raise row.bad_value("endings", "must hold 4 endings")
        label = row.integer("label")
        if not 0 <= label < len(endings):
            raise row.bad_value("label", "must be 0-3")
        # ctx_a / ctx_b may legitimately be empty strings; the columns must still exist.
        ctx_a, ctx_b = row.text_allow_empty("ctx_a"), row.text_allow_empty("ctx_b")
        choices = [clean(ending) for ending in endings]
        return LoglikelihoodItem(
            benchmark=self.name,
            item_id=item_id,
            context=build_context(row.text("activity_label"), ctx_a, ctx_b),
            continuations=[" " + choice for choice in choices],
            gold=label,
            # lm-eval normalises by the length of the choice itself, without the leading space
            meta={"choice_lengths": [len(choice) for choice in choices]},
        )

    def score(self, items: Sequence[LoglikelihoodItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        logprobs = continuation_logprobs(self.name, items, predictions)
        acc, acc_norm = [], []
        for item, scores in zip(items, logprobs):
            lengths = item.meta["choice_lengths"]
            acc.append(float(first_argmax(scores) == item.gold))
            acc_norm.append(float(first_argmax(per_character(scores, lengths)) == item.gold))
        return {"acc": mean(acc), "acc_norm": mean(acc_norm), "num_items": len(items), "scale": "0-1"}

    def settings(self) -> dict[str, Any]:
        return {
            "benchmark": self.name,
            "data": "Rowan/hellaswag split 'validation' (parquet, or hellaswag_val.jsonl)",
            "num_fewshot": 0,
            "context": "clean(activity_label + ': ' + ctx_a + ' ' + ctx_b.capitalize())",
            "cleaning": "strip; ' [title]' -> '. '; remove [..]; '  ' -> ' ' (lm-eval preprocess)",
            "continuations": "' ' + clean(ending) for the 4 endings",
            "scoring": "acc = argmax summed log-prob; acc_norm = argmax log-prob / len(clean(ending)) in characters",
            "headline_metric": "acc_norm (0-1)",
        }
