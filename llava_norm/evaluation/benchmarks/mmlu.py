"""MMLU (57 subjects, test 14,042; text only): lm-eval prompt with 0..5 dev-split shots.

Owns: reading cais/mmlu parquet (``all/`` or per-subject directories, also
hails/mmlu_no_train) and the original hendrycks CSVs (``data/test/*_test.csv``,
headerless), building lm-eval's prompt (description, first-n dev shots, question,
"Answer:") with continuations " A".." D", and accuracy: micro over all questions (lm-eval's
size-weighted ``mmlu``), macro over subjects (the old hendrycksTest number), per subject.
Also lm-eval's ``mmlu_continuation`` formulation (``formulation="continuation"``): no options
in the prompt, each answer text scored as the continuation of "Question: ..\nAnswer:"; it
separates knowing an answer from mapping it to a letter, which small models fail first.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from llava_norm.evaluation.benchmarks.base import (Benchmark, Declaration, Headline, LoglikelihoodItem, SCALE, accuracy,
                                                   check_limit, continuation_logprobs, first_argmax, mean,
                                                   one_of_the_choices, picked_gold, register_benchmark)
from llava_norm.evaluation.benchmarks.mcq import LETTERS, grouped_accuracy
from llava_norm.evaluation.benchmarks.tabular import Row, read_rows, resolve_files

CONTINUATIONS = [f" {letter}" for letter in LETTERS[:4]]  # lm-eval's " A".." D"
MAX_SHOTS = 5  # the dev split holds 5 questions per subject


@dataclass(frozen=True)
class MMLUQuestion:
    subject: str
    question: str
    choices: list[str]
    answer: int  # 0-3


def question_block(q: MMLUQuestion) -> str:
    """lm-eval doc_to_text: the question is stripped, the choices are not."""
    lines = [q.question.strip()] + [f"{LETTERS[i]}. {choice}" for i, choice in enumerate(q.choices)]
    return "\n".join(lines) + "\nAnswer:"


def build_context(q: MMLUQuestion, shots: Sequence[MMLUQuestion]) -> str:
    description = f"The following are multiple choice questions (with answers) about {q.subject.replace('_', ' ')}.\n\n"
    examples = "".join(f"{question_block(shot)} {LETTERS[shot.answer]}\n\n" for shot in shots)
    return description + examples + question_block(q)


def continuation_block(q: MMLUQuestion) -> str:
    """lm-eval mmlu_continuation doc_to_text."""
    return f"Question: {q.question.strip()}\nAnswer:"


def build_continuation_context(q: MMLUQuestion, shots: Sequence[MMLUQuestion]) -> str:
    description = f"The following are questions (with answers) about {q.subject.replace('_', ' ')}.\n\n"
    examples = "".join(f"{continuation_block(shot)} {shot.choices[shot.answer]}\n\n" for shot in shots)
    return description + examples + continuation_block(q)


def _hendrycks_csv(path: Path) -> bool:
    """The original release's CSVs have no header row: the first line is already a question."""
    if path.suffix.lower() != ".csv":
        return False
    with path.open(encoding="utf-8", newline="") as handle:
        first_row = next(csv.reader(handle), [])
    return not {"question", "answer"} <= {cell.strip().lower() for cell in first_row}


def _question(row: Row) -> MMLUQuestion:
    if _hendrycks_csv(row.source):
        # headerless: question, A, B, C, D, answer letter; the subject is in the file name
        subject = row.source.stem.rsplit("_", 1)[0]
        question, choices, answer = row.text("0"), [row.text_allow_empty(str(i)) for i in range(1, 5)], row.text("5").strip()
        answer_column = "5"
    else:
        subject, question, choices = row.text("subject"), row.text("question"), row.string_list("choices")
        answer, answer_column = str(row.require("answer")).strip(), "answer"
    if len(choices) != 4:
        raise row.bad_value("choices", "must hold 4 choices")
    if answer.isdigit() and int(answer) < 4:
        index = int(answer)
    elif answer.upper() in LETTERS[:4]:
        index = LETTERS.index(answer.upper())
    else:
        raise row.bad_value(answer_column, "must be 0-3 or A-D")
    return MMLUQuestion(subject=subject, question=question, choices=choices, answer=index)


def _questions(path: Path, split: str) -> list[MMLUQuestion]:
    """All questions of ``split`` ("test" or "dev") that ``path`` (file or directory) holds.
    Every layout names its dev files as its test files with "dev" for "test"."""
    patterns = [pattern.replace("test", split) for pattern in MMLU.declaration.files]
    files = resolve_files(path, patterns, f"MMLU {split}")
    # hendrycks CSVs have no header row; every other layout has one
    rows = [row for f in files for row in read_rows([f], csv_header=not _hendrycks_csv(f))]
    return [_question(row) for row in rows]


FORMULATIONS = {"letters": build_context, "continuation": build_continuation_context}


