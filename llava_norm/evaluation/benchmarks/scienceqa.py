"""ScienceQA-IMG (test, 2,017 image questions): loader, lmms-eval prompt, letter rule.

Owns: reading ``lmms-lab/ScienceQA`` (config ScienceQA-IMG, or ScienceQA-FULL whose
text-only rows are skipped) or VLMEvalKit's ``ScienceQA_TEST.tsv``, the lmms-eval prompt
with its optional "Context:" line, and its scoring: the stripped reply equals the letter
or starts ``^[A-Z]\\.`` with the right letter.
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
    options_from_row,
    scienceqa_reply_correct,
)
from llava_norm.evaluation.benchmarks.tabular import (
    Row,
    assign_item_ids,
    encoded_image,
    image_index,
    read_rows,
    resolve_files,
)

FILE_PATTERNS = (
    "ScienceQA_TEST*.tsv",
    "ScienceQA-IMG/test-*.parquet",
    "test-*.parquet",
    "**/test-*.parquet",
    "*.tsv",
    "*.parquet",
)


def build_prompt(question: str, hint: str | None, options: Mapping[str, str]) -> str:
    context = f"Context: {hint}\n" if hint else ""
    return f"{context}{question}\n{format_options(options)}\n{ANSWER_WITH_LETTER}"


@register_benchmark
@dataclass(frozen=True)
class ScienceQAImg(Benchmark):
    name: ClassVar[str] = "scienceqa_img"
    kind: ClassVar[str] = "generate"
    max_new_tokens: ClassVar[int] = 16  # lmms-eval scienceqa_img

    def load(self, path: str | Path, limit: int | None = None) -> list[GenerationItem]:
        """Rows without an image are not part of ScienceQA-IMG and are skipped; ``limit``
        counts the image rows kept."""
        check_limit(limit)
        rows = read_rows(resolve_files(path, FILE_PATTERNS, "ScienceQA-IMG"))
        ids = assign_item_ids(rows, ("index", "id"))  # before filtering, so ids match the file
        by_index = image_index(rows)
        items = []
        for row, item_id in zip(rows, ids):
            if limit is not None and len(items) >= limit:
                break
            image = encoded_image(row, "image", by_index)
            if image is not None:
                items.append(self._item(row, item_id, image))
        return items

    def _item(self, row: Row, item_id: str, image: EncodedImage) -> GenerationItem:
        options = options_from_row(row, list_columns=("choices",), max_letters=5)
        hint = row.optional_text("hint")
        return GenerationItem(
            benchmark=self.name,
            item_id=item_id,
            prompt=build_prompt(row.text("question"), hint, options),
            image=image,
            max_new_tokens=self.max_new_tokens,
            meta={"answer": gold_letter(row, options), "subject": row.optional_text("subject")},
        )

    def score(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        replies = generated_replies(self.name, items, predictions)
        correct = [scienceqa_reply_correct(reply, item.meta["answer"]) for item, reply in zip(items, replies)]
        return {"accuracy": mean([float(ok) for ok in correct]), "num_items": len(items), "scale": "0-1"}

    def settings(self) -> dict[str, Any]:
        return {
            "benchmark": self.name,
            "data": "lmms-lab/ScienceQA config 'ScienceQA-IMG' split 'test' (parquet) or VLMEvalKit ScienceQA_TEST.tsv; rows without an image are skipped",
            "prompt_template": "[Context: {hint}\n]" + build_prompt("{question}", None, {"A": "..", "B": ".."}),
            "hint": "Context line only when the hint is non-empty",
            "max_new_tokens": self.max_new_tokens,
            "scoring": "stripped reply equals the letter (any case), or matches ^[A-Z]\\. with the right letter; else wrong (lmms-eval, fixed 2025-07-04 #723)",
            "headline_metric": "accuracy (0-1)",
        }
