"""MMBench-EN dev: loader, prompt and CircularEval scoring.

Owns: reading the lmms-lab/MMBench ``en`` ``dev`` parquet or VLMEvalKit's
``MMBench_DEV_EN.tsv`` (4,329 rows = 1,164 questions plus option-rotated copies at
index + k * 1e6), the two community prompts, and CircularEval: a question counts only if
every rotated copy is answered correctly, with letters read by VLMEvalKit's rule-based
``can_infer`` (no GPT judge; an unparsable reply is wrong and counted).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from llava_norm.evaluation.benchmarks.base import (Declaration, GenerationItem, Headline, SCALE, accuracy, check_limit,
                                                   every_copy_right, generated_replies, register_benchmark)
from llava_norm.evaluation.benchmarks.mcq import (ANSWER_WITH_LETTER, format_options, gold_letter, grouped_accuracy,
                                                  infer_option_letter, options_from_row)
from llava_norm.evaluation.benchmarks.tabular import Row, RowBenchmark, required_image

CIRCULAR_STRIDE = 1_000_000  # copy k of question q has index q + k * CIRCULAR_STRIDE
PROMPT_VARIANTS = ("llava", "lmms_eval")


def build_prompt(question: str, hint: str | None, options: Mapping[str, str], variant: str) -> str:
    """``llava``: LLaVA's model_vqa_mmbench / VLMEvalKit-LLaVA layout,
    ``hint\\nquestion\\nA. ..\\nB. ..\\n<instruction>``.
    ``lmms_eval``: ``hint question There are several options:\\nA. ..\\n\\n<instruction>``
    (its blank line before the instruction included)."""
    if variant == "llava":
        head = question if hint is None else f"{hint}\n{question}"
        return f"{head}\n{format_options(options)}\n{ANSWER_WITH_LETTER}"
    head = question if hint is None else f"{hint} {question}"
    return f"{head} There are several options:\n{format_options(options)}\n\n{ANSWER_WITH_LETTER}"


@register_benchmark
class MMBenchEnDev(RowBenchmark):
    """Options: ``prompt_variant`` "llava" (default) or "lmms_eval"."""

    declaration: ClassVar[Declaration] = Declaration(
        name="mmbench_en_dev", kind="generate", data_dir="mmbench",
        files=("MMBench_DEV_EN.tsv", "en/dev-*.parquet", "dev-*.parquet", "*.tsv", "*.parquet"),
        source="lmms-lab/MMBench config 'en' split 'dev' (parquet) or VLMEvalKit MMBench_DEV_EN.tsv",
        prompt=build_prompt, parser=infer_option_letter,
        headline=Headline("MMBench-EN", "circular_accuracy", "CircularEval accuracy, dev split"),
        chance=every_copy_right,
        mirrors="VLMEvalKit MMBench_DEV_EN exact_matching (lmms-eval mmbench_en_dev's prompts; its own letter "
                "extraction reads replies that go on after the letter, 'B. The dog ...')",
        max_new_tokens=1024,
    )

    prompt_variant: str = "llava"

    def __post_init__(self) -> None:
        self.check_option("prompt_variant", PROMPT_VARIANTS)

    def load(self, path: str | Path, limit: int | None = None) -> list[GenerationItem]:
        """``limit`` keeps the first ``limit`` *questions* with all of their rotated copies,
        so circular scoring of a limited run is still circular."""
        check_limit(limit)
        items = super().load(path)
        repeated = sorted(i for i, n in Counter(item.item_id for item in items).items() if n > 1)
        if repeated:
            raise ValueError(f"{path}: MMBench 'index' values repeat: {repeated[:5]}")
        own = {item.meta["group"] for item in items if item.meta["index"] == item.meta["group"]}
        orphans = [item.meta["index"] for item in items if item.meta["group"] not in own]
        if orphans:  # VLMEvalKit and lmms-eval leave such copies out unsaid: a filtered or cut file
            raise ValueError(f"{path}: MMBench rows at index {orphans[:5]} are rotated copies of questions whose own "
                             f"row (index {orphans[0] % CIRCULAR_STRIDE}, ...) is not in the file; CircularEval "
                             "scores a question with its own row and every copy: give the whole file")
        if limit is not None:
            # dict keeps first-seen order: the first `limit` questions of the file
            first_groups = list(dict.fromkeys(item.meta["group"] for item in items))[:limit]
            kept = set(first_groups)
            items = [item for item in items if item.meta["group"] in kept]
        return items

    def item(self, row: Row, item_id: str, by_index: Mapping[str, Any]) -> GenerationItem:
        index = row.integer("index")  # the id: CircularEval needs it, so no fallback
        options = options_from_row(row, list_columns=(), max_letters=5)
        prompt = build_prompt(row.text("question"), row.optional_text("hint"), options, self.prompt_variant)
        return self.generation_item(
            str(index), prompt, required_image(row, by_index),
            index=index,
            group=index % CIRCULAR_STRIDE,
            answer=gold_letter(row, options),
            options=options,
            category=row.text("category"),
            l2_category=row.optional_text("L2-category", "l2-category", "l2_category") or "unknown",
        )

    def score(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        replies = generated_replies(self.name, items, predictions)
        extracted = [infer_option_letter(reply, item.meta["options"]) for item, reply in zip(items, replies)]
        row_correct = [letter == item.meta["answer"] for item, letter in zip(items, extracted)]

        group_rows: dict[int, list[bool]] = defaultdict(list)
        group_base: dict[int, GenerationItem] = {}
        for item, ok in zip(items, row_correct):
            group = item.meta["group"]
            group_rows[group].append(ok)
            if item.meta["index"] == group:  # its own row carries its categories (load refuses a file without it)
                group_base[group] = item
        groups = sorted(group_rows)
        group_correct = [all(group_rows[g]) for g in groups]
        return {
            "circular_accuracy": accuracy(group_correct),
            "num_questions": len(groups),
            "num_rows": len(items),
            "rows_per_question": {str(n): sum(1 for g in groups if len(group_rows[g]) == n) for n in sorted({len(v) for v in group_rows.values()})},
            "per_category": grouped_accuracy((group_base[g].meta["category"] for g in groups), group_correct),
            "per_l2_category": grouped_accuracy((group_base[g].meta["l2_category"] for g in groups), group_correct),
            "unparsable_replies": sum(1 for letter in extracted if letter is None),
            "per_row_accuracy_not_mmbench_score": accuracy(row_correct),
            "scale": SCALE,
        }

    def details(self) -> dict[str, Any]:
        return {
            "prompt_variant": self.prompt_variant,
            "prompt_template": build_prompt("{question}", "{hint}", {"A": "..", "B": ".."}, self.prompt_variant),
            "hint": "omitted when empty or NaN",
            "scoring": "CircularEval: a question (index < 1e6) is right only if every row with index % 1e6 == it is right",
            "letter_extraction": "VLMEvalKit can_infer (e8e78f0): a refusal or a lone Z is no option; one standalone "
                                 "option-letter token among the last four; else 'answer is X'; else exactly one option text "
                                 "in a reply at most twice the options' length; no GPT judge",
            "unparsable_reply": "scored wrong and counted in unparsable_replies",
        }
