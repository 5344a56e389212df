"""Where a mixture entry's rows come from, read in place.

Owns resolving a ``DataSource`` to files: a LLaVA JSON/JSONL file with its image folder; a
parquet file, folder or glob of shards in the hub's layout (``id``, ``conversations``, images
embedded as ``{bytes, path}``); or a hub dataset id at a revision and config, found in the
local huggingface_hub cache (downloaded only when online and absent), its configs and files
resolved by ``datasets`` from the dataset card. It also owns walking a source's rows in file
order (raw rows with their position, unreadable files and row groups as BadSampleErrors) and
``EmbeddedImage``, the reference that reads one image's bytes out of its shard when the
sample is drawn: parquet is never converted or copied, and image columns are never read at
load time (parquet is columnar, so the index reads only ids and conversations).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterator

from llava_norm.config_schema import ConfigError, DataSource, is_glob
from llava_norm.data.rows import WHOLE_FILE, BadSampleError

JSON_SUFFIXES = (".json", ".jsonl")
TEXT_COLUMNS = ("id", "conversations")  # what the index reads from a shard
IMAGE_COLUMN = "image"  # the hub's ``datasets.Image`` struct {bytes, path}; null on text-only rows
EMBEDDED = "<embedded>"  # a parquet row's image field, for the row rules: the image is in the shard
HUB_PATTERNS = ["README.md", "*.parquet"]  # what is fetched for a hub id: its card and its shards


@dataclass(frozen=True)
class ResolvedSource:
    kind: str  # "llava_json" | "parquet"
    files: tuple[Path, ...]
    image_folder: str | None = None  # llava_json: where the rows' relative image paths point
    expected_rows: int | None = None  # a hub card's row count for the split, to catch a partial download


def resolve(source: DataSource, key: str) -> ResolvedSource:
    """The files behind a mixture entry; a ConfigError naming ``key`` when there are none."""
    if bool(source.path) == bool(source.hub):
        raise ConfigError(f"key '{key}': give exactly one of 'path' (a file, folder or glob) and 'hub' (a dataset id)")
    if source.hub:
        return _resolve_hub(source, key)
    path = os.path.expanduser(source.path)
    pattern = is_glob(path)
    if Path(path).suffix in JSON_SUFFIXES and not pattern:
        if not Path(path).is_file():
            raise ConfigError(f"key '{key}.path': file not found: {path}")
        return ResolvedSource("llava_json", (Path(path),), source.image_folder)
    if Path(path).is_dir():
        files = sorted(Path(path).rglob("*.parquet"))
    elif pattern:
        files = sorted(Path(p) for p in glob.glob(path, recursive=True) if Path(p).is_file())
    elif Path(path).is_file() and Path(path).suffix == ".parquet":
        files = [Path(path)]
    elif Path(path).exists():
        raise ConfigError(f"key '{key}.path': {path} is neither .json/.jsonl nor .parquet, a folder or a glob")
    else:
        raise ConfigError(f"key '{key}.path': not found: {path}")
    if not files and Path(path).is_dir() and any(f.suffix in JSON_SUFFIXES for f in Path(path).rglob("*")):
        raise ConfigError(f"key '{key}.path': {path} holds no parquet shards but JSON files: name each JSON file "
                          "in a mixture entry of its own")
    if not files or any(f.suffix != ".parquet" for f in files):
        raise ConfigError(f"key '{key}.path': {path} holds no parquet shards" if not files else
                          f"key '{key}.path': {path} matches files that are not .parquet: {[str(f) for f in files][:3]}")
    if source.image_folder:  # only once the files are known to be parquet
        raise ConfigError(f"key '{key}.image_folder': {path} is parquet, whose images are embedded; remove it")
    return ResolvedSource("parquet", tuple(files))


def hub_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The local snapshot of a hub dataset at ``revision``, or None when it is not cached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def _resolve_hub(source: DataSource, key: str) -> ResolvedSource:
    from datasets import load_dataset_builder
    from huggingface_hub import constants, snapshot_download

    if source.image_folder:
        raise ConfigError(f"key '{key}.image_folder': hub datasets embed their images; remove it")
    where = f"{source.hub}" + (f"@{source.revision}" if source.revision else "")
    folder = hub_snapshot(source.hub, source.revision)
    if folder is None:
        if constants.HF_HUB_OFFLINE:
            raise ConfigError(f"key '{key}.hub': {where} is not in the local cache ({constants.HF_HUB_CACHE}) and "
                              "HF_HUB_OFFLINE is set: download it first (data/README.md)")
        folder = Path(snapshot_download(source.hub, repo_type="dataset", revision=source.revision,
                                        allow_patterns=HUB_PATTERNS))
    try:  # the card's configs and data_files, resolved against the local snapshot by datasets itself
        builder = load_dataset_builder(str(folder), name=source.config)
    except Exception as error:  # datasets raises ValueError / FileNotFoundError / DataFilesNotFoundError
        raise ConfigError(f"key '{key}': {where}: cannot read its configs from {folder}: {error}") from None
    files = sorted(Path(f) for f in (builder.config.data_files or {}).get(source.split, []))
    if not files:
        raise ConfigError(f"key '{key}.split': {where} config {builder.config.name!r} has no split "
                          f"{source.split!r} in {folder} (splits: {sorted(builder.config.data_files or {})})")
    if any(f.suffix != ".parquet" for f in files):
        raise ConfigError(f"key '{key}.hub': {where}: only parquet datasets are read in place; found {files[0].name}")
    split = (builder.info.splits or {}).get(source.split)
    return ResolvedSource("parquet", tuple(files), None, getattr(split, "num_examples", None) or None)


def check_layout(reader, shard: Path) -> None:
    """The hub layout's columns in an opened shard (``pyarrow.parquet.ParquetFile``), from its
    footer alone; BadSampleError (bad_columns) for the whole shard otherwise. The launch check
    asks it too, so a shard the run would drop is said before the launch."""
    import pyarrow as pa

    names = reader.schema_arrow.names
    missing = [c for c in TEXT_COLUMNS if c not in names]
    if missing:
        raise BadSampleError(f"{shard}: no column {missing[0]!r} (columns: {names}); expected the hub layout of "
                             "lmms-lab/LLaVA-NeXT-Data", file=str(shard), row=WHOLE_FILE, cause="bad_columns")
    turns = reader.schema_arrow.field("conversations").type
    if not (pa.types.is_list(turns) or pa.types.is_large_list(turns)):  # a JSON string, say: no row would read
        raise BadSampleError(f"{shard}: column 'conversations' is {turns}, not the hub's list of turns",
                             file=str(shard), row=WHOLE_FILE, cause="bad_columns")
    if IMAGE_COLUMN in names:
        image = reader.schema_arrow.field(IMAGE_COLUMN).type
        if not pa.types.is_struct(image) or image.get_field_index("bytes") < 0 or image.get_field_index("path") < 0:
            raise BadSampleError(f"{shard}: column 'image' is {image}, not the hub's image struct<bytes, path>",
                                 file=str(shard), row=WHOLE_FILE, cause="bad_columns")


def parquet_rows(shard: Path) -> Iterator[tuple[str, object, int, int]]:
    """(position, raw row or BadSampleError, row group, row in group) for each row of a shard.
    The raw row's ``image`` is EMBEDDED or None; the image bytes are not read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        reader = pq.ParquetFile(shard, memory_map=True)
    except (OSError, pa.ArrowException) as error:  # a truncated download has no footer
        raise BadSampleError(f"{shard}: cannot open the parquet shard ({error})", file=str(shard), row=WHOLE_FILE,
                             cause="shard_unreadable") from None
    check_layout(reader, shard)
    names = reader.schema_arrow.names
    columns = [*TEXT_COLUMNS, *([f"{IMAGE_COLUMN}.path"] if IMAGE_COLUMN in names else [])]
    first = 0
    for group in range(reader.num_row_groups):
        n = reader.metadata.row_group(group).num_rows
        try:
            rows = reader.read_row_group(group, columns=columns).to_pylist()
        except (OSError, pa.ArrowException) as error:
            for i in range(n):
                yield f"row {first + i}", BadSampleError(
                    f"{shard}: row {first + i} (row group {group}): cannot read the row group ({error})",
                    file=str(shard), row=f"row {first + i}", cause="shard_unreadable"), group, i
        else:
            for i, raw in enumerate(rows):
                raw["image"] = EMBEDDED if raw.get(IMAGE_COLUMN) is not None else None
                yield f"row {first + i}", raw, group, i
        first += n


