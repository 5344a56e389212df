"""The rules a training row must follow, and the records of the rows that break them.

Owns reading raw rows out of LLaVA JSON / JSONL files (a line that is not UTF-8 or not JSON
is a bad row in its place, not the end of the file), checking one row ``{id, image?,
conversations: [{from: human|gpt, value}]}`` whatever file format it came from, and
``BadSampleError``: the refusal that names the file and row, and becomes a skip record
``{"file", "row", "cause", "message"}`` with ``cause`` one of ``SKIP_CAUSES``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from llava_norm.data.conversation import IMAGE_PLACEHOLDER
from llava_norm.data.images import IMAGE_CAUSES

# user/assistant are what chat exports (and some LLaVA-NeXT sources) write for human/gpt.
ROLE_MAP = {"human": "user", "gpt": "assistant", "system": "system", "user": "user", "assistant": "assistant"}
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
    "shard_unreadable",  # a parquet shard that cannot be opened or read (row "*", or its row group)
    "bad_columns",  # a parquet shard without the hub layout's columns (row "*")
    "rows_missing",  # a hub dataset's shards hold fewer rows than its card says (row "*": a partial download)
    "no_rows",  # a file or shard that holds no rows at all (row "*": an empty list, an empty or blank file)
)
WHOLE_FILE = "*"  # the ``row`` of a record that drops a whole file
# data.image_placement (config_schema.IMAGE_PLACEMENTS): "front" moves a row's '<image>' to the
# start of its turn, followed by a newline, as LLaVA-1.5's and LLaVA-NeXT's preprocess_multimodal
# do (some LLaVA-665K rows end in "...?\n<image>", while every evaluation prompt starts
# "<image>\n"); "keep" leaves it in place.
# What the row rules changed in a row they kept (counted at load, never a skip): LLaVA's own
# adjustments, so the same rows train the same way here.
ADJUSTMENTS = ("first_gpt_turn_dropped", "image_moved_to_front")


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
class CheckedRow:
    """A row that follows the rules: its id, its messages (roles user/assistant/system) and
    its image field (a relative path, or whatever the file format uses to say "embedded")."""
    row_id: str
    messages: list[dict]
    image: str | None
    adjustments: tuple[str, ...] = ()  # entries of ADJUSTMENTS

    @property
    def words(self) -> int:
        return sum(len(m["content"].split()) for m in self.messages)


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
                entries.append((line_no, BadSampleError(f"{path}: line {line_no}: invalid JSON at column {error.colno} "
                                                        f"({error.msg})", cause="invalid_jsonl_line", **where)))
        if not entries:
            raise no_rows(path)
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
        raise BadSampleError(f"{path}: invalid JSON at line {error.lineno}, column {error.colno}, character "
                             f"{error.pos} ({error.msg})", cause="invalid_json", **whole) from None
    if not isinstance(rows, list):
        raise BadSampleError(f"{path}: expected a JSON list of rows", cause="invalid_json", **whole)
    if not rows:
        raise no_rows(path)
    return [(None, raw) for raw in rows]


def no_rows(path: Path) -> BadSampleError:
    """A data file or shard without a single row: its whole file dropped, said as such (an empty
    source would otherwise end the index build in ``datasets``' own error, naming no file)."""
    return BadSampleError(f"{path}: holds no rows (an empty file or list?)", cause="no_rows", file=str(path),
                          row=WHOLE_FILE)


def read_rows_file(path: Path) -> list:
    """The raw rows of a JSON or JSONL file; BadSampleError at the first unreadable line."""
    rows = []
    for _, raw in read_entries(Path(path)):
        if isinstance(raw, BadSampleError):
            raise raw
        rows.append(raw)
    return rows


def check_row(raw, source: str, index: int, position: str | None = None, image_placement: str = "front",
              format_problem=None) -> CheckedRow:
    """Validate one LLaVA row; raises BadSampleError naming the file and row id (and its
    position in the file, a JSONL line or a parquet row, where the format has one). As LLaVA's
    training code does, a first turn from gpt is dropped (that turn only) and, with
    ``image_placement`` "front", the '<image>' moves to the front of its turn. ``format_problem``:
    the prompt format's own rule (its ``row_problem``), applied last, as the row index and the
    launch check both need it."""
    row_id = str(raw["id"]) if isinstance(raw, dict) and raw.get("id") is not None else f"#{index}"
    where = f"{source}: row {row_id}" + (f" ({position})" if position else "")

    def bad(message: str, cause: str = "bad_conversation") -> BadSampleError:
        return BadSampleError(f"{where}: {message}", file=str(source), row=row_id, cause=cause)

    if not isinstance(raw, dict):
        raise bad("row is not an object")
    turns = raw.get("conversations")
    if not isinstance(turns, list) or not turns:
        near = [k for k in raw if k != "conversations" and k.lower().startswith("conversation")]
        raise bad("missing or empty 'conversations'" + (f" (it has {near[0]!r})" if near else ""))
    messages = []
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise bad(f"turn {t} needs a string 'value'")
        role = ROLE_MAP.get(turn.get("from"))
        if role is None:
            raise bad(f"turn {t} has unknown role {turn.get('from')!r} (expected one of {'|'.join(ROLE_MAP)})")
        if not turn["value"].strip():  # an empty answer trains nothing; an empty question teaches the wrong thing
            raise bad(f"turn {t} ({turn['from']}) is empty", "empty_turn")
        try:  # JSON's \ud800 escapes parse to lone surrogates, which no tokenizer takes
            turn["value"].encode("utf-8")
        except UnicodeEncodeError as error:
            raise bad(f"turn {t} ({turn['from']}) holds {turn['value'][error.start]!r} at character {error.start}, "
                      "half of a surrogate pair: not text any tokenizer reads") from None
        messages.append({"role": role, "content": turn["value"]})
    adjustments = []
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), None)
    if first is not None and messages[first]["role"] == "assistant":  # LLaVA drops it: a reply to nothing
        messages = messages[:first] + messages[first + 1:]
        adjustments.append("first_gpt_turn_dropped")
    dialogue = [m for m in messages if m["role"] != "system"]
    if not dialogue or dialogue[0]["role"] != "user" or not any(m["role"] == "assistant" for m in dialogue):
        raise bad("conversation must start with a human turn (after a first gpt turn, which is dropped) and have "
                  "a gpt turn")
    n_placeholders = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages)
    image = raw.get("image")
    if image is not None and not isinstance(image, str):
        raise bad("'image' must be one relative path (multi-image rows are not supported)", "bad_image_field")
    if n_placeholders != (1 if image else 0):
        raise bad(f"{n_placeholders} '<image>' placeholders for {1 if image else 0} image(s)", "image_count_mismatch")
    if image and IMAGE_PLACEHOLDER not in dialogue[0]["content"]:
        raise bad("'<image>' must be in the first human turn", "image_placeholder_misplaced")
    if image and image_placement == "front":
        turn = dialogue[0]
        moved = IMAGE_PLACEHOLDER + "\n" + turn["content"].replace(IMAGE_PLACEHOLDER, "").strip()
        if moved != turn["content"]:
            messages = [{**m, "content": moved} if m is turn else m for m in messages]
            adjustments.append("image_moved_to_front")
    problem = format_problem and format_problem(messages)
    if problem:  # a row the prompt format cannot encode: bad like any other, not an index build's crash
        raise bad(problem)
    return CheckedRow(row_id, messages, image or None, tuple(adjustments))
