"""SEED-Bench-2-Plus (2,277 text-rich questions): loader, lmms-eval prompt, first-letter rule.

Owns: reading ``doolayer/SEED-Bench-2-Plus`` parquet (choice_A..D, question_image_type) or
VLMEvalKit's ``SEEDBench2_Plus.tsv`` (A..D, category), the lmms-eval prompt, and its
scoring: the first character of the stripped reply, compared case-insensitively with the
gold letter, reported for chart / map / web and overall (micro).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llava_norm.evaluation.benchmarks.base import (Declaration, GenerationItem, Headline, SCALE, accuracy,
                                                   one_of_the_choices, register_benchmark)
from llava_norm.evaluation.benchmarks.mcq import (ANSWER_WITH_LETTER, LETTERS, format_options, gold_letter,
                                                  grouped_accuracy, grouped_counts, letters_right,
                                                  seedbench_reply_correct)
from llava_norm.evaluation.benchmarks.tabular import Row, RowBenchmark, required_image

IMAGE_TYPES = ("chart", "map", "web")


def build_prompt(question: str, options: Mapping[str, str]) -> str:
    return f"{question}\n{format_options(options)}\n{ANSWER_WITH_LETTER}"


@register_benchmark
class SEEDBench2Plus(RowBenchmark):
    declaration: ClassVar[Declaration] = Declaration(
        name="seedbench2_plus", kind="generate", data_dir="seedbench_2_plus",
        files=("SEEDBench2_Plus.tsv", "test-*.parquet", "**/test-*.parquet", "*.tsv", "*.parquet"),
        source="doolayer/SEED-Bench-2-Plus split 'test' (parquet) or VLMEvalKit SEEDBench2_Plus.tsv",
        prompt=build_prompt, parser=seedbench_reply_correct,
        headline=Headline("SEED-Bench-2-Plus", "all", "accuracy over chart, map and web"),
        chance=one_of_the_choices, mirrors="lmms-eval seedbench_2_plus", max_new_tokens=16,
    )
    id_columns = ("question_id", "index")

    def item(self, row: Row, item_id: str, by_index: Mapping[str, Any]) -> GenerationItem:
        options = {letter: row.text(f"choice_{letter}", letter) for letter in LETTERS[:4]}
        type_column = row.first_present("question_image_type", "category") or "question_image_type"
        image_type = row.text("question_image_type", "category").strip().lower()
        if image_type not in IMAGE_TYPES:
            raise row.bad_value(type_column, f"must be one of {IMAGE_TYPES}")
        return self.generation_item(item_id, build_prompt(row.text("question"), options), required_image(row, by_index),
                                    answer=gold_letter(row, options), options=options, image_type=image_type)

    def score(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        correct = letters_right(self, items, predictions)
        types = [item.meta["image_type"] for item in items]
        return {
            "all": accuracy(correct),
            **grouped_accuracy(types, correct),
            "items_per_type": grouped_counts(types),
            "num_items": len(items),
            "scale": SCALE,
        }

    def details(self) -> dict[str, Any]:
        return {
            "prompt_template": build_prompt("{question}", {"A": "..", "B": "..", "C": "..", "D": ".."}),
            "scoring": "first character of the stripped reply equals the gold letter, case-insensitive (lmms-eval)",
            "aggregation": "accuracy per question_image_type (chart, map, web) and 'all' = micro over every item",
        }
