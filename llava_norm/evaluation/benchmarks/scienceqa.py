"""ScienceQA-IMG (test, 2,017 image questions): loader, lmms-eval prompt, letter rule.

Owns: reading ``lmms-lab/ScienceQA`` (config ScienceQA-IMG, or ScienceQA-FULL whose
text-only rows are skipped) or VLMEvalKit's ``ScienceQA_TEST.tsv``, the lmms-eval prompt
with its optional "Context:" line, and its scoring: the stripped reply equals the letter
or starts ``^[A-Z]\\.`` with the right letter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llava_norm.evaluation.benchmarks.base import (Declaration, GenerationItem, Headline, SCALE, accuracy,
                                                   one_of_the_choices, register_benchmark)
from llava_norm.evaluation.benchmarks.mcq import (ANSWER_WITH_LETTER, format_options, gold_letter, letters_right,
                                                  options_from_row, scienceqa_reply_correct)
from llava_norm.evaluation.benchmarks.tabular import Row, RowBenchmark, encoded_image


def build_prompt(question: str, hint: str | None, options: Mapping[str, str]) -> str:
    context = f"Context: {hint}\n" if hint else ""
    return f"{context}{question}\n{format_options(options)}\n{ANSWER_WITH_LETTER}"


@register_benchmark
class ScienceQAImg(RowBenchmark):
    """Rows without an image are not part of ScienceQA-IMG and are left out; ``limit``
    counts the image rows kept, and ids are those of the whole file."""

    declaration: ClassVar[Declaration] = Declaration(
        name="scienceqa_img", kind="generate", data_dir="scienceqa",
        files=("ScienceQA_TEST.tsv", "ScienceQA-IMG/test-*.parquet", "test-*.parquet", "**/test-*.parquet",
               "*.tsv", "*.parquet"),
        source="lmms-lab/ScienceQA config 'ScienceQA-IMG' split 'test' (parquet) or VLMEvalKit ScienceQA_TEST.tsv; "
        "rows without an image are skipped",
        prompt=build_prompt, parser=scienceqa_reply_correct,
        headline=Headline("ScienceQA-IMG", "accuracy", "accuracy"),
        chance=one_of_the_choices, mirrors="lmms-eval scienceqa_img", max_new_tokens=16,
    )

    def item(self, row: Row, item_id: str, by_index: Mapping[str, Any]) -> GenerationItem | None:
        if "image" not in row.values:  # a file without the column: not text-only rows, another layout
            raise ValueError(row.missing("image"))
        image = encoded_image(row, "image", by_index)
        if image is None:  # a text-only question: ScienceQA-IMG keeps those with an image
            return None
        options = options_from_row(row, list_columns=("choices",), max_letters=5)
        prompt = build_prompt(row.text("question"), row.optional_text("hint"), options)
        return self.generation_item(item_id, prompt, image, answer=gold_letter(row, options), options=options,
                                    subject=row.optional_text("subject"))

    def score(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        return {"accuracy": accuracy(letters_right(self, items, predictions)), "num_items": len(items), "scale": SCALE}

    def details(self) -> dict[str, Any]:
        return {
            "prompt_template": "[Context: {hint}\n]" + build_prompt("{question}", None, {"A": "..", "B": ".."}),
            "hint": "Context line only when the hint is non-empty",
            "scoring": "stripped reply equals the letter (any case), or matches ^[A-Z]\\. with the right letter; else wrong (lmms-eval, fixed 2025-07-04 #723)",
        }
