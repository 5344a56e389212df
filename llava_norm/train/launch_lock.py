"""One launch at a time in a run's output folder.

Owns the folder's lock: a launch's global process 0 holds an exclusive ``flock`` on
``<output_dir>/.launch.lock`` from before it reads the folder until it leaves, and a second
launch into the same folder (a job submitted twice, a requeue that overlaps the job it
replaces) is refused in one line, instead of both training into one set of checkpoints. The
kernel drops the lock when its process ends, however it ends (a SIGKILL included), so a killed
launch never blocks the relaunch that resumes it. The file is created once and never written,
so a relaunch that has nothing to do changes nothing in the folder. A file system that takes no
lock (some cluster mounts) leaves the launch unguarded, which is logged. ``llava-norm check``
asks ``folder_in_use`` before a job is queued; a launch's own check does not (its process 0
holds the lock, and the other nodes' checks could not tell it from another launch's).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from llava_norm.config_checks import output_dir_problem
from llava_norm.config_schema import ConfigError
from llava_norm.train.relaunch import RelaunchError

log = logging.getLogger(__name__)
LOCK = ".launch.lock"


class FolderInUse(RelaunchError):
    """Another launch holds the run's output folder."""


def _locked(folder: Path):
    """The lock file, open and locked; None where another process holds it; False where the
    file system takes no lock."""
    handle = open(folder / LOCK, "a", encoding="utf-8")  # created once; never written
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    except OSError as error:  # ENOLCK, ENOSYS, EBADF: a mount without locks
        handle.close()
        log.info("%s: its file system takes no lock (%s): a second launch into it would not be refused",
                 folder, error)
        return False
    return handle


def _in_use(folder: Path) -> str:
    return (f"{folder}: another launch is training into this folder (it holds {LOCK}); wait for it to end, or "
            "give this launch another train.output_dir")


@contextlib.contextmanager
def sole_launch(output_dir: str | Path) -> Iterator[None]:
    """Hold ``output_dir``'s lock for the body (global process 0 only: the launch's other
    processes follow it); FolderInUse where another launch holds it."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    folder = Path(output_dir).resolve()
    problem = output_dir_problem(folder)  # before any stat below: one inside a folder this user cannot enter raises
    if problem:
        raise ConfigError(problem)
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # this folder and the parents it needs
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # what the check cannot foresee (a read-only mount, to root; /proc)
        raise ConfigError(f"key 'train.output_dir': {folder} cannot be made: {error.strerror}") from error
    handle = _locked(folder)
    if handle is None:
        raise FolderInUse(_in_use(folder))
    finished = False
    try:
        yield
        finished = True
    finally:
        if made and not finished and [p.name for p in folder.iterdir()] == [LOCK]:
            # a launch refused before it wrote anything (its launch check) leaves no folder behind,
            # nor the parents it made for it
            (folder / LOCK).unlink()
            for made_here in made:  # the folder first, then up
                with contextlib.suppress(OSError):  # another process wrote into a parent meanwhile
                    made_here.rmdir()
        if handle:
            handle.close()  # the lock goes with it


def folder_in_use(output_dir: str | Path) -> str | None:
    """Why a launch into ``output_dir`` would be refused now (another launch holds it), or None."""
    folder = Path(output_dir).resolve()
    if not (folder / LOCK).is_file():
        return None
    handle = _locked(folder)
    if handle is None:
        return _in_use(folder)
    if handle:
        handle.close()
    return None
