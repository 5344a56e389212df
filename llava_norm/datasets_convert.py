"""Real-data converters owned with ``data/README.md``: LLaVA-NeXT parquet -> LLaVA JSON, 558K check.

``convert_llava_next_parquet`` streams lmms-lab/LLaVA-NeXT-Data shards (``id``, ``conversations``
list<struct<from,value>>, ``data_source``, ``image`` HF struct {bytes, path}) into rows
``{id, image?, conversations}`` plus an image folder, resumably. ``check_llava_pretrain`` validates
liuhaotian/LLaVA-Pretrain ``blip_laion_cc_sbu_558k.json`` against its unzipped images. Shared row
rules: roles human/gpt (user/assistant are renamed to them), first turn human, and exactly one
``<image>`` -- in the first turn -- iff the row has an image. Nothing is ever unpickled.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Sequence

import pyarrow.parquet as pq
from PIL import Image
from tqdm import tqdm

from llava_norm.data.conversation import IMAGE_PLACEHOLDER

ROLE_ALIASES = {"human": "human", "gpt": "gpt", "user": "human", "assistant": "gpt"}
OnBadRow = Literal["error", "skip"]
PathLike = str | os.PathLike
_BATCH_ROWS = 256  # commit granularity: bounds both memory and the work a crash can lose


class BadRowError(ValueError):
    """A row that breaks the rules above; the message names file, row index and row id."""
    def __init__(self, file: PathLike, index: int, row_id: Any, kind: str, detail: str):
        self.file, self.index, self.row_id, self.kind = str(file), index, row_id, kind
        super().__init__(f"{file}: row {index} (id={row_id!r}): {detail}")


class _Bad(Exception):
    """Internal: ``_Bad(kind, detail)``, a rule violation before file/row context is attached."""


@dataclass
class ConvertStats:
    """Counters returned by both entry points (and kept in the converter's progress record)."""
    rows_in: int = 0  # input rows consumed (what ``limit`` counts)
    rows_written: int = 0
    rows_with_image: int = 0  # one image file may serve several rows (same path, same bytes)
    text_only: int = 0
    skipped: int = 0
    roles_normalised: int = 0  # turns whose user/assistant role was renamed to human/gpt
    name_conflicts: int = 0  # given image path already held different bytes -> fell back to id
    skip_reasons: dict[str, int] = field(default_factory=dict)  # e.g. {"missing_image": 3}
    examples: list[str] = field(default_factory=list)  # first skip messages, for the log
    finished: bool = False  # all input consumed (False when stopped by ``limit``)

    def add(self, row: dict, renamed: int) -> dict:
        self.rows_written += 1
        self.rows_with_image += "image" in row
        self.text_only += "image" not in row
        self.roles_normalised += renamed
        return row

    def bad(self, err: BadRowError, on_bad_row: OnBadRow) -> None:
        if on_bad_row != "skip":
            raise err from None
        self.skipped += 1
        self.skip_reasons[err.kind] = self.skip_reasons.get(err.kind, 0) + 1
        if len(self.examples) < 20:
            self.examples.append(str(err))


def normalise_conversations(conv: Any, has_image: bool) -> tuple[list[dict[str, str]], int]:
    """Return (turns with canonical roles, number of renamed roles) or raise ``_Bad``."""
    if conv is None:
        raise _Bad("missing_conversations", "missing 'conversations'")
    if not isinstance(conv, list):
        raise _Bad("malformed", f"'conversations' is {type(conv).__name__}, not a list")
    if not conv:
        raise _Bad("empty_conversation", "empty conversation")
    turns, renamed = [], 0
    for i, turn in enumerate(conv):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise _Bad("malformed", f"turn {i} is not a {{from, value: str}} object")
        role = turn.get("from")
        if role not in ROLE_ALIASES:
            raise _Bad("unknown_role", f"unknown role {role!r} in turn {i} (want human/gpt)")
        renamed += ROLE_ALIASES[role] != role
        turns.append({"from": ROLE_ALIASES[role], "value": turn["value"]})
    if turns[0]["from"] != "human":
        raise _Bad("first_turn_not_human", "first turn is not from human")
    counts = [t["value"].count(IMAGE_PLACEHOLDER) for t in turns]
    if counts != ([1] + [0] * (len(turns) - 1) if has_image else [0] * len(turns)):
        want = "exactly one, in the first turn" if has_image else "none (text-only row)"
        raise _Bad("image_token_mismatch", f"{IMAGE_PLACEHOLDER} per turn {counts}, expected {want}")
    return turns, renamed


def safe_relpath(name: str) -> str:
    """Normalise a relative image path; reject absolute paths and ``..`` (path traversal)."""
    if not name or "\x00" in name or name[0] in "/\\" or name[1:2] == ":":
        raise _Bad("unsafe_path", f"unsafe image path {name!r} (absolute or empty)")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise _Bad("unsafe_path", f"unsafe image path {name!r} (contains '..')")
    return "/".join(parts)


def inspect_image(data: bytes, decode: bool = True) -> str:
    """Extension from the bytes' magic (PIL's format sniffing), never from a name. With
    ``decode``, fully decode: ``verify()`` misses truncations that training's convert() hits."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            if decode:
                im.load()
            fmt = (im.format or "bin").lower()
    except Exception as e:  # PIL raises many types (OSError, SyntaxError, DecompressionBombError)
        raise _Bad("undecodable_image", f"undecodable image bytes ({type(e).__name__}: {e})") from e
    return "jpg" if fmt == "jpeg" else fmt


def _write_image(target: Path, data: bytes) -> bool:
    """Write atomically; True if written or identical, False if *different* bytes are there."""
    if target.exists():
        return target.stat().st_size == len(data) and target.read_bytes() == data
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)  # a kill never leaves a half-written image under the final name
    return True


def _atomic_write_text(path: PathLike, chunks: Iterable[str]) -> None:
    tmp = Path(f"{path}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(chunks)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _list_shards(src: PathLike | Sequence[PathLike]) -> list[Path]:
    paths = map(Path, [src] if isinstance(src, (str, os.PathLike)) else src)
    shards = [s for p in paths for s in (sorted(p.rglob("*.parquet")) if p.is_dir() else [p])]
    if not shards:
        raise FileNotFoundError(f"no .parquet files in {src}")
    return shards


def _convert_row(row: dict, image_dir: Path, verify: bool, stats: ConvertStats) -> tuple[dict, int]:
    """One parquet row -> (output row, renamed roles), its image written; raises ``_Bad``."""
    row_id, img = row.get("id"), row.get("image")
    if row_id is None or row_id == "":
        raise _Bad("missing_id", "missing 'id'")
    data, given = (img, None) if isinstance(img, bytes) else (
        (img or {}).get("bytes"), (img or {}).get("path"))
    if img is not None and data is None:
        raise _Bad("image_without_bytes", f"image struct has no embedded bytes (path={given!r})")
    turns, renamed = normalise_conversations(row.get("conversations"), data is not None)
    out: dict[str, Any] = {"id": row_id}
    if data is not None:
        fallback = f"{row_id}.{inspect_image(data, verify)}"  # ids may hold '/': "VG_100K/4"
        name = safe_relpath(given or fallback)
        if not _write_image(image_dir / name, data):
            if given:  # e.g. two sources sharing a basename: keep both, under the row id
                stats.name_conflicts += 1
                name = safe_relpath(fallback)
            if not given or not _write_image(image_dir / name, data):
                raise _Bad("image_name_collision", f"{name!r} already holds different bytes")
        out["image"] = name
    out["conversations"] = turns
    if row.get("data_source") is not None:
        out["data_source"] = row["data_source"]  # kept for per-source analysis; loaders ignore it
    return out, renamed


def convert_llava_next_parquet(
    parquet_paths_or_dir: PathLike | Sequence[PathLike], out_json: PathLike, image_dir: PathLike,
    *, limit: int | None = None, resume: bool = True, on_bad_row: OnBadRow = "error",
    verify_images: bool = True,
) -> ConvertStats:
    """Convert LLaVA-NeXT-Data parquet shards to ``out_json`` (.json list or .jsonl) + images.

    ``limit`` caps input rows consumed in total, across resumed runs. Rows go to
    ``<out>.parts.jsonl`` and a cursor (shard, row group, row) to ``<out>.progress.json`` after each
    batch; a restart truncates the parts file to the last commit, so nothing is duplicated. The
    final file is written atomically (temp + os.replace). ``resume=False`` discards progress."""
    out, image_dir = Path(out_json), Path(image_dir)
    shards = _list_shards(parquet_paths_or_dir)
    keys = [str(s.resolve()) for s in shards]
    parts, prog_path = Path(f"{out}.parts.jsonl"), Path(f"{out}.progress.json")
    state = {"shards": keys, "cursor": [0, 0, 0], "parts_bytes": 0, "stats": asdict(ConvertStats())}
    if resume and prog_path.exists():
        state = json.loads(prog_path.read_text())
        if state["shards"] != keys:
            raise ValueError(f"{prog_path}: input shards differ from the interrupted run; "
                             "pass resume=False (--no-resume) to start over")
    else:  # else a crash before our first commit would later resume a stale cursor
        prog_path.unlink(missing_ok=True)
    stats = ConvertStats(**state["stats"])
    if stats.finished:
        return stats
    out.parent.mkdir(parents=True, exist_ok=True)
    image_dir.mkdir(parents=True, exist_ok=True)
    parts.touch()
    if parts.stat().st_size < state["parts_bytes"]:
        raise ValueError(f"{parts} is shorter than {prog_path} records; rerun with --no-resume")
    os.truncate(parts, state["parts_bytes"])  # drop rows written after the last commit
    total = sum(pq.ParquetFile(s).metadata.num_rows for s in shards)
    bar = tqdm(total=min(total, limit if limit is not None else total), initial=stats.rows_in)
    nxt = list(state["cursor"])
    with open(parts, "a", encoding="utf-8") as f:
        def commit(cursor: list[int]) -> None:
            f.flush()
            os.fsync(f.fileno())
            state.update(cursor=cursor, parts_bytes=parts.stat().st_size, stats=asdict(stats))
            _atomic_write_text(prog_path, [json.dumps(state)])

        for item in _iter_rows(shards, nxt):
            if item is None:  # end of a batch: make everything so far durable
                commit(nxt)
                continue
            pos, index, rec = item
            if limit is not None and stats.rows_in >= limit:
                commit(pos)
                break
            try:
                row = stats.add(*_convert_row(rec, image_dir, verify_images, stats))
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            except _Bad as bad:
                stats.bad(BadRowError(shards[pos[0]], index, rec.get("id"), *bad.args), on_bad_row)
            stats.rows_in += 1
            nxt = [pos[0], pos[1], pos[2] + 1]
            bar.update()
        else:
            stats.finished = True
            commit([len(shards), 0, 0])
    bar.close()
    _finalize(parts, out)
    if stats.finished:
        parts.unlink()  # progress (finished=True) stays, so a requeued job returns at once
    return stats


def _iter_rows(shards: list[Path], cursor: list[int]) -> Iterator[tuple[list, int, dict] | None]:
    """Yield ([shard, row group, row], row index in shard, record) from ``cursor`` on, and
    ``None`` after each batch. Only one batch (<= _BATCH_ROWS rows) is decoded at a time."""
    s0, g0, r0 = cursor
    for si in range(s0, len(shards)):
        pfile = pq.ParquetFile(shards[si])
        cols = [c for c in ("id", "conversations", "data_source", "image")
                if c in pfile.schema_arrow.names]
        sizes = [pfile.metadata.row_group(g).num_rows for g in range(pfile.num_row_groups)]
        for gi in range(g0 if si == s0 else 0, len(sizes)):
            start, row = (r0 if (si, gi) == (s0, g0) else 0), 0
            for batch in pfile.iter_batches(batch_size=_BATCH_ROWS, row_groups=[gi], columns=cols):
                for rec in batch.to_pylist():
                    if row >= start:
                        yield [si, gi, row], sum(sizes[:gi]) + row, rec
                    row += 1
                yield None


def _finalize(parts: Path, out: Path) -> None:
    """Publish the committed rows as JSONL, or as a JSON list streamed line by line."""
    with open(parts, encoding="utf-8") as f:
        body = (("\n" if i == 0 else ",\n") + line.rstrip("\n") for i, line in enumerate(f))
        lines = f if out.suffix == ".jsonl" else itertools.chain(["["], body, ["\n]\n"])
        _atomic_write_text(out, lines)


def check_llava_pretrain(
    json_path: PathLike, image_dir: PathLike, *, limit: int | None = None,
    on_bad_row: OnBadRow = "error", write_jsonl: PathLike | None = None,
    verify_images: bool = False,
) -> ConvertStats:
    """Validate blip_laion_cc_sbu_558k.json (or .jsonl) rows against ``image_dir``; count problems.

    Checks each row's ``id``, conversations (rules above), and that its ``image`` is a safe relative
    path to a file under ``image_dir`` (also decoded with ``verify_images``). Good rows, roles
    normalised, go to ``write_jsonl`` (written atomically) when given."""
    json_path, image_dir = Path(json_path), Path(image_dir)
    with open(json_path, encoding="utf-8") as f:
        jsonl = json_path.suffix == ".jsonl"
        rows = [json.loads(x) for x in f if x.strip()] if jsonl else json.load(f)
    if not isinstance(rows, list):
        raise ValueError(f"{json_path}: expected a JSON list of rows, got {type(rows).__name__}")
    stats, good = ConvertStats(), []
    for idx, row in enumerate(tqdm(rows[:limit], unit="row", desc="check")):
        stats.rows_in += 1
        row_id = row.get("id") if isinstance(row, dict) else None
        try:
            if row_id is None or row_id == "":
                raise _Bad("missing_id", "row is not an object with an 'id'")
            has_image = row.get("image") is not None
            turns, renamed = normalise_conversations(row.get("conversations"), has_image)
            clean = {"id": row_id, "conversations": turns}
            if has_image:
                rel = safe_relpath(row["image"] if isinstance(row["image"], str) else "")
                if not (image_dir / rel).is_file():
                    raise _Bad("missing_image", f"missing image file {image_dir / rel}")
                if verify_images:
                    inspect_image((image_dir / rel).read_bytes())
                clean = {"id": row_id, "image": rel, "conversations": turns}
            good.append(stats.add(clean, renamed))
        except _Bad as bad:
            stats.bad(BadRowError(json_path, idx, row_id, *bad.args), on_bad_row)
    if write_jsonl is not None:
        Path(write_jsonl).parent.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(write_jsonl, (json.dumps(r, ensure_ascii=False) + "\n" for r in good))
    stats.finished = limit is None or limit >= len(rows)
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m llava_norm.datasets_convert {next,pretrain} ...``; prints the stats as JSON."""
    ap = argparse.ArgumentParser(prog="python -m llava_norm.datasets_convert")
    sub = ap.add_subparsers(dest="cmd", required=True)
    nxt = sub.add_parser("next", help="convert lmms-lab/LLaVA-NeXT-Data parquet shards")
    nxt.add_argument("parquet", nargs="+", help="shard files or directories (searched recursively)")
    nxt.add_argument("--out", required=True, help="output .json (list) or .jsonl")
    nxt.add_argument("--no-resume", action="store_true", help="discard earlier progress")
    pre = sub.add_parser("pretrain", help="check LLaVA-Pretrain 558K json against its images")
    pre.add_argument("--json", required=True, help="blip_laion_cc_sbu_558k.json (or .jsonl)")
    pre.add_argument("--write-jsonl", help="also write the good rows here")
    for p, flag, hlp in ((nxt, "--no-verify-images", "skip"), (pre, "--verify-images", "add")):
        p.add_argument("--image-dir", required=True, help="the training config's image_folder")
        p.add_argument(flag, action="store_true", help=f"{hlp} the full PIL decode of each image")
        p.add_argument("--limit", type=int, help="only the first N input rows")
        p.add_argument("--on-bad-row", choices=["error", "skip"], default="error")
    a = ap.parse_args(argv)
    try:
        stats = convert_llava_next_parquet(
            a.parquet, a.out, a.image_dir, limit=a.limit, resume=not a.no_resume,
            on_bad_row=a.on_bad_row, verify_images=not a.no_verify_images,
        ) if a.cmd == "next" else check_llava_pretrain(
            a.json, a.image_dir, limit=a.limit, on_bad_row=a.on_bad_row,
            write_jsonl=a.write_jsonl, verify_images=a.verify_images)
    except (ValueError, FileNotFoundError) as e:  # BadRowError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(stats), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
