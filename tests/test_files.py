"""llava_norm.files.write_atomically: the one way the package replaces a small file whole."""

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from llava_norm.files import _HOST, clear_partial_writes, finish_removals, remove_tree, write_atomically

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
    """Its own writers' temporaries only: not those of a file whose name starts as its own does,
    with or without a dot after it (checkpoint_complete_other, checkpoint_complete.old)."""
    target = tmp_path / "checkpoint_complete"
    left = [tmp_path / f".checkpoint_complete.{host}.{pid}.tmp" for host, pid in ((_HOST, 123), ("node-7", 4567))]
    kept = [tmp_path / f".checkpoint_complete_other.{_HOST}.1.tmp", tmp_path / f".checkpoint_complete.old.{_HOST}.1.tmp",
            tmp_path / "data_state.json"]
    for path in (*left, *kept):
        path.write_text("x")
    clear_partial_writes(target)
    assert sorted(tmp_path.iterdir()) == sorted(kept)


def test_a_cluster_hosts_dotted_name_still_names_one_writer():
    """On a node named node01.cluster.local (or with no name at all) a writer's temporaries still
    match its file's, so the next write clears what a killed one left."""
    from llava_norm.files import _WRITER, _writer_host

    for hostname in ("node01.cluster.local", "", "a/b.c"):
        assert _WRITER.fullmatch(f"{_writer_host(hostname)}.4242"), hostname


def test_a_write_removes_the_temporaries_its_files_dead_writers_left_and_no_other(tmp_path):
    """A writer killed before its rename leaves its temporary file, named by host and pid: the next
    write of that file removes it where the pid has ended on this host, and keeps a running
    writer's and another host's (whose pid says nothing here)."""
    target, host = tmp_path / "provenance.json", _HOST
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    dead = tmp_path / f".provenance.json.{host}.{int(ended.stdout)}.tmp"
    running = tmp_path / f".provenance.json.{host}.{os.getppid()}.tmp"
    elsewhere = tmp_path / f".provenance.json.other-node.{int(ended.stdout)}.tmp"
    for partial in (dead, running, elsewhere):
        partial.write_text("half")
    write_atomically(target, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, running.name, elsewhere.name])


def test_a_folder_is_removed_aside_and_a_killed_removal_is_finished_later(tmp_path, monkeypatch):
    """remove_tree renames the folder aside in one step, so a kill during the deletion leaves no
    half folder under its own name (a checkpoint without its marker, kept for good); the next
    launch's finish_removals deletes what is left aside."""
    folder = tmp_path / "checkpoint-5"
    (folder / "global_step5").mkdir(parents=True)
    (folder / "global_step5" / "optim_states.pt").write_bytes(b"x" * 100)
    (folder / "checkpoint_complete").write_text("5")

    def killed(path, ignore_errors=False):  # the deletion cut short, as by a kill
        (Path(path) / "checkpoint_complete").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        remove_tree(folder)
    monkeypatch.undo()
    assert not folder.exists()
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".removing-checkpoint-5."), left
    finish_removals(tmp_path)
    assert not list(tmp_path.iterdir())


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
    partial = str(tmp_path / f".train_summary.json.{_HOST}.{os.getpid()}.tmp")
    assert events == [("fsync", partial, 1000), ("replace", partial, str(target))]
