"""Multiple-choice helpers shared by the MCQ benchmarks.

Owns: reading a row's options (list column or A/B/C/... columns) and its gold letter,
formatting "A. ..\\nB. .." option blocks, every reply -> letter rule the community scorers
use (one place, so no benchmark grows its own variant), scoring replies with a benchmark's
declared letter rule, and grouped accuracy.
"""

from __future__ import annotations

import re
import string
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence

from llava_norm.evaluation.benchmarks.base import Benchmark, GenerationItem, generated_replies, mean
from llava_norm.evaluation.benchmarks.tabular import Row

LETTERS = string.ascii_uppercase
ANSWER_WITH_LETTER = "Answer with the option's letter from the given choices directly."


def options_from_row(row: Row, list_columns: Sequence[str] = ("options", "choices"), max_letters: int = 5) -> dict[str, str]:
    """Letter -> option text.

    HF layouts store a list column (options/choices); VLMEvalKit TSVs store one column per
    letter, with empty cells for options a question does not have. Only present options are
    kept, in letter order.
    """
    list_column = row.first_present(*list_columns)
    if list_column is not None:
        texts = row.string_list(list_column)
        if len(texts) > len(LETTERS):
            raise row.bad_value(list_column, f"has more than {len(LETTERS)} options")
        return {LETTERS[i]: text for i, text in enumerate(texts)}
    options = {letter: str(row.values[letter]) for letter in LETTERS[:max_letters] if row.has(letter)}
    if not options:
        names = ", ".join(repr(c) for c in list_columns)
        raise ValueError(f"{row.where}: no options: neither a list column ({names}) nor letter columns 'A', 'B', ...")
    return options


def gold_letter(row: Row, options: Mapping[str, str], column: str = "answer") -> str:
    """The gold answer as a letter; accepts a letter or a 0-based index (HF layouts)."""
    value = str(row.require(column)).strip()
    if value.isdigit():
        position = int(value)
        if position >= len(options):
            raise row.bad_value(column, f"index is out of range for {len(options)} options")
        return LETTERS[position]
    letter = value.upper()
    if letter not in options:
        raise row.bad_value(column, f"must be one of {sorted(options)} or an option index")
    return letter


def format_options(options: Mapping[str, str]) -> str:
    """"A. text\\nB. text" in letter order."""
    return "\n".join(f"{letter}. {text}" for letter, text in options.items())


# ----------------------------------------------------------------------------------------
# reply -> letter rules


_OPTION_TOKEN_PUNCTUATION = str.maketrans({c: " " for c in ".()[],:;!*#{}"})


# VLMEvalKit's can_infer (vlmeval/utils/matching_util.py at e8e78f0): replies it reads as "no option"
# (its letter Z) before any letter or text is looked for.
_REFUSALS = ("Sorry, I can't help with images of people yet.", "I can't process this file.",
             "I'm sorry, but without the image provided", "Cannot determine the answer")
# Its "answer is X" fallback (#1552): case-insensitive, so "the answer is a cat" reads as A.
_ANSWER_IS = re.compile(r"(?:correct\s+)?answer\s+is\s+\**([ABCD])\**", re.IGNORECASE)


def infer_option_letter(reply: str, options: Mapping[str, str]) -> str | None:
    """VLMEvalKit's rule-based ``can_infer`` (the rule its ``exact_matching`` judge uses), as of
    its commit e8e78f0.

    1. A reply holding one of its refusal phrases, or no option letter but a lone token "Z",
       is read as no option (VLMEvalKit's "Z"): ``None``, before any text is looked at.
    2. Blank out ``.()[],:;!*#{}`` and split on whitespace. If exactly one option letter is a
       whole token ("B", "B.", "(B)", "B:", ...) and its first place is among the last four
       tokens, that is the answer (since #1175).
    3. Otherwise, "answer is X" / "correct answer is **X**" (any case; X in A-D) gives X.
    4. Otherwise, if the reply is at most twice as long as all option texts together (#1175)
       and the text of exactly one option occurs in it (case-insensitive), that is the answer.
    5. Otherwise the reply is unparsable: ``None`` (scored wrong; no LLM judge here).

    Not taken over: the text of a judge's failed API call, which no model reply here holds,
    and the article check VLMEvalKit makes only with ``VERBOSE`` set.
    """
    if any(refusal in reply for refusal in _REFUSALS):
        return None
    tokens = reply.translate(_OPTION_TOKEN_PUNCTUATION).split()
    letters = [letter for letter in options if letter in tokens]
    if len(letters) == 1 and tokens.index(letters[0]) > len(tokens) - 5:
        return letters[0]
    if not letters and "Z" in tokens:
        return None
    said = _ANSWER_IS.search(reply)
    if said and said.group(1).upper() in options:
        return said.group(1).upper()
    lowered = reply.lower()
    if len(lowered) > 2 * sum(len(str(text)) for text in options.values()):
        return None
    by_text = [letter for letter, text in options.items() if str(text).lower() in lowered]
    return by_text[0] if len(by_text) == 1 else None