@register_benchmark
class MMLU(Benchmark):
    """Options: ``num_fewshot`` 0 (lm-eval default) .. 5 (classic); ``dev_path`` for the dev
    split when ``load`` gets a single test file rather than a directory; ``formulation``
    ``letters`` (lm-eval ``mmlu``, the paper's) or ``continuation`` (lm-eval ``mmlu_continuation``)."""

    declaration: ClassVar[Declaration] = Declaration(
        name="mmlu", kind="loglikelihood",
        # test splits, one glob per layout; the dev split is found by "dev" for "test"
        files=("all/test-*.parquet", "test-*.parquet", "*/test-*.parquet", "data/test/*_test.csv",
               "test/*_test.csv", "*_test.csv"),
        source="cais/mmlu config 'all' split 'test' (shots: split 'dev'), or hendrycks data/test/*_test.csv + data/dev/*_dev.csv",
        prompt=build_context, parser=first_argmax,
        headline=Headline("MMLU", "acc", "micro-averaged accuracy"),
        chance=one_of_the_choices, mirrors="lm-eval mmlu (formulation='continuation': mmlu_continuation)",
    )

    num_fewshot: int = 0
    dev_path: str | None = None
    formulation: str = "letters"

    def __post_init__(self) -> None:
        if not isinstance(self.num_fewshot, int) or not 0 <= self.num_fewshot <= MAX_SHOTS:
            raise ValueError(f"mmlu: num_fewshot must be an int in 0..{MAX_SHOTS}, got {self.num_fewshot!r}")
        self.check_option("formulation", FORMULATIONS)

    def load(self, path: str | Path, limit: int | None = None) -> list[LoglikelihoodItem]:
        """Items in file order (subjects alphabetical in the official files); ``limit`` keeps
        the first ``limit`` test questions."""
        check_limit(limit)
        path = Path(path)
        test = _questions(path, "test")[:limit]
        shots = self._shots(path, {q.subject for q in test}) if self.num_fewshot else {}
        items, seen_per_subject = [], defaultdict(int)
        for q in test:
            position = seen_per_subject[q.subject]
            seen_per_subject[q.subject] += 1
            items.append(
                LoglikelihoodItem(
                    benchmark=self.name,
                    item_id=f"{q.subject}#{position}",
                    context=FORMULATIONS[self.formulation](q, shots.get(q.subject, [])),
                    continuations=(list(CONTINUATIONS) if self.formulation == "letters"
                                   else [f" {choice}" for choice in q.choices]),
                    gold=q.answer,
                    # lm-eval's acc_norm divides by the choice's length, without the leading space
                    meta={"subject": q.subject, "choice_lengths": [len(choice) for choice in q.choices]},
                )
            )
        return items

    def _shots(self, test_path: Path, subjects: set[str]) -> dict[str, list[MMLUQuestion]]:
        if self.dev_path is not None:
            dev_source = Path(self.dev_path)
        elif test_path.is_dir():
            dev_source = test_path
        else:
            raise ValueError(f"mmlu: num_fewshot={self.num_fewshot} needs the dev split; pass a directory or dev_path= (got the single file {test_path})")
        by_subject: dict[str, list[MMLUQuestion]] = defaultdict(list)
        for q in _questions(dev_source, "dev"):
            by_subject[q.subject].append(q)  # file order = lm-eval's first_n sampler
        short = sorted(s for s in subjects if len(by_subject[s]) < self.num_fewshot)
        if short:
            raise ValueError(f"mmlu: dev split in {dev_source} has fewer than {self.num_fewshot} questions for subject(s) {short}")
        return {s: by_subject[s][: self.num_fewshot] for s in subjects}

    def score(self, items: Sequence[LoglikelihoodItem], predictions: Mapping[str, Any]) -> dict[str, Any]:
        logprobs = continuation_logprobs(self.name, items, predictions)
        correct = picked_gold(items, logprobs)
        per_subject = grouped_accuracy((item.meta["subject"] for item in items), correct)
        metrics = {
            "acc": accuracy(correct),
            "acc_macro_subjects": mean(list(per_subject.values())),
            "per_subject": per_subject,
            "num_items": len(items),
            "num_fewshot": self.num_fewshot,
            "formulation": self.formulation,
            "scale": SCALE,
        }
        if self.formulation == "continuation":  # answer texts differ in length: lm-eval's acc_norm too
            metrics["acc_norm"] = accuracy(picked_gold(items, logprobs, per_char=True))
        return metrics

    def details(self) -> dict[str, Any]:
        letters = self.formulation == "letters"
        return {
            "formulation": self.formulation + (" (lm-eval mmlu)" if letters else " (lm-eval mmlu_continuation)"),
            "num_fewshot": self.num_fewshot,
            "fewshot_split": "dev",
            "fewshot_sampler": "first_n (dev file order, same subject)",
            "prompt_template": (
                "The following are multiple choice questions (with answers) about {subject with _ -> space}.\n\n"
                "[{shot question}\nA. ..\nB. ..\nC. ..\nD. ..\nAnswer: {letter}\n\n]*"
                "{question.strip()}\nA. ..\nB. ..\nC. ..\nD. ..\nAnswer:" if letters else
                "The following are questions (with answers) about {subject with _ -> space}.\n\n"
                "[Question: {shot question.strip()}\nAnswer: {shot answer text}\n\n]*Question: {question.strip()}\nAnswer:"),
            "continuations": CONTINUATIONS if letters else "' ' + each choice text",
            "scoring": ("acc = argmax of summed log-prob over ' A'..' D' (lm-eval)" if letters else
                        "acc = argmax of summed log-prob of the choice texts; acc_norm = of log-prob / characters "
                        "(lm-eval; an empty choice: numpy's quotient)"),
            "aggregation": "acc = micro over all questions (lm-eval group 'mmlu', weight_by_size); acc_macro_subjects = mean of subject accuracies",
        }
