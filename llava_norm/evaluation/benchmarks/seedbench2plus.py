"""SEED-Bench-2-Plus (2,277 text-rich questions): loader, lmms-eval prompt, first-letter rule.

Owns: reading ``doolayer/SEED-Bench-2-Plus`` parquet (choice_A..D, question_image_type) or
VLMEvalKit's ``SEEDBench2_Plus.tsv`` (A..D, category), the lmms-eval prompt, and its
scoring: the first character of the stripped reply, compared case-insensitively with the
gold letter, reported for chart / map / web and overall (micro).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from llava_norm.evaluation.benchmarks.base import (
    Benchmark,
    GenerationItem,
    generated_replies,
    mean,
    register_benchmark,
)
from llava_norm.evaluation.benchmarks.mcq import (
    ANSWER_WITH_LETTER,
    first_character,
    format_options,
    gold_letter,
    grouped_accuracy,
    grouped_counts,
)
from llava_norm.evaluation.benchmarks.tabular import (
    Row,
    image_index,
    read_benchmark_rows,
    required_image,
)

IMAGE_TYPES = ("chart", "map", "web")
FILE_PATTERNS = ("SEEDBench2_Plus*.tsv", "test-*.parquet", "**/test-*.parquet", "*.tsv", "*.parquet")


def build_prompt(question: str, options: Mapping[str, str]) -> str:
    return f"{question}\n{format_options(options)}\n{ANSWER_WITH_LETTER}"


@register_benchmark
@dataclass(frozen=True)
class SEEDBench2Plus(Benchmark):
    name: ClassVar[str] = "seedbench2_plus"
    kind: ClassVar[str] = "generate"
    max_new_tokens: ClassVar[int] = 16  # lmms-eval seedbench_2_plus

    def load(self, path: str | Path, limit: int | None = None) -> list[GenerationItem]:
        rows, ids = read_benchmark_rows(path, FILE_PATTERNS, "SEED-Bench-2-Plus", ("question_id", "index"), limit)
        by_index = image_index(rows)
        return [self._item(row, item_id, by_index) for row, item_id in zip(rows, ids)]

    def _item(self, row: Row, item_id: str, by_index: Mapping[str, Any]) -> GenerationItem:
        options = {letter: row.text(f"choice_{letter}", letter) for letter in "ABCD"}
        type_column = row.first_present("question_image_type", "category") or "question_image_type"
        image_type = row.text("question_image_type", "category").strip().lower()
        if image_type not in IMAGE_TYPES:
            raise row.bad_value(type_column, f"must be one of {IMAGE_TYPES}")
        image = required_image(row, by_index)
        return GenerationItem(
            benchmark=self.name,
            item_id=item_id,
            prompt=build_prompt(row.text("question"), options),
            image=image,
            max_new_tokens=self.max_new_tokens,
            meta={"answer": gold_letter(row, options), "image_type": image_type},
        )

    def score(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        replies = generated_replies(self.name, items, predictions)
        correct = [first_character(reply).lower() == item.meta["answer"].lower() for item, reply in zip(items, replies)]
        types = [item.meta["image_type"] for item in items]
        return {
            "all": mean([float(ok) for ok in correct]),
            **grouped_accuracy(types, correct),
            "items_per_type": grouped_counts(types),
            "num_items": len(items),
            "scale": "0-1",
        }

    def settings(self) -> dict[str, Any]:
        return {
            "benchmark": self.name,
            "data": "doolayer/SEED-Bench-2-Plus split 'test' (parquet) or VLMEvalKit SEEDBench2_Plus.tsv",
            "prompt_template": build_prompt("{question}", {"A": "..", "B": "..", "C": "..", "D": ".."}),
            "max_new_tokens": self.max_new_tokens,
            "scoring": "first character of the stripped reply equals the gold letter, case-insensitive (lmms-eval)",
            "aggregation": "accuracy per question_image_type (chart, map, web) and 'all' = micro over every item",
            "headline_metric": "all (0-1)",
        }