_LEADING_LETTER_DOT = re.compile(r"^\s*([A-Z])\.")


def leading_letter_dot(reply: str) -> str:
    """lmms-eval AI2D filter: the letter of a reply starting "X.", else the reply unchanged."""
    match = _LEADING_LETTER_DOT.match(reply)
    return match.group(1) if match else reply


def normalised_for_exact_match(text: str) -> str:
    """lmms-eval ``exact_match`` with ignore_case and ignore_punctuation (plus a strip)."""
    return text.strip().lower().translate(str.maketrans("", "", string.punctuation))


def first_character(reply: str) -> str:
    """lmms-eval SEED-Bench rule: the first character of the stripped reply ("" if empty)."""
    return reply.strip()[:1]


def ai2d_reply_correct(reply: str, letter: str) -> bool:
    """lmms-eval AI2D rule: the "X." filter, then exact match ignoring case and punctuation."""
    return normalised_for_exact_match(leading_letter_dot(reply)) == normalised_for_exact_match(letter)


def seedbench_reply_correct(reply: str, letter: str) -> bool:
    """lmms-eval SEED-Bench rule: the reply's first character is the letter, in any case."""
    return first_character(reply).lower() == letter.lower()


def scienceqa_reply_correct(reply: str, letter: str) -> bool:
    """lmms-eval ScienceQA rule: the stripped reply equals the letter (any case), or it
    starts ``^[A-Z]\\.`` with the right letter. Anything else is wrong."""
    stripped = reply.strip()
    if stripped.lower() == letter.lower():
        return True
    return bool(re.match(r"[A-Z]\.", stripped)) and stripped[0] == letter.upper()


def mmstar_paper_era_correct(reply: str, letter: str) -> bool:
    """lmms-eval MMStar rule until commit #1274 (2026-04-11): lowercase, then right if the
    first character is the letter, or the reply starts "(x", "option x" or "the answer is x"."""
    answer = letter.lower().replace("\n", " ").strip()
    predicted = reply.lower().replace("\n", " ").strip()
    for prefix in ("", "(", "option ", "the answer is "):
        if predicted.startswith(prefix) and predicted[len(prefix): len(prefix) + 1] == answer:
            return True
    return False


def letters_right(bench: Benchmark, items: Sequence[GenerationItem], predictions: Mapping[str, str]) -> list[bool]:
    """Whether each reply gives the item's gold letter (``meta["answer"]``), as the benchmark's
    declared parser, ``parser(reply, letter) -> bool``, reads it."""
    replies = generated_replies(bench.name, items, predictions)
    return [bench.declaration.parser(reply, item.meta["answer"]) for item, reply in zip(items, replies)]


# ----------------------------------------------------------------------------------------
# aggregation


def grouped_accuracy(keys: Iterable[Hashable], correct: Iterable[bool]) -> dict[str, float]:
    """Accuracy per group key, keys sorted for stable output."""
    hits: dict[Hashable, list[float]] = defaultdict(list)
    for key, ok in zip(keys, correct, strict=True):
        hits[key].append(float(ok))
    return {str(key): mean(hits[key]) for key in sorted(hits, key=str)}


def grouped_counts(keys: Iterable[Hashable]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for key in keys:
        counts[str(key)] += 1
    return dict(sorted(counts.items()))
