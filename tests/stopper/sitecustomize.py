"""Stops a launched training process at a chosen point of a checkpoint write, for the kill tests.

Put this folder on PYTHONPATH and set ``LLAVA_TEST_STOP_AT=FOLDER:PHASE`` and
``LLAVA_TEST_STOP_FLAG=PATH``; every Python process of the launch then imports it at start-up.
FOLDER is ``checkpoint-N``, ``model`` for the final model the run writes after its last
checkpoint, or ``summary`` for ``train_summary.json``, written after the final model (only
``early`` applies to those two; for the summary, half its bytes written wherever the run writes
them first, the summary itself or a temporary file to be renamed over it). The first process of
the launch to reach PHASE while writing FOLDER writes PATH (its pid and the file it stopped in)
and sleeps until the test kills it; the other ranks run on until they wait for it. PHASE is where in the write:

- ``early``: the folder's first weights or state file, half of its bytes written;
- ``middle``: an optimizer-state file (DeepSpeed's per-rank ZeRO partition, or the Trainer's
  ``optimizer.pt``), half of its bytes written, after the model weights;
- ``rank``: a non-main rank's own log state (``log_state_rank1.json``), half of its bytes written,
  after DeepSpeed's files and before the barrier that holds the main process back from the
  marker; that rank waits for the main process's own log state, then LINGER seconds more before
  saying it stopped, time enough for a main process that did not wait at the barrier to write
  the marker;
- ``late``: every file written, right before the completion marker is put in place.

Test-only: the training code knows nothing of it. It patches the three calls that write a
checkpoint's files (``torch.save``, safetensors' ``save_file``, and ``os.replace`` for the
marker) before transformers or DeepSpeed import them, and pathlib's ``write_text`` and
``write_bytes`` for the summary and the ranks' log states.
"""

import os
import time

_WHERE = os.environ.get("LLAVA_TEST_STOP_AT", "")
_FLAG = os.environ.get("LLAVA_TEST_STOP_FLAG", "")


SUMMARY = "train_summary.json"
LINGER = 2.0  # seconds (``rank``)


def _install(folder: str, phase: str) -> None:
    import pathlib

    import safetensors.torch
    import torch

    def stop(path: str, cut: bool) -> None:
        if cut:  # a write cut short: the file as the real call wrote it, then only its first half
            size = os.path.getsize(path)
            os.truncate(path, size // 2)
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
        if phase == "rank":  # once the main process wrote its own log state (its last write before the barrier)
            main = os.path.join(os.path.dirname(path), "log_state_rank0.json")
            deadline = time.time() + 120
            while not os.path.exists(main) and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(LINGER)
        tmp = f"{_FLAG}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()} {phase} {path}\n")
        os.replace(tmp, _FLAG)
        while True:
            time.sleep(60)

    def inside(path) -> bool:
        return folder != "summary" and isinstance(path, (str, os.PathLike)) and \
            f"{os.sep}{folder}{os.sep}" in os.fspath(path)

    def wanted(path) -> bool:
        if not inside(path) or os.path.exists(_FLAG):
            return False
        name = os.path.basename(os.fspath(path))
        return phase == "early" or (phase == "middle" and "optim" in name)

    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        result = real_save(obj, f, *args, **kwargs)
        if wanted(f):
            stop(os.fspath(f), cut=True)
        return result

    real_save_file = safetensors.torch.save_file

    def save_file(tensors, filename, metadata=None):
        result = real_save_file(tensors, filename, metadata=metadata)
        if wanted(filename):
            stop(os.fspath(filename), cut=True)
        return result

    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if phase == "late" and inside(dst) and os.path.basename(os.fspath(dst)) == "checkpoint_complete" \
                and not os.path.exists(_FLAG):
            stop(os.fspath(dst), cut=False)
        return real_replace(src, dst, *args, **kwargs)

    def summary_writer(real):
        def write(self, data, *args, **kwargs):
            result = real(self, data, *args, **kwargs)
            name = os.path.basename(os.fspath(self))
            summary = folder == "summary" and (name == SUMMARY or name.startswith(f".{SUMMARY}."))
            rank_state = phase == "rank" and inside(self) and name == "log_state_rank1.json"
            if (summary or rank_state) and not os.path.exists(_FLAG):
                stop(os.fspath(self), cut=True)
            return result
        return write

    torch.save = save
    safetensors.torch.save_file = save_file
    os.replace = replace
    pathlib.Path.write_text = summary_writer(pathlib.Path.write_text)
    pathlib.Path.write_bytes = summary_writer(pathlib.Path.write_bytes)


if _WHERE and _FLAG:
    _folder, _phase = _WHERE.split(":")
    if _phase not in ("early", "middle", "rank", "late") or (_folder in ("model", "summary") and _phase != "early"):
        raise ValueError(f"LLAVA_TEST_STOP_AT: no phase {_phase!r} in {_folder}")
    _install(_folder, _phase)
