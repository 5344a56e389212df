"""llava_norm.files.write_atomically: the one way the package replaces a small file whole."""

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from llava_norm.files import clear_partial_writes, write_atomically

SIZE = 200_000
READS = 50  # of each writer's file
WRITES = 400  # by each writer at least


def test_writers_side_by_side_leave_one_whole_file_and_never_fail(tmp_path):
    """Two processes rewrite one record, each at least WRITES times and on until told to stop, while
    this one reads it until both are past WRITES and it has read each one's file READS times: every
    read is one writer's whole file, and neither writer's rename finds its temporary file taken by
    the other (as when both wrote through one shared name)."""
    target, stop = tmp_path / "provenance.json", tmp_path / "stop"
    write_atomically(target, "0" * SIZE)
    code = ("import os, sys\nfrom llava_norm.files import write_atomically\n"
            "path, mark, stop, done = sys.argv[1:]\nn = 0\n"
            f"while n < {WRITES} or not os.path.exists(stop):\n"
            f"    write_atomically(path, mark * {SIZE})\n"
            "    n += 1\n"
            f"    if n == {WRITES}: open(done, 'w').close()\n")
    done = {mark: tmp_path / f"done-{mark}" for mark in "ab"}
    writers = [subprocess.Popen([sys.executable, "-c", code, str(target), mark, str(stop), str(done[mark])],
                                stderr=subprocess.PIPE, text=True) for mark in "ab"]
    reads, deadline = Counter(), time.monotonic() + 120

    def enough() -> bool:
        return min(reads["a"], reads["b"]) >= READS and all(d.exists() for d in done.values())

    try:
        while not enough() and all(w.poll() is None for w in writers) and time.monotonic() < deadline:
            text = target.read_text()
            assert len(text) == SIZE and len(set(text)) == 1, f"a torn read: {len(text)} characters, {set(text)}"
            reads[text[0]] += 1
    finally:
        stop.touch()
        for w in writers:
            try:
                w.wait(timeout=60)
            finally:
                w.kill()  # a no-op for one that ended
        errors = [w.stderr.read() for w in writers]
    assert [w.returncode for w in writers] == [0, 0], errors
    assert enough(), reads  # the reads overlapped both writers' writes
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, stop.name, "done-a", "done-b"])


@pytest.mark.parametrize("fails", ["while_writing", "at_the_rename"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch, fails):
    """A full disk: half the bytes written to the temporary file, then ENOSPC; or the rename refused."""
    target = tmp_path / "settings.json"
    target.write_text("old")
    full = OSError(28, "No space left on device")
    real = Path.write_bytes

    def half_then_full(self, data):
        real(self, data[:len(data) // 2])
        assert self.exists() and self != target  # the temporary file, half-written
        raise full

    def refuse(src, dst):
        raise full

    if fails == "while_writing":
        monkeypatch.setattr(Path, "write_bytes", half_then_full)
    else:
        monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(target, "new" * 1000)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_clearing_partial_writes_removes_only_that_files_temporaries(tmp_path):
    target = tmp_path / "checkpoint_complete"
    left = [tmp_path / f".checkpoint_complete.{pid}.tmp" for pid in (123, 4567)]
    kept = [tmp_path / ".checkpoint_complete_other.1.tmp", tmp_path / "data_state.json"]
    for path in (*left, *kept):
        path.write_text("x")
    clear_partial_writes(target)
    assert sorted(tmp_path.iterdir()) == sorted(kept)


def test_the_bytes_reach_the_disk_before_the_rename(tmp_path, monkeypatch):
    """fsync of the temporary file, whole, then the rename: after a crash the name never points at
    bytes still in the page cache."""
    target, events = tmp_path / "train_summary.json", []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_atomically(target, "x" * 1000)
    partial = str(tmp_path / f".train_summary.json.{os.getpid()}.tmp")
    assert events == [("fsync", partial, 1000), ("replace", partial, str(target))]
