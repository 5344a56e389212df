"""Resuming a DeepSpeed checkpoint on another number of processes (``llava-norm train`` relaunched
with more or fewer GPUs or nodes).

Owns the conversion of a ZeRO checkpoint, whose optimizer state is partitioned per rank, into
DeepSpeed's universal format (one folder per parameter: fp32 weights and Adam moments), which
DeepSpeed loads with any world size (``checkpoint.load_universal``). The conversion goes into a
new folder in the resuming run's output directory, ``checkpoint-K.universal``: the original is
never changed, and the new folder counts only once its own completion marker (naming the files it
was made from) is written, so a kill during the conversion leaves nothing a later launch would
read. One process converts; the others only check its marker. It is removed when the resumed run
writes its first checkpoint of its own, or finishes.

Also owns how a resume loads the pickled files of a checkpoint (DeepSpeed's, the Trainer's RNG,
optimizer and scheduler states): weights-only, and a refusal names the file refused.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch

from llava_norm.train.rundir import COMPLETE_MARKER

UNIVERSAL_SUFFIX = ".universal"
# How long the other processes wait for the conversion (one process reads and writes the whole
# optimizer state: a 7B checkpoint's takes minutes to tens of minutes), instead of the default
# 30 minutes of torch.distributed's collectives.
UNIVERSAL_WAIT_S = 4 * 3600


def universal_checkpoint(checkpoint: Path, output_dir: Path, convert: bool = True) -> Path:
    """The universal-format copy of ``checkpoint`` in ``output_dir``: converted now, or complete
    from an earlier launch and made from these very files. ``convert=False``: only that check."""
    out = Path(output_dir) / (checkpoint.name + UNIVERSAL_SUFFIX)
    marker = out / COMPLETE_MARKER
    source = _identity(checkpoint)
    if marker.is_file() and json.loads(marker.read_text()) == source:
        return out
    if not convert:
        raise RuntimeError(f"{out}: no complete universal copy of {checkpoint} after the conversion (is "
                           "train.output_dir on a file system every node shares?)")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    tag = (checkpoint / "latest").read_text().strip()
    tmp.mkdir()
    for item in checkpoint.iterdir():  # the Trainer's and our files; DeepSpeed's partitions are converted
        if item.name not in (tag, "latest", COMPLETE_MARKER) and item.is_file():
            shutil.copy2(item, tmp / item.name)
    from deepspeed.checkpoint import ds_to_universal  # lazy: DeepSpeed only for a run that uses it

    with weights_only_loads(), one_thread_for_forked_workers():
        ds_to_universal.main(argparse.Namespace(
            input_folder=str(checkpoint / tag), output_folder=str(tmp / f"{tag}_universal"), num_extract_workers=4,
            num_merge_workers=2, keep_temp_folder=False, strict=True, inject_missing_state=True))  # DeepSpeed's defaults
    (tmp / "latest_universal").write_text(f"{tag}_universal")
    (tmp / COMPLETE_MARKER).write_text(json.dumps(source))
    os.replace(tmp, out)
    return out


@contextmanager
def one_thread_for_forked_workers():
    """One intra-op thread in this process while DeepSpeed's conversion forks its workers.

    Why: a worker forked after this process's OpenMP threads ran (a launch without torchrun has
    as many as cores unless OMP_NUM_THREADS says otherwise) waits forever in its first parallel
    tensor op, as GNU OpenMP is not fork-safe: a resume on one process hung at "Extracting ZeRO
    fragments". With one thread, the workers' ops run inline, never entering OpenMP."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def deepspeed_records() -> list:
    """The plain DeepSpeed classes its checkpoint files hold beside tensors, containers and strings
    (loss scaler, ZeRO stage, fragment address): the only ones a load may rebuild. Also a
    ``getattr`` that only returns a ZeRO stage (``enum_member``)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler  # lazy: DeepSpeed runs only
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address, (enum_member, "builtins.getattr")]


def enum_member(cls, name: str):
    """``getattr`` as a load may call it: a ZeRO stage, by name, and nothing else.

    Why: early Python 3.11 releases (Debian 12's system Python, 3.11.2, among them) pickle an
    enum member as ``getattr(cls, name)``, so the ZeRO stage in every DeepSpeed checkpoint written
    there names ``builtins.getattr``, which torch's weights-only load refuses: no such checkpoint
    resumed. Later ones (3.11.7 among them) pickle it as ``cls(value)``. Allowing ``getattr`` itself
    would let a file read any attribute of any allowed class; this one returns only a ZeRO stage.
    """
    from deepspeed.runtime.zero.config import ZeroStageEnum  # lazy: DeepSpeed runs only

    if cls is ZeroStageEnum and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    # only the types, and a bounded name: what the file holds is not shown (nor its repr run)
    shown = repr(name[:50]) if isinstance(name, str) else type(name).__name__
    raise pickle.UnpicklingError(f"getattr on a {type(cls).__name__} for {shown} is not a ZeRO stage: refused")


@contextmanager
def weights_only_loads():
    """Every ``torch.load`` inside (DeepSpeed's conversion and universal loading call it with
    ``weights_only=False``) restricted to tensors, containers and ``deepspeed_records``: a
    checkpoint a user was handed cannot run code while it is converted or loaded."""
    original, allowed = torch.load, deepspeed_records()

    def load(*args, **kwargs):
        kwargs["weights_only"] = True
        with torch.serialization.safe_globals(allowed):
            return original(*args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = original


class UnsafeFileError(pickle.UnpicklingError):
    """A checkpoint file that a weights-only load refused: it holds more than tensors and plain
    containers, so loading it would run code. Names the file."""


@contextmanager
def loads_naming_refusals():
    """Every ``torch.load`` inside: a refusal by torch's weights-only unpickler (which says what it
    refused, not in which file) raised as ``UnsafeFileError`` naming the file and the object."""
    original = torch.load

    def load(f, *args, **kwargs):
        try:
            return original(f, *args, **kwargs)
        except UnsafeFileError:
            raise
        except pickle.UnpicklingError as error:
            # torch's message: what to do about the default, then "WeightsUnpickler error:" and the object
            said = str(error).partition("WeightsUnpickler error:")[2] or str(error)
            why = next((line.strip().split(". ")[0].rstrip(".") for line in said.splitlines() if line.strip()),
                       "refused")
            raise UnsafeFileError(f"{f}: refused by the weights-only load ({why}): it is damaged, or holds objects "
                                  "whose loading would run code, where a checkpoint this code writes holds only "
                                  "tensors and plain values. Delete that checkpoint to resume from the one before "
                                  "it, or set train.resume") from None

    torch.load = load
    try:
        yield
    finally:
        torch.load = original


def _identity(checkpoint: Path) -> dict:
    """The checkpoint's path and each of its files' size and modification time: a copy made from
    other files (a checkpoint written again at the same step) does not match."""
    files = {str(p.relative_to(checkpoint)): [p.stat().st_size, p.stat().st_mtime_ns]
             for p in sorted(checkpoint.rglob("*")) if p.is_file()}
    return {"source": str(checkpoint), "files": files}


def remove_universal_copies(output_dir: Path) -> None:
    """Once the run has a checkpoint of its own again, the converted copies are dead weight."""
    for folder in Path(output_dir).glob(f"checkpoint-*{UNIVERSAL_SUFFIX}*"):
        shutil.rmtree(folder, ignore_errors=True)
