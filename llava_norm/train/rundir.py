"""The layout of a training run's output directory, readable without loading any training code.

Owns the names every reader and writer of a run agree on: ``checkpoint-N/`` folders, the
marker that makes one complete (written last, after every rank has saved), the files each
checkpoint carries beside the Trainer's (the run's config, its position in the data), and the
final summary. Resume, relaunch and the analyses all find checkpoints through
``complete_checkpoints``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

COMPLETE_MARKER = "checkpoint_complete"
DATA_STATE = "data_state.json"  # in each checkpoint: epoch, micro-batches consumed, order digest
RUN_CONFIG = "run_config.yaml"  # in each checkpoint: the resolved config it was trained with
SUMMARY = "train_summary.json"  # in output_dir: written last; ``complete: true`` marks a finished run
SKIPPED = "skipped.jsonl"  # in output_dir: one record per bad row dropped (file, row, cause)
WANDB_RUN_ID = "wandb_run_id"  # in output_dir, with report_to wandb: the W&B run every launch logs to
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoint dirs whose save finished on every rank, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found) if (p / COMPLETE_MARKER).is_file()]


def data_state(checkpoint: str | Path) -> dict | None:
    """A checkpoint's ``data_state.json`` (None: it has none)."""
    path = Path(checkpoint) / DATA_STATE
    return json.loads(path.read_text()) if path.is_file() else None
