"""POPE (COCO val2014; adversarial / popular / random, 3,000 each): loader, prompt, metrics.

Owns: reading ``lmms-lab/POPE`` parquet (pooled ``test`` or the ``Full`` per-split files)
or VLMEvalKit's ``POPE.tsv`` (comma-joined categories, "Yes"/"No"), the split filter, the
yes/no reply rule, and accuracy / precision / recall / F1 (positive = yes) with the share
of *predicted* yes, per split, as the mean over splits and pooled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from llava_norm.evaluation.benchmarks.base import (Declaration, GenerationItem, Headline, SCALE, UnitRows,
                                                   generated_replies, mean, register_benchmark, yes_or_no)
from llava_norm.evaluation.benchmarks.tabular import Row, RowBenchmark, required_image

SPLITS = ("adversarial", "popular", "random")
INSTRUCTION = "\nAnswer the question using a single word or phrase."
REPLY_RULES = {
    "lmms_eval_strict": "lowercase + strip, then the reply must equal 'yes' or 'no'; anything else is unparsable and wrong",
    "llava_first_sentence": "LLaVA eval_pope: keep the text before the first '.', drop commas; a word 'No', 'no' or 'not' means no, anything else yes",
}


def build_prompt(question: str) -> str:
    return question.strip() + INSTRUCTION


def parse_yes_no(reply: str, rule: str) -> str | None:
    """"yes", "no", or None when the rule cannot read the reply."""
    if rule == "lmms_eval_strict":
        answer = reply.lower().strip()
        return answer if answer in ("yes", "no") else None
    first_sentence = reply.split(".")[0].replace(",", "")
    words = first_sentence.split(" ")
    return "no" if ("No" in words or "no" in words or "not" in words) else "yes"


def _mean_split_f1(rows: np.ndarray) -> float:
    """``mean_over_splits.f1`` in percent from ``unit_rows``' columns."""
    f1s = []
    for column in range(4, 4 + len(SPLITS)):
        chosen = rows[rows[:, column] > 0]
        if len(chosen):
            true_pos = float(np.sum(chosen[:, 1] * chosen[:, 3]))
            false_pos = float(np.sum(chosen[:, 1] * (1 - chosen[:, 3])))
            false_neg = float(np.sum(chosen[:, 2] * chosen[:, 3]))
            precision = true_pos / (true_pos + false_pos) if true_pos + false_pos else 0.0
            recall = true_pos / (true_pos + false_neg) if true_pos + false_neg else 0.0
            f1s.append(2 * precision * recall / (precision + recall) if precision + recall else 0.0)
    return 100.0 * mean(f1s)


def yes_no_metrics(gold: Sequence[str], predicted: Sequence[str | None]) -> dict[str, float | int]:
    """Positive class = yes, as lmms-eval's ``pope_aggregate_*``: a miss (false negative) is an
    exact "no" to a yes question, so an unreadable reply drops out of precision and recall.
    It still counts as wrong in accuracy, and ``unparsable`` says how many there were. With
    the LLaVA rule every reply parses, so this is also LLaVA's ``eval_pope``."""
    pairs = list(zip(gold, predicted, strict=True))
    true_pos = sum(1 for g, p in pairs if g == "yes" and p == "yes")
    false_pos = sum(1 for g, p in pairs if g == "no" and p == "yes")
    false_neg = sum(1 for g, p in pairs if g == "yes" and p == "no")
    gold_yes = sum(1 for g in gold if g == "yes")
    predicted_yes = sum(1 for p in predicted if p == "yes")
    precision = true_pos / (true_pos + false_pos) if true_pos + false_pos else 0.0
    recall = true_pos / (true_pos + false_neg) if true_pos + false_neg else 0.0
    n = len(pairs)
    return {
        "accuracy": mean([float(g == p) for g, p in pairs]),
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "predicted_yes_share": predicted_yes / n if n else 0.0,
        "gold_yes_share": gold_yes / n if n else 0.0,
        "unparsable": sum(1 for p in predicted if p is None),
        "num_items": n,
    }


def _splits_of(row: Row) -> tuple[str, ...]:
    if row.has("category"):
        names = tuple(part.strip().lower() for part in str(row.values["category"]).split(","))
        column = "category"
    else:  # lmms-lab/POPE "Full" files are named after their split
        names = tuple(s for s in SPLITS if s in row.source.name.lower())
        column = "category (or a split name in the file name)"
    if not names or any(name not in SPLITS for name in names):
        raise ValueError(f"{row.where}: {column} must name one or more of {SPLITS}, got {row.values.get('category')!r}")
    return names


