"""Reading benchmark files: which files a path means, their rows, cells and images.

Owns: resolving a file-or-directory argument against a benchmark's accepted file globs,
reading TSV (VLMEvalKit), CSV, parquet (HF datasets / lmms-eval), JSON and JSONL into
``Row`` objects whose accessors raise a ``ValueError`` naming the file, the row and the
column, turning image cells (HF ``{"bytes", "path"}`` dicts, raw bytes, VLMEvalKit base64
with its by-index references) into ``EncodedImage``, choosing stable item ids, and
``RowBenchmark``: the load loop of every benchmark whose items are the rows of its files.
"""

from __future__ import annotations

import ast
import base64
import binascii
import io
import json
import math
import re
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pyarrow.parquet as pq
from PIL import Image

from llava_norm.evaluation.benchmarks.base import Benchmark, EncodedImage, GenerationItem, Item, check_limit

TABLE_SUFFIXES = (".tsv", ".csv", ".parquet", ".jsonl", ".json")
INDEX_REFERENCE_MAX = 64  # VLMEvalKit: an image cell this short is the index of another row, not base64


def is_missing(value: Any) -> bool:
    """None, NaN, or a blank / "nan" string (how TSVs and pandas spell an empty cell)."""
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and value.strip().lower() in ("", "nan")


@dataclass(frozen=True)
class Row:
    """One record of a benchmark file, with accessors that fail with a precise message."""

    source: Path
    number: int  # 0-based position among the file's data rows (header excluded)
    values: Mapping[str, Any]

    @property
    def where(self) -> str:
        index = self.values.get("index")
        suffix = f" (index {index})" if index is not None and not is_missing(index) else ""
        return f"{self.source}: row {self.number}{suffix}"

    def has(self, column: str) -> bool:
        return column in self.values and not is_missing(self.values[column])

    def first_present(self, *columns: str) -> str | None:
        """Name of the first of ``columns`` this row has a value for."""
        return next((c for c in columns if self.has(c)), None)

    def get(self, *columns: str) -> Any:
        """Value of the first present column among the aliases, or None."""
        column = self.first_present(*columns)
        return None if column is None else self.values[column]

    def require(self, *columns: str) -> Any:
        column = self.first_present(*columns)
        if column is None:
            raise ValueError(self.missing(*columns))
        return self.values[column]

    def missing(self, *columns: str) -> str:
        """What to say of columns none of which has a value here: absent (a file without that
        column, or a JSONL record without that key: the row's columns are listed) or empty."""
        names = " or ".join(repr(c) for c in columns)
        if not any(c in self.values for c in columns):
            return f"{self.where}: no column {names} (its columns: {', '.join(map(repr, self.values))})"
        return f"{self.where}: missing or empty column {names}"

    def text(self, *columns: str) -> str:
        return str(self.require(*columns))

    def text_allow_empty(self, column: str) -> str:
        """A text column that must exist but may be empty (e.g. HellaSwag's ctx_b)."""
        if column not in self.values:
            raise ValueError(f"{self.where}: missing column {column!r}")
        return "" if is_missing(self.values[column]) else str(self.values[column])

    def optional_text(self, *columns: str) -> str | None:
        value = self.get(*columns)
        return None if value is None else str(value)

    def integer(self, *columns: str) -> int:
        value = self.require(*columns)
        try:
            number = int(str(value).strip())
        except ValueError:
            raise ValueError(f"{self.where}: column {columns[0]!r} must be an integer, got {value!r}") from None
        return number

    def string_list(self, *columns: str) -> list[str]:
        """A list-of-strings cell: a real list (parquet/JSON) or a Python-literal list string
        (VLMEvalKit TSV). Parsed with ``ast.literal_eval``, never ``eval``."""
        value = self.require(*columns)
        if isinstance(value, str):
            stripped = value.strip()
            if not stripped.startswith("["):
                return [value]
            try:
                value = ast.literal_eval(stripped)
            except (ValueError, SyntaxError) as exc:
                raise ValueError(f"{self.where}: column {columns[0]!r} is not a Python list literal: {exc}") from None
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, (str, int, float)) for v in value):
            raise ValueError(f"{self.where}: column {columns[0]!r} must be a list of strings, got {value!r}")
        return [str(v) for v in value]

    def bad_value(self, column: str, problem: str) -> ValueError:
        return ValueError(f"{self.where}: column {column!r} {problem}, got {self.values.get(column)!r}")


