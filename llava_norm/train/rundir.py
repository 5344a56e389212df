"""The layout of a training run's output directory, readable without loading any training code.

Owns the names every reader and writer of a run agree on: ``checkpoint-N/`` folders, the
marker that makes one complete (written last, after every rank has saved), the files each
checkpoint carries beside the Trainer's (the run's config, its position in the data), and the
final summary. Resume, relaunch and the analyses all find checkpoints through
``complete_checkpoints``; the trainer and ``llava-norm check`` decide whether a checkpoint's
position carries over to another number of processes through ``global_batch_problem``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from llava_norm.layout import COMPLETE_MARKER, TRAINER_STATE  # noqa: F401 (COMPLETE_MARKER: re-exported)

DATA_STATE = "data_state.json"  # in each checkpoint: epoch, micro-batches consumed, order digest
NO_DATA_STATE = f"no {DATA_STATE}; its position in the data is unknown"  # such a checkpoint is never resumed
RUN_CONFIG = "run_config.yaml"  # in each checkpoint: the resolved config it was trained with
SUMMARY = "train_summary.json"  # in output_dir: written last; ``complete: true`` marks a finished run
SKIPPED = "skipped.jsonl"  # in output_dir: one record per bad row dropped (file, row, cause)
WANDB_RUN_ID = "wandb_run_id"  # in output_dir, with report_to wandb: the W&B run every launch logs to
PROFILE_DIR = "profile"  # in output_dir, with train.profile_steps: the trace and the top operators
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _checkpoint_dirs(output_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every ``checkpoint-N`` folder, complete or not, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir())


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoint dirs whose save finished on every rank, oldest first."""
    return [p for _, p in _checkpoint_dirs(output_dir) if (p / COMPLETE_MARKER).is_file()]


def stale_checkpoints(output_dir: str | Path, step: int, resumed_from: Path | None) -> list[Path]:
    """What a save at ``step`` must clear first: the folders a killed save left without their
    marker at that step or before (the run is past them: none will be completed, only written
    into), and a complete one at that very step from another course of the run (a launch resumed
    an earlier checkpoint by ``train.resume``) other than ``resumed_from``."""
    kept = Path(resumed_from).resolve() if resumed_from is not None else None
    return [p for at, p in _checkpoint_dirs(output_dir) if p.resolve() != kept and
            (at == step or (at < step and not (p / COMPLETE_MARKER).is_file()))]


# Written into a checkpoint for a reader, never read by a resume (transformers' pickled arguments,
# DeepSpeed's conversion script): deleting one leaves the checkpoint as good as saved.
NOT_READ_ON_RESUME = ("training_args.bin", "zero_to_fp32.py")


def checkpoint_manifest(checkpoint: str | Path, step: int) -> str:
    """What the marker of ``checkpoint`` records: its step and every file's size then (the marker's
    own aside, and those of NOT_READ_ON_RESUME), so that a resume can tell a file deleted or cut
    short since (``checkpoint_damage``)."""
    folder = Path(checkpoint)
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name not in (COMPLETE_MARKER, *NOT_READ_ON_RESUME)}
    return json.dumps({"step": step, "files": files})


def checkpoint_damage(checkpoint: str | Path) -> list[str]:
    """The files of a complete checkpoint that are missing or of another size than when it was
    saved; [] where all are as saved, or where the marker lists none (written by an older version)."""
    folder = Path(checkpoint)
    try:
        recorded = json.loads((folder / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):  # an older version's marker holds the step alone
        return []
    files = recorded.get("files") if isinstance(recorded, dict) and "step" in recorded else None
    if not isinstance(files, dict):  # (a universal copy's marker records its source's files otherwise)
        return []
    found = []
    for name, size in files.items():
        path = folder / name
        now = path.stat().st_size if path.is_file() else None
        if now is None:
            found.append(f"{name} is missing")
        elif now != size:
            found.append(f"{name} has {now:,} bytes, {size:,} when saved")
    return found


def checkpoint_step(checkpoint: str | Path) -> int | None:
    """The optimizer step a checkpoint was saved at, from the Trainer's state (None: none recorded)."""
    path = Path(checkpoint) / TRAINER_STATE
    return json.loads(path.read_text()).get("global_step") if path.is_file() else None


def data_state(checkpoint: str | Path) -> dict | None:
    """A checkpoint's ``data_state.json`` (None: it has none)."""
    path = Path(checkpoint) / DATA_STATE
    return json.loads(path.read_text()) if path.is_file() else None


def processes(n: int) -> str:
    return f"{n} process" + ("" if n == 1 else "es")


def global_batch_problem(saved: dict, world: int, global_batch: int, per_device: int | None = None) -> str | None:
    """Why a checkpoint's data position (its ``data_state.json``) does not carry over to a launch
    of ``world`` processes whose global batch is ``global_batch``; None where it does. Each step
    continues with the same samples only at the same global batch, on any number of processes
    (another micro-batch or accumulation is taken as such, under ``train.allow_config_change``);
    a checkpoint that recorded none can resume only on its own number."""
    saved_world, recorded = saved.get("world_size", world), saved.get("global_batch")
    if recorded is None:
        return None if saved_world == world else (
            f"saved on {processes(saved_world)} without a record of its global batch, so on {processes(world)} its "
            f"steps could hold other samples; resume it on {processes(saved_world)}")
    if recorded != global_batch:
        now = "this launch's is" if saved_world == world else f"on {processes(world)} it would be"
        fits = [d for d in range(1, recorded // world + 1) if recorded % (d * world) == 0]
        if not fits:
            return (f"saved with a global batch of {recorded} on {processes(saved_world)}; {now} {global_batch}, and "
                    f"no per-device batch splits {recorded} rows over {processes(world)}: resume it on a number of "
                    "processes that divides it")
        split = "" if per_device in fits else f", with train.per_device_batch_size one of {fits} (to split it over " \
                                               f"{processes(world)})"
        return (f"saved with a global batch of {recorded} on {processes(saved_world)}; {now} {global_batch}. Set "
                f"train.global_batch_size to {recorded} so the accumulation is re-derived{split}, and "
                "train.allow_config_change=true where the checkpoint's config names another global batch or none")
    return None