@register_benchmark
class POPE(RowBenchmark):
    """Options: ``split`` "all" (default) or one of adversarial / popular / random;
    ``reply_rule`` "lmms_eval_strict" (default) or "llava_first_sentence"."""

    declaration: ClassVar[Declaration] = Declaration(
        name="pope", kind="generate",
        files=("POPE.tsv", "data/test-*.parquet", "test-*.parquet", "Full/*.parquet", "*.parquet", "*.tsv"),
        source="lmms-lab/POPE (config 'default' split 'test' pooled, or config 'Full' splits "
        "adversarial/popular/random) or VLMEvalKit POPE.tsv",
        prompt=build_prompt, parser=parse_yes_no,
        headline=Headline("POPE", "mean_over_splits.f1", "F1 ('yes' positive), mean of adversarial/popular/random"),
        chance=yes_or_no, max_new_tokens=128,
        mirrors="lmms-eval pope (reply rule, per-split and pooled metrics; the headline averages the splits as "
                "LLaVA does)",
    )

    split: str = "all"
    reply_rule: str = "lmms_eval_strict"

    def __post_init__(self) -> None:
        self.check_option("split", ("all", *SPLITS))
        self.check_option("reply_rule", REPLY_RULES)

    def item(self, row: Row, item_id: str, by_index: Mapping[str, Any]) -> GenerationItem | None:
        splits = _splits_of(row)
        if self.split != "all" and self.split not in splits:
            return None
        answer = row.text("answer").strip().lower()
        if answer not in ("yes", "no"):
            raise row.bad_value("answer", "must be yes or no")
        return self.generation_item(item_id, build_prompt(row.text("question")), required_image(row, by_index),
                                    answer=answer, splits=list(splits), question_id=row.optional_text("question_id"))

    def unit_rows(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> UnitRows:
        """Per item: right (100/0), replied yes, replied no, gold yes, and its splits; the F1 per
        split is rebuilt from these counts, as ``score`` computes it."""
        replies = generated_replies(self.name, items, predictions)
        rows = []
        for item, reply in zip(items, replies):
            parsed, gold = parse_yes_no(reply, self.reply_rule), item.meta["answer"]
            rows.append([100.0 * (parsed == gold), parsed == "yes", parsed == "no", gold == "yes",
                         *(split in item.meta["splits"] for split in SPLITS)])
        return UnitRows({item.item_id: [item] for item in items}, np.array(rows, dtype=float), _mean_split_f1)

    def score(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        replies = generated_replies(self.name, items, predictions)
        parsed = [parse_yes_no(reply, self.reply_rule) for reply in replies]
        # An item listed under several splits (VLMEvalKit's comma-joined category) counts
        # once in each, as VLMEvalKit's explode does; "pooled" is over those (item, split) pairs.
        pairs = [(split, item.meta["answer"], p) for item, p in zip(items, parsed) for split in item.meta["splits"]]
        per_split = {}
        for split in SPLITS:
            chosen = [(g, p) for s, g, p in pairs if s == split]
            if chosen:
                per_split[split] = yes_no_metrics([g for g, _ in chosen], [p for _, p in chosen])
        metric_names = ("accuracy", "precision", "recall", "f1", "predicted_yes_share", "gold_yes_share")
        return {
            "per_split": per_split,
            "mean_over_splits": {m: mean([float(per_split[s][m]) for s in per_split]) for m in metric_names},
            "pooled": yes_no_metrics([g for _, g, _ in pairs], [p for _, _, p in pairs]),
            "unparsable_replies": sum(1 for p in parsed if p is None),
            "num_items": len(items),
            "scale": SCALE,
        }

    def details(self) -> dict[str, Any]:
        # Recorded in every result's settings and compared on reuse: a rewording would make every
        # earlier POPE result another variant. (Recall's misses are exact "no" replies under the
        # strict rule, any no-word under LLaVA's: yes_no_metrics.)
        return {
            "split": self.split,
            "prompt_template": build_prompt("{question.strip()}"),
            "reply_rule": self.reply_rule,
            "reply_rule_description": REPLY_RULES[self.reply_rule],
            "metrics": "accuracy, precision, recall, f1 with yes as positive; recall over all gold-yes items; "
            "predicted_yes_share = share of replies read as yes (lmms-eval's pope_yes_ratio is the gold share, a bug; "
            "we report it separately as gold_yes_share); pooled.accuracy is the other common headline",
        }
