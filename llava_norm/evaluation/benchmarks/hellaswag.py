"""HellaSwag (validation, 10,042 items; text only): lm-eval preprocessing and acc / acc_norm.

Owns: reading the ``Rowan/hellaswag`` columns (activity_label, ctx_a, ctx_b, endings,
label) from JSONL / JSON / parquet, lm-eval's context and ending cleaning, and its two
metrics: argmax of summed log-probability (acc) and of log-probability divided by the
ending's character length (acc_norm). Zero-shot.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llava_norm.evaluation.benchmarks.base import (Declaration, Headline, LoglikelihoodItem, SCALE, accuracy,
                                                   continuation_logprobs, first_argmax, one_of_the_choices, picked_gold,
                                                   register_benchmark)
from llava_norm.evaluation.benchmarks.tabular import Row, RowBenchmark


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
class HellaSwag(RowBenchmark):
    declaration: ClassVar[Declaration] = Declaration(
        name="hellaswag", kind="loglikelihood",
        files=("hellaswag_val.jsonl", "data/validation-*.parquet", "validation-*.parquet", "**/validation/*.parquet",
               "**/*validation*.parquet", "**/*val*.jsonl"),
        source="Rowan/hellaswag split 'validation' (parquet, or hellaswag_val.jsonl)",
        prompt=build_context, parser=first_argmax,
        headline=Headline("HellaSwag", "acc_norm", "acc_norm (log-likelihood / characters)"),
        chance=one_of_the_choices, mirrors="lm-eval hellaswag",
    )
    id_columns = ("ind", "index", "id")

    def item(self, row: Row, item_id: str, by_index: Mapping[str, Any]) -> LoglikelihoodItem:
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
        return {"acc": accuracy(picked_gold(items, logprobs)), "acc_norm": accuracy(picked_gold(items, logprobs, per_char=True)),
                "num_items": len(items), "scale": SCALE}

    def details(self) -> dict[str, Any]:
        return {
            "num_fewshot": 0,
            "context": "clean(activity_label + ': ' + ctx_a + ' ' + ctx_b.capitalize())",
            "cleaning": "strip; ' [title]' -> '. '; remove [..]; '  ' -> ' ' (lm-eval preprocess)",
            "continuations": "' ' + clean(ending) for the 4 endings",
            "scoring": "acc = argmax summed log-prob; acc_norm = argmax log-prob / len(clean(ending)) in characters "
                       "(an empty ending: numpy's quotient, -inf, as lm-eval)",
        }
