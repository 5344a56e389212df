"""Replacing a file whole: a reader, or a process killed in the middle of the write, finds the old
file or the new one, never a part.

Owns the one way the package puts a small file in place (records, settings, markers, summaries,
re-serialised weights): the bytes go to a temporary file beside the target, named for the writing
process so that writers side by side never share one, are flushed to disk, and a rename puts them
over the target, which POSIX makes atomic within a file system. A write that fails removes its
temporary file; one killed before its rename leaves it, for the next write of a file that one
process alone writes (``sole_writer``) to remove. transformers' stored scans
(``llava_norm.worker.StoredScan``) keep their own write: private files (``mkstemp``'s mode 0600)
in a private folder.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path


def write_atomically(path: str | Path, data: str | bytes, sole_writer: bool = False) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file and a rename; the path.
    ``sole_writer``: no other process writes ``path``, so the temporary files killed writers of it
    left are removed first (``clear_partial_writes``)."""
    path = Path(path)
    if sole_writer:
        clear_partial_writes(path)
    partial = path.with_name(f"{_partial_prefix(path)}{os.getpid()}.tmp")
    try:
        partial.write_bytes(data.encode() if isinstance(data, str) else data)
        _flush_to_disk(partial)
        os.replace(partial, path)  # looked up at the call: the kill tests' stopper patches it
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def _flush_to_disk(path: Path) -> None:
    """The file's bytes on disk before the rename: a machine that goes down right after it could
    otherwise keep the new name over an empty or partial file (XFS, network file systems)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def clear_partial_writes(path: str | Path) -> None:
    """Remove the temporary files that killed writers of ``path`` left. Only where no other process
    writes ``path`` now: a live writer's temporary file would go too, and its rename fail."""
    path = Path(path)
    for partial in path.parent.glob(f"{glob.escape(_partial_prefix(path))}*.tmp"):
        partial.unlink(missing_ok=True)


def _partial_prefix(path: Path) -> str:
    """The name of each temporary file of ``path`` up to its writer's pid."""
    return f".{path.name}."
