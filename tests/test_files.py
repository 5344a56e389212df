"""llava_norm.files.write_atomically: the one way the package replaces a small file whole."""

import os
import subprocess
import sys

import pytest

from llava_norm.files import write_atomically

SIZE = 200_000


def test_writers_side_by_side_leave_one_whole_file_and_never_fail(tmp_path):
    """Two processes rewrite one record over and over while this one reads it: every read is one
    writer's whole file, and neither writer's rename finds its temporary file taken by the other
    (as when both wrote through one shared temporary name)."""
    target = tmp_path / "provenance.json"
    write_atomically(target, "0" * SIZE)
    code = ("import sys\nfrom llava_norm.files import write_atomically\n"
            f"for _ in range(400): write_atomically(sys.argv[1], sys.argv[2] * {SIZE})")
    writers = [subprocess.Popen([sys.executable, "-c", code, str(target), mark], stderr=subprocess.PIPE, text=True)
               for mark in "ab"]
    seen = set()
    while any(w.poll() is None for w in writers):
        text = target.read_text()
        assert len(text) == SIZE and len(set(text)) == 1, f"a torn read: {len(text)} characters, {set(text)}"
        seen.add(text[0])
    errors = [w.stderr.read() for w in writers]
    assert [w.returncode for w in writers] == [0, 0], errors
    assert seen & {"a", "b"}  # the reads overlapped the writes
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "settings.json"
    target.write_text("old")

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
