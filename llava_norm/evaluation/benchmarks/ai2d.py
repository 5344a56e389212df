"""AI2D (test, 3,088 diagram questions): loader, lmms-eval prompt, "X." filter + exact match.

Owns: reading ``lmms-lab/ai2d`` (masked labels) or ``Efficient-Large-Model/ai2d-no-mask``
parquet, or VLMEvalKit's ``AI2D_TEST.tsv`` / ``AI2D_TEST_NO_MASK.tsv``; the variant is an
explicit option because the files cannot tell which one they are, and it changes the score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from llava_norm.evaluation.benchmarks.base import (Declaration, GenerationItem, Headline, SCALE, accuracy,
                                                   one_of_the_choices, register_benchmark)
from llava_norm.evaluation.benchmarks.mcq import (ANSWER_WITH_LETTER, ai2d_reply_correct, format_options, gold_letter,
                                                  letters_right, options_from_row)
from llava_norm.evaluation.benchmarks.tabular import Row, RowBenchmark, required_image

VARIANTS = {
    "mask": "lmms-lab/ai2d split 'test' or VLMEvalKit AI2D_TEST.tsv (text labels covered by letters)",
    "no_mask": "Efficient-Large-Model/ai2d-no-mask split 'test' or VLMEvalKit AI2D_TEST_NO_MASK.tsv (letters added, text kept)",
}


def build_prompt(question: str, options: Mapping[str, str]) -> str:
    return f"{question}\n{format_options(options)}\n{ANSWER_WITH_LETTER}"


def _looks_no_mask(path: Path) -> bool:
    lowered = str(path).lower()
    return "no_mask" in lowered or "no-mask" in lowered


@register_benchmark
class AI2D(RowBenchmark):
    """Options: ``variant`` "mask" (default, lmms-eval ``ai2d``) or "no_mask"."""

    declaration: ClassVar[Declaration] = Declaration(
        name="ai2d", kind="generate",
        files=("AI2D_TEST.tsv", "AI2D_TEST_NO_MASK.tsv", "test-*.parquet", "**/test-*.parquet", "*.tsv", "*.parquet"),
        source=" | ".join(VARIANTS.values()),
        prompt=build_prompt, parser=ai2d_reply_correct,
        headline=Headline("AI2D", "accuracy", "accuracy (masked variant unless named)"),
        chance=one_of_the_choices, mirrors="lmms-eval ai2d", max_new_tokens=16,
    )

    variant: str = "mask"

    def __post_init__(self) -> None:
        self.check_option("variant", VARIANTS)

    def file_patterns(self) -> tuple[str, ...]:
        # VLMEvalKit's folder may hold both variants' TSVs: the asked-for variant's is tried first
        mask, no_mask, *rest = self.declaration.files
        return (mask, no_mask, *rest) if self.variant == "mask" else (no_mask, mask, *rest)

    def check_files(self, files: list[Path]) -> None:
        # The mix-ups a path can reveal: no-mask files scored as the masked variant, and
        # VLMEvalKit's masked file as the no-mask one.
        if self.variant == "mask" and any(_looks_no_mask(f) for f in files):
            raise ValueError(f"ai2d: {files[0]} looks like the no-mask data but variant='mask'; pass variant='no_mask'")
        masked = [f for f in files if f.name == self.declaration.files[0]]
        if self.variant == "no_mask" and masked:
            raise ValueError(f"ai2d: {masked[0]} is VLMEvalKit's masked data but variant='no_mask'; its no-mask file "
                             f"is {self.declaration.files[1]}")

    def item(self, row: Row, item_id: str, by_index: Mapping[str, Any]) -> GenerationItem:
        options = options_from_row(row, list_columns=("options",), max_letters=5)
        return self.generation_item(item_id, build_prompt(row.text("question"), options), required_image(row, by_index),
                                    answer=gold_letter(row, options), options=options, variant=self.variant)

    def score(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        correct = letters_right(self, items, predictions)
        return {"accuracy": accuracy(correct), "variant": self.variant, "num_items": len(items), "scale": SCALE}

    def details(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "data": VARIANTS[self.variant],
            "prompt_template": build_prompt("{question}", {"A": "..", "B": ".."}),
            "scoring": "filter: letter of a reply matching ^\\s*([A-Z])\\., else the raw reply; then exact match "
            "with the gold letter ignoring case and punctuation (and surrounding whitespace)",
        }
