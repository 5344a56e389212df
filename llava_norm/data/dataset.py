"""LLaVA-format supervised dataset: mixtures, row validation, lazy images, bad-sample policy.

Owns reading ``{id, image?, conversations: [{from: human|gpt, value}]}`` rows from JSON or
JSONL files (a mixture of them, each with an ``all`` / ``first:N`` / ``first:P%`` share),
checking each row's structure up front, and producing tokenised ``Example``s with images
loaded only when a sample is drawn. A bad sample is either an error naming its file and row
(``on_bad_sample: error``) or skipped and replaced by the next good row (``skip``), so
batches stay full and nothing is silently trained on with zero loss.

Every skip is a structured record, ``{"file", "row", "cause", "message"}`` with ``cause``
one of SKIP_CAUSES: rows dropped while loading are in ``SupervisedDataset.rejected``, samples
dropped when drawn (bad image, too long) in ``Example.skipped``, which collate passes on as
the batch's ``skipped_samples``. ``count_by_cause`` tallies either list for logging.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from torch.utils.data import Dataset

from llava_norm.config import DataSource, parse_take
from llava_norm.config_schema import LENGTH_ESTIMATES
from llava_norm.data.collate import Example
from llava_norm.data.conversation import IMAGE_PLACEHOLDER, ConversationTokenizer, conversation_tokenizer
from llava_norm.data.images import IMAGE_CAUSES, BadImageError
from llava_norm.data.prompts import PromptEncoder, PromptSettings, with_system

log = logging.getLogger(__name__)
ROLE_MAP = {"human": "user", "gpt": "assistant", "system": "system"}
MAX_REPLACEMENTS = 32
# The stable ``cause`` of a skip record; logs and skipped.jsonl count by these, so they are
# only ever added to, never renamed. The image_* ones come from data.images.IMAGE_CAUSES.
SKIP_CAUSES = (
    "file_not_utf8",  # a JSON file (row "*": the whole file) or a JSONL line that is not UTF-8
    "invalid_json",  # a JSON file that does not parse, or is not a list of rows (row "*")
    "invalid_jsonl_line",  # one JSONL line that does not parse (row "line N")
    "bad_conversation",  # not an object, no conversations list, a turn without a string value,
                         # an unknown role, no human turn first or no gpt turn
    "bad_image_field",  # 'image' is not one relative path (multi-image rows are not supported)
    "image_count_mismatch",  # '<image>' placeholders do not match the row's images
    "image_placeholder_misplaced",  # the '<image>' placeholder is not in the first human turn
    "empty_turn",  # a turn whose value is empty or whitespace
    "too_long",  # the first turn does not fit max_length (found when the sample is drawn)
    *IMAGE_CAUSES,  # missing, empty, unreadable, too large, truncated, corrupt image (when drawn)
)
WHOLE_FILE = "*"  # the ``row`` of a record that drops a whole file


class BadSampleError(ValueError):
    """A bad row (or file): the message names the file and row; ``file``, ``row`` and
    ``cause`` are the same facts as data, for the skip record."""

    def __init__(self, message: str, *, file: str = "", row: str = "", cause: str = "bad_conversation"):
        super().__init__(message)
        self.file, self.row, self.cause = str(file), str(row), cause

    def record(self) -> dict:
        return {"file": self.file, "row": self.row, "cause": self.cause, "message": str(self)}


def count_by_cause(records: list[dict]) -> dict[str, int]:
    """{cause: count} over skip records, most frequent first (ties by name), for the logs."""
    counts = Counter(record["cause"] for record in records)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


@dataclass
class Row:
    source: str  # file the row came from
    row_id: str
    messages: list[dict]
    image: Path | None
    length: int  # tokens (or words, see LENGTH_ESTIMATES) + image tokens, for length grouping


def read_entries(path: Path) -> list[tuple[int | None, object]]:
    """(JSONL line number or None, raw row) for each row of a JSON or JSONL file, in file
    order. A JSONL line that is not UTF-8 or not JSON is a BadSampleError in its place (so a
    ``first:N`` share still counts file positions, and skip drops just that line); a JSON file
    that cannot be read as a list of rows raises BadSampleError for the whole file."""
    data = path.read_bytes()
    if path.suffix == ".jsonl":
        # bytes.splitlines splits on \n and \r only: str.splitlines would also split inside
        # a row at a raw U+2028 or \x1c, which JSON strings may hold
        entries: list[tuple[int | None, object]] = []
        for line_no, line in enumerate(data.splitlines(), 1):
            where = dict(file=str(path), row=f"line {line_no}")
            try:
                text = line.decode("utf-8-sig" if line_no == 1 else "utf-8")  # a leading BOM is no error
            except UnicodeDecodeError as error:
                entries.append((line_no, BadSampleError(f"{path}: line {line_no}: not UTF-8 ({error.reason} at "
                                                        f"byte {error.start})", cause="file_not_utf8", **where)))
                continue
            if not text.strip():
                continue
            try:
                entries.append((line_no, json.loads(text)))
            except json.JSONDecodeError as error:
                entries.append((line_no, BadSampleError(f"{path}: line {line_no}: invalid JSON ({error.msg})",
                                                        cause="invalid_jsonl_line", **where)))
        return entries
    whole = dict(file=str(path), row=WHOLE_FILE)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise BadSampleError(f"{path}: not UTF-8 ({error.reason} at byte {error.start})",
                             cause="file_not_utf8", **whole) from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadSampleError(f"{path}: invalid JSON at line {error.lineno} ({error.msg})",
                             cause="invalid_json", **whole) from None
    if not isinstance(rows, list):
        raise BadSampleError(f"{path}: expected a JSON list of rows", cause="invalid_json", **whole)
    return [(None, raw) for raw in rows]


def read_rows_file(path: Path) -> list:
    """The raw rows of a JSON or JSONL file; BadSampleError at the first unreadable line."""
    rows = []
    for _, raw in read_entries(Path(path)):
        if isinstance(raw, BadSampleError):
            raise raw
        rows.append(raw)
    return rows


def parse_row(raw, source: Path, index: int, image_folder: str | None, tokens_per_image: int,
              line: int | None = None) -> Row:
    """Validate one LLaVA row; raises BadSampleError naming the file and row id (and the
    JSONL line, where there is one)."""
    row_id = str(raw.get("id", f"#{index}")) if isinstance(raw, dict) else f"#{index}"
    where = f"{source}: row {row_id}" + (f" (line {line})" if line is not None else "")

    def bad(message: str, cause: str = "bad_conversation") -> BadSampleError:
        return BadSampleError(f"{where}: {message}", file=str(source), row=row_id, cause=cause)

    if not isinstance(raw, dict):
        raise bad("row is not an object")
    turns = raw.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise bad("missing or empty 'conversations'")
    messages = []
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise bad(f"turn {t} needs a string 'value'")
        role = ROLE_MAP.get(turn.get("from"))
        if role is None:
            raise bad(f"turn {t} has unknown role {turn.get('from')!r} (expected human|gpt)")
        if not turn["value"].strip():  # an empty answer trains nothing; an empty question teaches the wrong thing
            raise bad(f"turn {t} ({turn['from']}) is empty", "empty_turn")
        messages.append({"role": role, "content": turn["value"]})
    dialogue = [m for m in messages if m["role"] != "system"]
    if not dialogue or dialogue[0]["role"] != "user" or not any(m["role"] == "assistant" for m in dialogue):
        raise bad("conversation must start with a human turn and have a gpt turn")
    n_placeholders = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages)
    image = raw.get("image")
    if image is not None and not isinstance(image, str):
        raise bad("'image' must be one relative path (multi-image rows are not supported)", "bad_image_field")
    if n_placeholders != (1 if image else 0):
        raise bad(f"{n_placeholders} '<image>' placeholders for {1 if image else 0} image(s)", "image_count_mismatch")
    if image and IMAGE_PLACEHOLDER not in dialogue[0]["content"]:
        raise bad("'<image>' must be in the first human turn", "image_placeholder_misplaced")
    image_path = Path(image_folder or source.parent) / image if image else None
    words = sum(len(m["content"].split()) for m in messages)
    return Row(str(source), row_id, messages, image_path, words + (tokens_per_image if image else 0))


def take_rows(rows: list, take: str, key: str) -> list:
    kind, amount = parse_take(take, key)
    if kind == "count":
        return rows[: int(amount)]
    if kind == "percent":
        return rows[: int(len(rows) * amount / 100)]
    return rows


class SupervisedDataset(Dataset):
    def __init__(self, mixture: list[DataSource], encoder: ConversationTokenizer, image_processor,
                 max_length: int, image_aspect: str = "resize", on_bad_sample: str = "skip",
                 length_estimate: str = "tokens", system_prompt: str | None = None):
        """``system_prompt``: a system turn for every row that has none of its own, the same
        one evaluation puts in its prompts (``data.system_prompt``); None keeps the template's.
        Samples are built by ``data.prompts.PromptEncoder``, the path evaluation and the
        diagnostics build their prompts with."""
        if length_estimate not in LENGTH_ESTIMATES:
            raise ValueError(f"data.length_estimate must be one of {LENGTH_ESTIMATES}, got {length_estimate!r}")
        self.encoder = encoder
        self.prompts = PromptEncoder(encoder, image_processor, system_prompt, image_aspect)
        self.image_processor = image_processor
        self.max_length = max_length
        self.image_aspect = image_aspect
        self.on_bad_sample = on_bad_sample
        self.length_estimate = length_estimate
        self.rows: list[Row] = []
        self.rejected: list[dict] = []  # skip records (see BadSampleError.record) of rows dropped at load time
        for i, source in enumerate(mixture):
            path = Path(source.path)
            try:
                entries = read_entries(path)
            except BadSampleError as error:  # the whole file is unreadable
                self.reject(error)
                continue
            for index, (line, raw) in enumerate(take_rows(entries, source.take, f"data.mixture[{i}].take")):
                try:
                    if isinstance(raw, BadSampleError):  # a JSONL line that could not be read
                        raise raw
                    row = parse_row(raw, path, index, source.image_folder, encoder.tokens_per_image, line)
                except BadSampleError as error:
                    self.reject(error)
                    continue
                row.messages = with_system(row.messages, system_prompt)  # counted in the row's length too
                self.rows.append(row)
        if self.rejected:
            log.warning("skipped %d bad rows at load time %s; first: %s", len(self.rejected),
                        count_by_cause(self.rejected), self.rejected[0]["message"])
        if not self.rows:
            first = f"; first rejection: {self.rejected[0]['message']}" if self.rejected else ""
            raise BadSampleError(f"no usable rows in {[s.path for s in mixture]}{first}", cause="no_usable_rows")

    @classmethod
    def from_settings(cls, mixture: list[DataSource], bundle, settings: PromptSettings, max_length: int,
                      **options) -> SupervisedDataset:
        """The dataset a run with these prompt settings trains on (``options``: on_bad_sample, length_estimate)."""
        return cls(mixture, conversation_tokenizer(bundle, settings.prompt_format, settings.template_kwargs),
                   bundle.image_processor, max_length, settings.image_aspect, system_prompt=settings.system_prompt,
                   **options)

    def reject(self, error: BadSampleError) -> None:
        if self.on_bad_sample == "error":
            raise error
        self.rejected.append(error.record())

    def __len__(self) -> int:
        return len(self.rows)

    @cached_property
    def modality_lengths(self) -> list[int]:
        """Positive for samples with an image, negative for text-only (the grouped sampler's convention).
        Token counts are taken here, on first use, so datasets that never meet the sampler
        (evaluation batches, analyses, benches) do not pay for them."""
        if self.length_estimate == "tokens":
            counts = self.encoder.count_tokens([row.messages for row in self.rows])
            for row, count in zip(self.rows, counts):
                row.length = min(count, self.max_length)  # longer rows are cut to max_length
        return [r.length if r.image else -r.length for r in self.rows]

    def build(self, row: Row) -> Example:
        where = dict(file=row.source, row=row.row_id)
        try:
            example = self.prompts.example(row.messages, [row.image] if row.image is not None else [],
                                           max_length=self.max_length, sample_id=row.row_id)
        except BadImageError as error:
            raise BadSampleError(f"{row.source}: row {row.row_id}: {error}", cause=error.cause, **where) from None
        if example is None:
            raise self.too_long(row)
        return example

    def too_long(self, row: Row, limit: str = "") -> BadSampleError:
        """The refusal of a row whose first turn does not fit (``limit``: the words for the bound)."""
        limit = limit or f"max_length={self.max_length}"
        return BadSampleError(f"{row.source}: row {row.row_id}: first turn does not fit {limit}", cause="too_long",
                              file=row.source, row=row.row_id)

    def draw(self, row: Row, skipped: list[dict]) -> Example | None:
        """``build(row)``, or under ``on_bad_sample: skip`` None with the skip record appended to ``skipped``."""
        try:
            return self.build(row)
        except BadSampleError as error:
            if self.on_bad_sample == "error":
                raise
            log.warning("skipping bad sample: %s", error)
            skipped.append(error.record())
            return None

    def __getitem__(self, index: int) -> Example:
        # A bad row is replaced by the next one in file order: the same index always gives the
        # same sample and the same skip records, so a resumed run skips exactly what the first did.
        skipped: list[dict] = []
        for attempt in range(MAX_REPLACEMENTS):
            example = self.draw(self.rows[(index + attempt) % len(self.rows)], skipped)
            if example is not None:
                example.skipped = skipped
                return example
        raise BadSampleError(f"{MAX_REPLACEMENTS} consecutive bad samples from index {index}; "
                             f"last: {skipped[-1]['message']}", cause="too_many_bad_samples")
