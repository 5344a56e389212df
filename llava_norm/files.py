"""Replacing a file whole: a reader, or a process killed in the middle of the write, finds the old
file or the new one, never a part.

Owns the one way the package puts a small file in place (records, settings, markers, summaries,
re-serialised weights): the bytes go to a temporary file beside the target, named for the writing
process so that writers side by side never share one, and a rename puts it over the target, which
POSIX makes atomic within a file system. A write that fails removes its temporary file.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file and a rename; the path."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(partial, path)  # looked up at the call: the kill tests' stopper patches it
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path
