"""AI2D (test, 3,088 diagram questions): loader, lmms-eval prompt, "X." filter + exact match.

Owns: reading ``lmms-lab/ai2d`` (masked labels) or ``Efficient-Large-Model/ai2d-no-mask``
parquet, or VLMEvalKit's ``AI2D_TEST.tsv`` / ``AI2D_TEST_NO_MASK.tsv``; the variant is an
explicit option because the files cannot tell which one they are, and it changes the score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from llava_norm.evaluation.benchmarks.base import (
    Benchmark,
    EncodedImage,
    GenerationItem,
    check_limit,
    generated_replies,
    mean,
    register_benchmark,
)
from llava_norm.evaluation.benchmarks.mcq import (
    ANSWER_WITH_LETTER,
    format_options,
    gold_letter,
    leading_letter_dot,
    normalised_for_exact_match,
    options_from_row,
)
from llava_norm.evaluation.benchmarks.tabular import (
    Row,
    assign_item_ids,
    image_index,
    read_rows,
    required_image,
    resolve_files,
)

VARIANTS = {
    "mask": "lmms-lab/ai2d split 'test' or VLMEvalKit AI2D_TEST.tsv (text labels covered by letters)",
    "no_mask": "Efficient-Large-Model/ai2d-no-mask split 'test' or VLMEvalKit AI2D_TEST_NO_MASK.tsv (letters added, text kept)",
}
FILE_PATTERNS = ("AI2D_TEST*.tsv", "test-*.parquet", "**/test-*.parquet", "*.tsv", "*.parquet")


def build_prompt(question: str, options: Mapping[str, str]) -> str:
    return f"{question}\n{format_options(options)}\n{ANSWER_WITH_LETTER}"


def _looks_no_mask(path: Path) -> bool:
    lowered = str(path).lower()
    return "no_mask" in lowered or "no-mask" in lowered


@register_benchmark
@dataclass(frozen=True)
class AI2D(Benchmark):
    """Options: ``variant`` "mask" (default, lmms-eval ``ai2d``) or "no_mask"."""

    name: ClassVar[str] = "ai2d"
    kind: ClassVar[str] = "generate"
    max_new_tokens: ClassVar[int] = 16  # lmms-eval ai2d

    variant: str = "mask"

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"ai2d: variant must be one of {sorted(VARIANTS)}, got {self.variant!r}")

    def load(self, path: str | Path, limit: int | None = None) -> list[GenerationItem]:
        check_limit(limit)
        files = resolve_files(path, FILE_PATTERNS, "AI2D")
        # Catch the one mix-up a path can reveal: no-mask files scored as the masked variant.
        if self.variant == "mask" and any(_looks_no_mask(f) for f in files):
            raise ValueError(f"ai2d: {files[0]} looks like the no-mask data but variant='mask'; pass variant='no_mask'")
        rows = read_rows(files)[:limit]
        by_index = image_index(rows)
        ids = assign_item_ids(rows, ("index", "id"))
        return [self._item(row, item_id, required_image(row, by_index)) for row, item_id in zip(rows, ids)]

    def _item(self, row: Row, item_id: str, image: EncodedImage) -> GenerationItem:
        options = options_from_row(row, list_columns=("options",), max_letters=5)
        return GenerationItem(
            benchmark=self.name,
            item_id=item_id,
            prompt=build_prompt(row.text("question"), options),
            image=image,
            max_new_tokens=self.max_new_tokens,
            meta={"answer": gold_letter(row, options), "variant": self.variant},
        )

    def score(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        replies = generated_replies(self.name, items, predictions)
        correct = [
            normalised_for_exact_match(leading_letter_dot(reply)) == normalised_for_exact_match(item.meta["answer"])
            for item, reply in zip(items, replies)
        ]
        return {"accuracy": mean([float(ok) for ok in correct]), "variant": self.variant, "num_items": len(items), "scale": "0-1"}

    def settings(self) -> dict[str, Any]:
        return {
            "benchmark": self.name,
            "variant": self.variant,
            "data": VARIANTS[self.variant],
            "prompt_template": build_prompt("{question}", {"A": "..", "B": ".."}),
            "max_new_tokens": self.max_new_tokens,
            "scoring": "filter: letter of a reply matching ^\\s*([A-Z])\\., else the raw reply; then exact match "
            "with the gold letter ignoring case and punctuation (and surrounding whitespace)",
            "headline_metric": "accuracy (0-1)",
        }
