"""OCRBench v1 (1,000 items): loader, bare-question prompt, substring scoring.

Owns: reading ``echo840/OCRBench`` parquet (answer is a list) or VLMEvalKit's
``OCRBench.tsv`` (answer is a Python-literal list string, type in ``category``), and the
community rule: right if any gold answer is a substring of the normalised prediction, with
the handwritten-maths (HME100k) normalisation that keeps case and drops all spaces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llava_norm.evaluation.benchmarks.base import (Declaration, GenerationItem, Headline, generated_replies, never,
                                                   register_benchmark)
from llava_norm.evaluation.benchmarks.tabular import Row, RowBenchmark, required_image

HMER = "Handwritten Mathematical Expression Recognition"
# Question types with their share of the 1,000 points; the first six form Text Recognition.
QUESTION_TYPE_CAPS = {
    "Regular Text Recognition": 50,
    "Irregular Text Recognition": 50,
    "Artistic Text Recognition": 50,
    "Handwriting Recognition": 50,
    "Digit String Recognition": 50,
    "Non-Semantic Text Recognition": 50,
    "Scene Text-centric VQA": 200,
    "Doc-oriented VQA": 200,
    "Key Information Extraction": 200,
    HMER: 100,
}
TEXT_RECOGNITION_TYPES = tuple(QUESTION_TYPE_CAPS)[:6]


def normalise_handwritten_math(text: str) -> str:
    """HME100k: strip, then remove every newline and space; case is kept (LaTeX is
    case-sensitive). Paper-era lmms-eval lowercased the prediction here, a bug fixed in #1278."""
    return text.strip().replace("\n", " ").replace(" ", "")


def normalise_text(text: str) -> str:
    """Every other source: lowercase, strip, newline -> space."""
    return text.lower().strip().replace("\n", " ")


def ocr_answer_correct(prediction: str, answers: Sequence[str], handwritten_math: bool) -> bool:
    normalise = normalise_handwritten_math if handwritten_math else normalise_text
    predicted = normalise(prediction)
    return any(normalise(answer) in predicted for answer in answers)


def build_prompt(question: str) -> str:
    """The bare question, stripped (lmms-eval ocrbench)."""
    return question.strip()


@register_benchmark
class OCRBench(RowBenchmark):
    declaration: ClassVar[Declaration] = Declaration(
        name="ocrbench", kind="generate",
        files=("OCRBench.tsv", "test-*.parquet", "**/test-*.parquet", "*.tsv", "*.parquet"),
        source="echo840/OCRBench split 'test' (parquet) or VLMEvalKit OCRBench.tsv",
        prompt=build_prompt, parser=ocr_answer_correct,
        headline=Headline("OCRBench", "accuracy", "share of items right (= final score / 10 on the full 1,000)"),
        chance=never, mirrors="lmms-eval ocrbench", max_new_tokens=128,
    )

    def item(self, row: Row, item_id: str, by_index: Mapping[str, Any]) -> GenerationItem:
        question_type_column = row.first_present("question_type", "category") or "question_type"
        question_type = row.text("question_type", "category")
        if question_type not in QUESTION_TYPE_CAPS:
            raise row.bad_value(question_type_column, f"must be one of the ten OCRBench question types {list(QUESTION_TYPE_CAPS)}")
        source = row.optional_text("dataset")
        image = required_image(row, by_index)
        answers = row.string_list("answer")
        if not answers or not all(answer.strip() for answer in answers):
            # a blank answer is a substring of every reply: the item would count as right whatever it said
            raise row.bad_value("answer", "must list at least one answer, none of them blank")
        return self.generation_item(
            item_id, build_prompt(row.text("question")), image,
            answers=answers,
            question_type=question_type,
            source=source,
            # HME100k is exactly the HMER type; the TSV has no source column, so VLMEvalKit
            # keys the rule on the type and lmms-eval on the source. Either marks it.
            handwritten_math=source == "HME100k" or question_type == HMER,
        )

    def score(self, items: Sequence[GenerationItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        replies = generated_replies(self.name, items, predictions)
        points = {question_type: 0 for question_type in QUESTION_TYPE_CAPS}
        counts = {question_type: 0 for question_type in QUESTION_TYPE_CAPS}
        for item, reply in zip(items, replies):
            counts[item.meta["question_type"]] += 1
            if ocr_answer_correct(reply, item.meta["answers"], item.meta["handwritten_math"]):
                points[item.meta["question_type"]] += 1
        final_score = sum(points.values())
        return {
            "final_score": final_score,
            "final_score_norm": final_score / 10,
            "accuracy": final_score / len(items) if items else 0.0,
            "text_recognition": sum(points[t] for t in TEXT_RECOGNITION_TYPES),
            "per_question_type": points,
            "items_per_question_type": counts,
            "num_items": len(items),
        }

    def details(self) -> dict[str, Any]:
        return {
            "prompt_template": "{question.strip()}",
            "scoring": "right if any gold answer is a substring of the prediction after normalisation",
            "normalisation": {
                "HME100k / HMER": "strip, remove newlines and spaces, keep case (fixed rule, lmms-eval >= #1278, VLMEvalKit)",
                "other": "lowercase, strip, newline -> space (no full-width folding; lmms-eval HEAD adds it, #1415)",
            },
            "final_score": "count out of 1000 on the full set; final_score_norm = /10 (0-100)",
        }
