"""MMStar (val, 1,500 items): loader, lmms-eval prompt, two scoring variants.

Owns: reading ``Lin-Chen/MMStar`` parquet (options inline in the question) or VLMEvalKit's
``MMStar.tsv`` (A-D columns), the lmms-eval prompt, and scoring with either the paper-era
lmms-eval rule (default) or VLMEvalKit's ``can_infer``; reports micro accuracy and
lmms-eval's macro means over L2 axes, overall and per core category.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from llava_norm.evaluation.benchmarks.base import (Declaration, GenerationItem, Headline, SCALE, UnitRows, accuracy,
                                                   generated_replies, mean, one_of_the_choices, register_benchmark)
from llava_norm.evaluation.benchmarks.mcq import (ANSWER_WITH_LETTER, LETTERS, grouped_accuracy, infer_option_letter,
                                                  mmstar_paper_era_correct)
from llava_norm.evaluation.benchmarks.tabular import Row, RowBenchmark, required_image

# lmms-eval's post_prompt for MMStar: note there is no final period.
INSTRUCTION = "\n" + ANSWER_WITH_LETTER.removesuffix(".")
YES_NO_SUFFIX = " Please answer yes or no."
SCORING_VARIANTS = ("lmms_eval_paper_era", "vlmevalkit_can_infer")


def split_inline_options(question: str) -> dict[str, str]:
    """Options from MMStar's inline form "...\\nOptions: A: x, B: y, C: z, D: w".

    Markers are searched in order (", B: " after "A: " ...), so commas inside an option's
    text survive. Returns {} when the question has no such block.
    """
    start = question.rfind("Options:")
    if start < 0:
        return {}
    block = question[start + len("Options:"):].strip()
    if not block.startswith("A: "):
        return {}
    letters, cuts, cursor = ["A"], [0], 0
    for letter in LETTERS[1:]:
        position = block.find(f", {letter}: ", cursor)
        if position < 0:
            break
        letters.append(letter)
        cuts.append(position)
        cursor = position + 1
    cuts.append(len(block))
    options = {}
    for i, letter in enumerate(letters):
        begin = cuts[i] + (len("A: ") if i == 0 else len(f", {letter}: "))
        options[letter] = block[begin: cuts[i + 1]]
    return options


def build_prompt(question: str) -> str:
    return question.strip().replace(YES_NO_SUFFIX, "") + INSTRUCTION


def _macro_over_l2(rows: np.ndarray) -> float:
    """``average_macro_l2`` in percent: the mean over L2 categories of their accuracy."""
    return float(np.mean([rows[rows[:, 1] == code, 0].mean() for code in np.unique(rows[:, 1])]))


@register_benchmark
class MMStar(RowBenchmark):
    """Options: ``scoring`` "lmms_eval_paper_era" (default) or "vlmevalkit_can_infer"."""

    declaration: ClassVar[Declaration] = Declaration(
        name="mmstar", kind="generate",
        files=("MMStar.tsv", "mmstar*.parquet", "**/mmstar*.parquet", "val-*.parquet", "**/val-*.parquet",
               "*.tsv", "*.parquet"),
        source="Lin-Chen/MMStar split 'val' (parquet, options inline) or VLMEvalKit MMStar.tsv (A-D columns, rebuilt inline)",
        prompt=build_prompt, parser=mmstar_paper_era_correct,
        headline=Headline("MMStar", "average_macro_l2", "average over categories (macro over L2 categories)", macro=True),
        chance=one_of_the_choices, mirrors="lmms-eval mmstar",
        max_new_tokens=1024,  # the task sets none; lmms-eval's llava default
    )
    id_columns = ("index",)

    scoring: str = "lmms_eval_paper_era"

    def __post_init__(self) -> None:
        self.check_option("scoring", SCORING_VARIANTS)

    def item(self, row: Row, item_id: str, by_index: Mapping[str, Any]) -> GenerationItem:
        question = row.text("question")
        column_options = {letter: str(row.values[letter]) for letter in LETTERS[:4] if row.has(letter)}
        inline_options = split_inline_options(question)
        if column_options and not inline_options:
            # VLMEvalKit's TSV keeps options in columns; rebuild the inline block the HF
            # data carries so both layouts give the model the same prompt.
            question = question.rstrip() + "\nOptions: " + ", ".join(f"{k}: {v}" for k, v in column_options.items())
        # Without readable option texts can_infer still finds a standalone letter A-D.
        options = column_options or inline_options or {letter: "" for letter in LETTERS[:4]}
        answer = row.text("answer").strip().upper()
        if answer not in LETTERS[:4]:
            raise row.bad_value("answer", "must be one of A, B, C, D")
        return self.generation_item(
            item_id, build_prompt(question), required_image(row, by_index),
            answer=answer,
            options=options,
            category=row.text("category"),
            l2_category=row.text("l2_category", "l2-category", "L2-category"),
        )

    def _correct(self, item: GenerationItem, reply: str) -> bool:
        if self.scoring == "lmms_eval_paper_era":
            return mmstar_paper_era_correct(reply, item.meta["answer"])
        return infer_option_letter(reply, item.meta["options"]) == item.meta["answer"]

    def unit_rows(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> UnitRows:
        """Per item: right (100/0) and its L2 category's index; the headline is the mean of the
        L2 categories' accuracies."""
        replies = generated_replies(self.name, items, predictions)
        codes = {l2: i for i, l2 in enumerate(sorted({item.meta["l2_category"] for item in items}))}
        rows = [[100.0 * self._correct(item, reply), codes[item.meta["l2_category"]]]
                for item, reply in zip(items, replies)]
        return UnitRows({item.item_id: [item] for item in items}, np.array(rows, dtype=float), _macro_over_l2)

    def score(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        replies = generated_replies(self.name, items, predictions)
        correct = [self._correct(item, reply) for item, reply in zip(items, replies)]
        per_l2 = grouped_accuracy((item.meta["l2_category"] for item in items), correct)
        l2_by_category: dict[str, set[str]] = defaultdict(set)
        for item in items:
            l2_by_category[item.meta["category"]].add(item.meta["l2_category"])
        per_category_micro = grouped_accuracy((item.meta["category"] for item in items), correct)
        per_category_macro_l2 = {
            category: mean([per_l2[l2] for l2 in sorted(l2s)]) for category, l2s in sorted(l2_by_category.items())
        }
        return {
            "average_macro_l2": mean(list(per_l2.values())),
            "accuracy_micro": accuracy(correct),
            "per_category_macro_l2": per_category_macro_l2,
            "per_category_micro": per_category_micro,
            "per_l2_category": per_l2,
            "num_items": len(items),
            "scale": SCALE,
        }

    def details(self) -> dict[str, Any]:
        return {
            "prompt_template": "{question.strip() without ' Please answer yes or no.'}" + INSTRUCTION,
            "scoring": self.scoring,
            "scoring_rule": {
                "lmms_eval_paper_era": "lowercase; right if the first char is the letter or the reply starts '(x', 'option x', 'the answer is x' (lmms-eval before #1274)",
                "vlmevalkit_can_infer": "VLMEvalKit can_infer (e8e78f0) letter/answer-is/option-text extraction; unparsable = wrong",
            }[self.scoring],
            "aggregation": "average_macro_l2 = lmms-eval 'average' (mean of the 18 L2-axis accuracies); "
            "per_category_macro_l2 = lmms-eval per-category metrics; accuracy_micro = VLMEvalKit Overall (/100)",
        }
