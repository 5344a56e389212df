"""LLaVA-format supervised dataset: mixtures, row validation, lazy images, bad-sample policy.

Owns reading ``{id, image?, conversations: [{from: human|gpt, value}]}`` rows from JSON or
JSONL files (a mixture of them, each with an ``all`` / ``first:N`` / ``first:P%`` share),
checking each row's structure up front, and producing tokenised ``Example``s with images
loaded only when a sample is drawn. A bad sample is either an error naming its file and row
id (``on_bad_sample: error``) or skipped, counted and replaced by the next good row, so
batches stay full and nothing is silently trained on with zero loss.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from torch.utils.data import Dataset

from llava_norm.config import DataSource, parse_take
from llava_norm.data.collate import Example
from llava_norm.data.conversation import IMAGE_PLACEHOLDER, ConversationTokenizer, truncate
from llava_norm.data.images import BadImageError, open_image, preprocess

log = logging.getLogger(__name__)
ROLE_MAP = {"human": "user", "gpt": "assistant", "system": "system"}
MAX_REPLACEMENTS = 32
# How the length-grouped sampler measures a row: "tokens" tokenises every row once, when the
# sampler first asks (batched calls; ~0.1 ms per row on one core), "words" counts whitespace words (free,
# but words per token vary between rows, which left 7% padding at per-device batch 16 in
# bench/padding.py against 0.3% with token counts).
LENGTH_ESTIMATES = ("tokens", "words")


class BadSampleError(ValueError):
    pass


@dataclass
class Row:
    source: str  # file the row came from
    row_id: str
    messages: list[dict]
    image: Path | None
    length: int  # tokens (or words, see LENGTH_ESTIMATES) + image tokens, for length grouping


def read_rows_file(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows = []
        for line_no, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise BadSampleError(f"{path}: line {line_no}: invalid JSON ({error.msg})") from None
        return rows
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadSampleError(f"{path}: invalid JSON at line {error.lineno} ({error.msg})") from None
    if not isinstance(rows, list):
        raise BadSampleError(f"{path}: expected a JSON list of rows")
    return rows


def parse_row(raw, source: Path, index: int, image_folder: str | None, tokens_per_image: int) -> Row:
    """Validate one LLaVA row; raises BadSampleError naming the file and row id."""
    row_id = str(raw.get("id", f"#{index}")) if isinstance(raw, dict) else f"#{index}"
    where = f"{source}: row {row_id}"
    if not isinstance(raw, dict):
        raise BadSampleError(f"{where}: row is not an object")
    turns = raw.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise BadSampleError(f"{where}: missing or empty 'conversations'")
    messages = []
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise BadSampleError(f"{where}: turn {t} needs a string 'value'")
        role = ROLE_MAP.get(turn.get("from"))
        if role is None:
            raise BadSampleError(f"{where}: turn {t} has unknown role {turn.get('from')!r} (expected human|gpt)")
        messages.append({"role": role, "content": turn["value"]})
    dialogue = [m for m in messages if m["role"] != "system"]
    if not dialogue or dialogue[0]["role"] != "user" or not any(m["role"] == "assistant" for m in dialogue):
        raise BadSampleError(f"{where}: conversation must start with a human turn and have a gpt turn")
    n_placeholders = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages)
    image = raw.get("image")
    if image is not None and not isinstance(image, str):
        raise BadSampleError(f"{where}: 'image' must be one relative path (multi-image rows are not supported)")
    if n_placeholders != (1 if image else 0):
        raise BadSampleError(f"{where}: {n_placeholders} '<image>' placeholders for {1 if image else 0} image(s)")
    if image and IMAGE_PLACEHOLDER not in dialogue[0]["content"]:
        raise BadSampleError(f"{where}: '<image>' must be in the first human turn")
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
        one evaluation puts in its prompts (``data.system_prompt``); None keeps the template's."""
        if length_estimate not in LENGTH_ESTIMATES:
            raise ValueError(f"data.length_estimate must be one of {LENGTH_ESTIMATES}, got {length_estimate!r}")
        self.encoder = encoder
        self.image_processor = image_processor
        self.max_length = max_length
        self.image_aspect = image_aspect
        self.on_bad_sample = on_bad_sample
        self.length_estimate = length_estimate
        self.rows: list[Row] = []
        self.rejected: list[str] = []  # messages for rows dropped at load time
        for i, source in enumerate(mixture):
            path = Path(source.path)
            raw_rows = take_rows(read_rows_file(path), source.take, f"data.mixture[{i}].take")
            for index, raw in enumerate(raw_rows):
                try:
                    row = parse_row(raw, path, index, source.image_folder, encoder.tokens_per_image)
                except BadSampleError as error:
                    if on_bad_sample == "error":
                        raise
                    self.rejected.append(str(error))
                    continue
                if system_prompt and not any(m["role"] == "system" for m in row.messages):
                    row.messages.insert(0, {"role": "system", "content": system_prompt})
                self.rows.append(row)
        if self.rejected:
            log.warning("skipped %d malformed rows at load time; first: %s", len(self.rejected), self.rejected[0])
        if not self.rows:
            raise BadSampleError(f"no usable rows in {[s.path for s in mixture]}")

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
        encoded = truncate(self.encoder.encode(row.messages), self.max_length)
        if encoded is None:
            raise BadSampleError(f"{row.source}: row {row.row_id}: first turn does not fit max_length={self.max_length}")
        pixels = None
        if row.image is not None:
            try:
                pixels = preprocess([open_image(row.image)], self.image_processor, self.image_aspect)
            except BadImageError as error:
                raise BadSampleError(f"{row.source}: row {row.row_id}: {error}") from None
        return Example(encoded.input_ids, encoded.labels, pixels, sample_id=row.row_id)

    def __getitem__(self, index: int) -> Example:
        skipped: list[str] = []
        for attempt in range(MAX_REPLACEMENTS):
            row = self.rows[(index + attempt) % len(self.rows)]
            try:
                example = self.build(row)
                example.skipped = skipped
                return example
            except BadSampleError as error:
                if self.on_bad_sample == "error":
                    raise
                log.warning("skipping bad sample: %s", error)
                skipped.append(str(error))
        raise BadSampleError(f"{MAX_REPLACEMENTS} consecutive bad samples from index {index}; last: {skipped[-1]}")