_OPEN: dict[tuple[int, str], object] = {}  # (process id, shard) -> its open reader, oldest first
READ_BATCH = 8  # rows per batch when reading up to an embedded image
MAX_OPEN_SHARDS = 64  # per process: 8 workers x 250 shards would pass the usual 1024 descriptors


@dataclass(frozen=True)
class EmbeddedImage:
    """One embedded image, read from its shard (memory-mapped) only when ``read_bytes`` is called."""
    shard: str
    group: int
    row: int  # in the row group
    label: str  # "shard: row N", for messages

    def read_bytes(self) -> bytes:
        import pyarrow.parquet as pq

        key = (os.getpid(), self.shard)  # a reader opened before a fork stays with its process
        reader = _OPEN.get(key)
        if reader is None:
            if len(_OPEN) >= MAX_OPEN_SHARDS:  # each open shard holds a file descriptor
                _OPEN.pop(next(iter(_OPEN))).close()
            reader = _OPEN[key] = pq.ParquetFile(self.shard, memory_map=True)
        # Batches of the one column, up to the row's: reading the whole row group would read all
        # its images (hub shards: ~100 a group, stored uncompressed), this reads up to the row's page
        batches = reader.iter_batches(batch_size=READ_BATCH, row_groups=[self.group],
                                      columns=[f"{IMAGE_COLUMN}.bytes"], use_threads=False)
        value = next(islice(batches, self.row // READ_BATCH, None)).column(0)[self.row % READ_BATCH].as_py()
        data = (value or {}).get("bytes")
        if data is None:
            raise FileNotFoundError(f"{self} has no embedded bytes")
        return data

    def __str__(self) -> str:
        return self.label