def resolve_files(path: str | Path, patterns: Sequence[str], what: str) -> list[Path]:
    """The data files ``path`` stands for.

    A file is used as given. For a directory, ``patterns`` (globs relative to it) are tried
    in order and the first one that matches wins, so a full hub snapshot that also holds
    other configs or splits does not get mixed in.
    """
    path = Path(path)
    if path.is_file():
        if path.suffix.lower() not in TABLE_SUFFIXES:
            raise ValueError(f"{path}: unsupported file type for {what}; expected one of {TABLE_SUFFIXES}")
        return [path]
    if not path.is_dir():
        raise ValueError(f"{path}: no such file or directory (expected {what} data)")
    named = [p for p in patterns if p.lower().endswith(".tsv") and not set(p) & set("*?[")]  # VLMEvalKit's names
    for pattern in patterns:
        found = sorted(p for p in path.glob(pattern) if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES)
        tsvs = [p.name for p in found if p.suffix.lower() == ".tsv"]
        if len(tsvs) > 1:  # VLMEvalKit keeps one file per benchmark; siblings (_MINI, _V11, ...) are other sets
            raise ValueError(f"{path}: {len(tsvs)} TSV files match {pattern!r} ({', '.join(tsvs)}), each a benchmark "
                             f"file of its own: give the path of the {what} one")
        siblings = [n for n in tsvs if pattern not in named and any(n.startswith(e[:-4] + "_") for e in named)]
        if siblings:  # found by a catch-all glob, named as another set of the same benchmark
            raise ValueError(f"{path}: {siblings[0]} is another VLMEvalKit set than {' or '.join(named)}, not read "
                             f"as {what} by a folder's globs; give the file's own path to read it as {what}")
        if found:
            return found
    raise ValueError(f"{path}: no {what} data file found; looked for {list(patterns)}")


def read_rows(paths: Iterable[Path], csv_header: bool = True) -> list[Row]:
    rows: list[Row] = []
    for path in paths:
        records = _read_records(path, csv_header)
        rows.extend(Row(path, number, record) for number, record in enumerate(records))
    return rows


def _read_records(path: Path, csv_header: bool) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    try:
        if suffix in (".tsv", ".csv"):
            # Everything as text, and only truly empty cells are missing: pandas' default NA
            # list would turn an option reading "None" or "NA" into a missing option.
            frame = pd.read_csv(
                path,
                sep="\t" if suffix == ".tsv" else ",",
                dtype=str,
                keep_default_na=False,
                header=0 if csv_header else None,
            )
            if not csv_header:
                frame.columns = [str(c) for c in frame.columns]
            return frame.to_dict("records")
        if suffix == ".parquet":
            return pq.read_table(path).to_pylist()
        if suffix == ".jsonl":
            with path.open(encoding="utf-8") as handle:
                return [json.loads(line) for line in handle if line.strip()]
        if suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                raise ValueError("a .json file must hold a list of objects")
            return data
    except ValueError as exc:
        raise ValueError(f"{path}: cannot read file: {exc}") from exc
    raise ValueError(f"{path}: unsupported file type; expected one of {TABLE_SUFFIXES}")


def image_index(rows: Sequence[Row], column: str = "image") -> dict[str, Any]:
    """index -> image cell, for VLMEvalKit TSVs where a repeated image is stored once and
    other rows hold that row's index (a short string) instead of base64."""
    return {str(r.values["index"]).strip(): r.values.get(column) for r in rows if r.has("index")}


def encoded_image(row: Row, column: str = "image", by_index: Mapping[str, Any] | None = None) -> EncodedImage | None:
    """The row's image, kept compressed; None when the cell is empty."""
    cell = row.values.get(column)
    if is_missing(cell):
        return None
    data = _image_bytes(row, column, cell, by_index or {})
    try:
        with Image.open(io.BytesIO(data)) as probe:  # reads the header only
            probe.verify()
    except Exception as exc:  # PIL names the buffer by its repr ("<_io.BytesIO object at 0x...>"): said as bytes
        why = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", f"of {len(data)} bytes", str(exc))
        raise ValueError(f"{row.where}: column {column!r} does not hold a decodable image ({why})") from None
    return EncodedImage(data, origin=f"{row.where}, column {column!r}")


