"""Per-sample prediction files: append-as-you-go JSONL that survives a kill at any moment.

Owns the on-disk layout ``<run>/predictions/<benchmark>/rank<r>.jsonl`` plus ``settings.json``,
and the three operations a resumable, data-parallel evaluation needs:

- ``repair``: a process killed mid-write leaves a torn last line; it is cut off before the
  owning rank appends again (otherwise the next record would be glued onto it);
- ``read_all``: every rank's file, merged by ``item_id`` (the first record wins, a later
  duplicate is counted, never scored twice); a torn line without its newline is ignored;
- ``append``: one JSON object per line, flushed and fsynced per batch, so what was computed
  before a kill is never computed again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llava_norm.files import write_atomically

# Where the checkpoint and the data live, as opposed to what they hold: compared through their
# fingerprints (also in the settings), so predictions or a result of a moved but identical copy
# are still used.
LOCATION_KEYS = ("checkpoint", "data_path")


def differing_keys(old: dict, new: dict) -> list[str]:
    """The keys of two settings dicts whose values differ, locations aside."""
    return sorted(k for k in set(old) | set(new) if k not in LOCATION_KEYS and old.get(k) != new.get(k))

# A recorded setting -> the `llava-norm eval` option that sets it (evaluation.settings records them)
OPTIONS = {"batch_items": "batch-size", "limit": "limit", "max_new_tokens_cap": "max-new-tokens-cap", "dtype": "dtype"}


class DamagedFileError(ValueError):
    """A file an earlier evaluation wrote in its --out folder that does not read (cut short,
    edited): the message names it and the ways on; ``path`` is the file."""

    def __init__(self, message: str, path: Path | None = None):
        super().__init__(message)
        self.path = Path(path) if path is not None else None


def read_json_output(path: Path):
    """An earlier evaluation's JSON file (a result, a settings record), or DamagedFileError."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # JSON's and UTF-8's errors both
        raise DamagedFileError(f"{path}: not a whole JSON file ({error}); delete it (llava-norm eval writes it "
                               "again) or pass --overwrite to llava-norm eval", path) from None


class SettingsMismatchError(RuntimeError):
    def __init__(self, differing: list[str], message: str):
        super().__init__(message)
        self.differing = differing  # the settings keys that differ


@dataclass
class Merged:
    predictions: dict[str, Any] = field(default_factory=dict)
    duplicates: int = 0


class PredictionStore:
    def __init__(self, root: str | Path, benchmark: str):
        self.dir = Path(root) / "predictions" / benchmark
        self.benchmark = benchmark

    def rank_file(self, rank: int) -> Path:
        return self.dir / f"rank{rank}.jsonl"

    def files(self) -> list[Path]:
        return sorted(self.dir.glob("rank*.jsonl"))

    def clear(self) -> None:
        for path in self.files():
            path.unlink()

    def verify_settings(self, settings: dict) -> None:
        """Refuse to mix predictions made under different settings (another checkpoint,
        prompt or split) into one result; the same checkpoint or data at another path is the same."""
        path = self.dir / "settings.json"
        if not path.exists():
            return
        old = read_json_output(path)
        changed = differing_keys(old, settings)
        if changed:
            key = changed[0]
            option = f" (--{OPTIONS[key]})" if key in OPTIONS else ""
            raise SettingsMismatchError(changed, 
                f"{path}: existing predictions were made with {key}={old.get(key)!r}, this run has "
                f"{key}={settings.get(key)!r}{option} (differing keys: {changed}). Pass --replace-stale to recompute "
                f"{self.benchmark} (--overwrite: every benchmark), or write to another --out directory.")

    def write_settings(self, settings: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.dir / "settings.json", json.dumps(settings, indent=2, sort_keys=True))

    def repair(self, rank: int) -> None:
        """Cut a torn final line (no newline) left by a killed writer."""
        path = self.rank_file(rank)
        if not path.exists():
            return
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def read_all(self) -> Merged:
        merged = Merged()
        for path in self.files():
            # bytes: a killed writer's torn tail (no newline) may end inside a character, and is
            # not a finished record
            lines = path.read_bytes().split(b"\n")[:-1]
            for number, line in enumerate(lines, 1):
                try:
                    record = json.loads(line.decode("utf-8"))
                    item_id = record["item_id"]
                    prediction = record["prediction"]
                except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
                    raise DamagedFileError(f"{path}:{number}: not a prediction record ({error}); "
                                           "delete that line (the records around it are kept and its item is "
                                           "predicted again), or the file, or pass --overwrite", path) from None
                if item_id in merged.predictions:
                    merged.duplicates += 1
                else:
                    merged.predictions[item_id] = prediction
        return merged

    def append(self, rank: int, records: list[dict]) -> None:
        if not records:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        with open(self.rank_file(rank), "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
