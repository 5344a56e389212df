"""LLaVA rows written in the layout of the hub's lmms-lab/LLaVA-NeXT-Data: parquet shards.

Owns turning LLaVA JSON rows plus their image folder into ``data/train-0000K-of-0000N.parquet``
shards with the hub's columns (``id``, ``conversations`` as a list of ``{from, value}``,
``data_source``, ``image`` as ``datasets.Image``: ``{bytes, path}``, null for text-only rows),
written by ``datasets`` itself as the hub's were, and the dataset card whose YAML names the
config, its files and the row count. The world writes its stage-2 corpus both ways, so the
tests and the demo train from the layout real users download.
"""

from __future__ import annotations

import io
from pathlib import Path

SHARD_NAME = "data/train-{index:05d}-of-{count:05d}.parquet"
CARD = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*
dataset_info:
  features:
  - name: id
    dtype: string
  - name: conversations
    list:
    - name: from
      dtype: string
    - name: value
      dtype: string
  - name: data_source
    dtype: string
  - name: image
    dtype: image
  splits:
  - name: train
    num_bytes: {num_bytes}
    num_examples: {rows}
---
Synthetic rows in the layout of lmms-lab/LLaVA-NeXT-Data (llava_norm_demo.synth).
"""


def features():
    from datasets import Features, Image, List, Value

    return Features({"id": Value("string"),
                     "conversations": List({"from": Value("string"), "value": Value("string")}),
                     "data_source": Value("string"), "image": Image()})


def next_shards(rows: list[dict], image_folder: Path, shards: int = 2, data_source: str = "synth") -> dict[str, bytes]:
    """{relative path: bytes} of the shards and the card for ``rows`` (LLaVA JSON rows whose
    ``image`` is relative to ``image_folder``), rows in order, split as evenly as possible."""
    from datasets import Dataset

    if not 1 <= shards <= max(1, len(rows)):
        raise ValueError(f"shards must be in 1..{max(1, len(rows))}, got {shards}")
    out, start = {}, 0
    for index in range(shards):
        end = start + len(rows) // shards + (index < len(rows) % shards)
        part = rows[start:end]
        table = {"id": [r["id"] for r in part], "conversations": [r["conversations"] for r in part],
                 "data_source": [data_source] * len(part),
                 "image": [{"bytes": (image_folder / r["image"]).read_bytes(), "path": r["image"]}
                           if r.get("image") else None for r in part]}
        buffer = io.BytesIO()
        Dataset.from_dict(table, features=features()).to_parquet(buffer)
        out[SHARD_NAME.format(index=index, count=shards)] = buffer.getvalue()
        start = end
    out["README.md"] = CARD.format(rows=len(rows), num_bytes=sum(len(b) for b in out.values())).encode()
    return out


def write_next_layout(rows: list[dict], image_folder: Path, out_dir: Path, shards: int = 2) -> Path:
    """Write ``next_shards`` under ``out_dir`` (a folder laid out as the hub snapshot); returns it."""
    for rel, data in next_shards(rows, Path(image_folder), shards).items():
        (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (out_dir / rel).write_bytes(data)
    return out_dir