def required_image(row: Row, by_index: Mapping[str, Any] | None = None, column: str = "image") -> EncodedImage:
    """``encoded_image`` for benchmarks whose every item has an image: an empty cell is an error."""
    image = encoded_image(row, column, by_index)
    if image is None:
        raise ValueError(row.missing(column))
    return image


def _image_bytes(row: Row, column: str, cell: Any, by_index: Mapping[str, Any]) -> bytes:
    if isinstance(cell, dict):
        if cell.get("bytes"):
            return bytes(cell["bytes"])
        if cell.get("path"):
            image_path = Path(cell["path"])
            if not image_path.is_absolute():
                image_path = row.source.parent / image_path
            if image_path.is_file():
                return image_path.read_bytes()
        raise ValueError(f"{row.where}: column {column!r} has neither image bytes nor a readable path: {cell.get('path')!r}")
    if isinstance(cell, (bytes, bytearray, memoryview)):
        return bytes(cell)
    if isinstance(cell, str):
        text = cell.strip()
        if len(text) <= INDEX_REFERENCE_MAX:
            target = by_index.get(text)
            if not isinstance(target, str) or len(target.strip()) <= INDEX_REFERENCE_MAX:
                raise ValueError(f"{row.where}: column {column!r} holds {text!r}, which is neither base64 nor the index of a row with an image")
            text = target.strip()
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"{row.where}: column {column!r} is not valid base64 ({exc})") from None
    raise ValueError(f"{row.where}: column {column!r} has unsupported image value of type {type(cell).__name__}")


def assign_item_ids(rows: Sequence[Row], id_columns: Sequence[str]) -> list[str]:
    """Stable ids: the first of ``id_columns`` that every row has and that is unique across
    all rows; otherwise "<file name>#<row>" (unique and stable for the same files)."""
    for column in id_columns:
        if rows and all(r.has(column) for r in rows):
            ids = [str(r.values[column]).strip() for r in rows]
            if len(set(ids)) == len(ids):
                return ids
    return [f"{r.source.name}#{r.number}" for r in rows]


class RowBenchmark(Benchmark):
    """A benchmark whose items are the rows of its data files (``declaration.files``).

    Ids and VLMEvalKit image references are resolved over all rows, so a limited load names
    and finds things exactly as a full one does; ``limit`` counts the items kept.
    """

    id_columns: ClassVar[tuple[str, ...]] = ("index", "id")  # see assign_item_ids

    def load(self, path: str | Path, limit: int | None = None) -> list[Item]:
        check_limit(limit)
        files = resolve_files(path, self.file_patterns(), self.declaration.headline.column)
        self.check_files(files)
        rows = read_rows(files)
        by_index = image_index(rows)
        items: list[Item] = []
        for row, item_id in zip(rows, assign_item_ids(rows, self.id_columns)):
            if limit is not None and len(items) >= limit:
                break
            item = self.item(row, item_id, by_index)
            if item is not None:
                items.append(item)
        return items

    def file_patterns(self) -> tuple[str, ...]:
        """The globs tried in a data directory, in order (default: the declaration's)."""
        return self.declaration.files

    def check_files(self, files: list[Path]) -> None:
        """Refuse files that cannot hold this variant of the benchmark (default: accept)."""

    @abstractmethod
    def item(self, row: Row, item_id: str, by_index: Mapping[str, Any]) -> Item | None:
        """The row's item, or None for a row the benchmark leaves out. ``by_index`` maps
        VLMEvalKit indices to image cells (see ``required_image``)."""

    def generation_item(self, item_id: str, prompt: str, image: EncodedImage | None, **meta: Any) -> GenerationItem:
        return GenerationItem(benchmark=self.name, item_id=item_id, prompt=prompt, image=image,
                              max_new_tokens=self.max_new_tokens, meta=meta)
