"""Replacing a file whole: a reader, or a process killed in the middle of the write, finds the old
file or the new one, never a part.

Owns the one way the package puts a small file in place (records, settings, markers, summaries,
re-serialised weights): the bytes go to a temporary file beside the target, named for the writing
process so that writers side by side never share one, are flushed to disk, and a rename puts them
over the target, which POSIX makes atomic within a file system. A write that fails removes its
temporary file; one killed before its rename leaves it, for the next write of the same file to
remove: every temporary file of it where one process alone writes it (``sole_writer``), else those
whose writer, named in it by host and pid, is no longer running on this host. Whole folders go
the same way (``remove_tree``): renamed aside in one step, then deleted; what a killed deletion
left is finished by the next launch in that folder (``finish_removals``). transformers' stored scans
(``llava_norm.worker.StoredScan``) keep their own write: private files (``mkstemp``'s mode 0600)
in a private folder.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
from pathlib import Path

REMOVING = ".removing-"  # a folder renamed aside to be deleted (remove_tree)


def write_atomically(path: str | Path, data: str | bytes, sole_writer: bool = False) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file and a rename; the path.
    ``sole_writer``: no other process writes ``path``, so the temporary files killed writers of it
    left are removed first (``clear_partial_writes``)."""
    path = Path(path)
    if sole_writer:
        clear_partial_writes(path)
    else:
        clear_partial_writes(path, dead_writers_only=True)
    partial = path.with_name(f"{_partial_prefix(path)}{_HOST}.{os.getpid()}.tmp")
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


def clear_partial_writes(path: str | Path, dead_writers_only: bool = False) -> None:
    """Remove the temporary files that killed writers of ``path`` left. Every one only where no
    other process writes ``path`` now (a live writer's would go too, and its rename fail);
    ``dead_writers_only``: those whose writer is not running on this host (a writer on another
    host, whose pid says nothing here, keeps its own)."""
    path = Path(path)
    prefix = _partial_prefix(path)
    for partial in path.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        writer = partial.name[len(prefix):-len(".tmp")]
        if _WRITER.fullmatch(writer) is None:  # another file's: ".a.json.old.host.pid.tmp" is a.json.old's
            continue
        if not dead_writers_only or _writer_gone(writer):
            partial.unlink(missing_ok=True)


def _writer_gone(writer: str) -> bool:
    """Whether the writer ``host.pid`` of a temporary file is a process of this host that has ended."""
    host, _, pid = writer.rpartition(".")
    if host != _HOST or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def remove_tree(folder: str | Path) -> None:
    """Delete ``folder``: renamed aside in one step (no half-deleted folder under its own name),
    then removed; a kill in between leaves the renamed one for ``finish_removals``."""
    folder = Path(folder)
    aside = folder.with_name(f"{REMOVING}{folder.name}.{_HOST}.{os.getpid()}")
    os.replace(folder, aside)
    shutil.rmtree(aside, ignore_errors=True)


def finish_removals(parent: str | Path) -> None:
    """Delete what killed ``remove_tree`` calls left renamed aside in ``parent``."""
    for aside in Path(parent).glob(f"{REMOVING}*"):
        shutil.rmtree(aside, ignore_errors=True)


def _partial_prefix(path: Path) -> str:
    """The name of each temporary file of ``path`` up to its writer's host and pid."""
    return f".{path.name}."


def _writer_host(hostname: str) -> str:
    """A host name as temporary files name their writer: without dots, so that the writer is
    "host.pid" with one dot, which tells it from the temporary of a file whose name continues
    this one's (a.json and a.json.old); never empty."""
    return hostname.replace("/", "_").replace(".", "_") or "host"


_HOST = _writer_host(socket.gethostname())
_WRITER = re.compile(r"[^.]+\.[0-9]+")
