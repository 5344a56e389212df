"""Shard fingerprints kept between starts (``provenance.FingerprintMemo``): a warm start's index key
is taken without reading any shard (the files the fingerprinting opens are counted); a change of
size, modification time or inode fingerprints a shard anew."""

import os
import shutil
from pathlib import Path

from llava_norm import provenance
from llava_norm.data.index import index_fingerprint
from llava_norm.data.sources import ResolvedSource
from llava_norm.provenance import FingerprintMemo, file_fingerprint


def _shards(folder: Path, n: int = 3, size: int = 17 << 20) -> list[Path]:
    folder.mkdir()
    paths = []
    for i in range(n):  # above WHOLE_FILE_BYTES: sampled, as the hub's shards are
        path = folder / f"train-{i:05d}.parquet"
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths


def _reads(monkeypatch) -> list[Path]:
    """Every file the fingerprinting opens from here on."""
    opened = []
    real = provenance.file_fingerprint

    def counting(path):
        opened.append(path)
        return real(path)

    monkeypatch.setattr(provenance, "file_fingerprint", counting)
    return opened


def test_a_warm_start_reads_no_shard_and_gets_the_same_index_key(tmp_path, monkeypatch):
    source = ResolvedSource("parquet", tuple(_shards(tmp_path / "shards")))
    opened = _reads(monkeypatch)
    cold = index_fingerprint(source, {"count_tokens": False}, memo=FingerprintMemo(tmp_path / "cache"))
    assert sorted(opened) == sorted(source.files)
    opened.clear()
    for _ in range(2):  # later starts: each a new memo read from disk, as another process's would be
        assert index_fingerprint(source, {"count_tokens": False}, memo=FingerprintMemo(tmp_path / "cache")) == cold
    assert opened == []


def test_a_changed_size_time_or_inode_is_fingerprinted_anew(tmp_path, monkeypatch):
    first, second, third = _shards(tmp_path / "shards", size=1 << 20)
    memo = FingerprintMemo(tmp_path / "cache")
    for path in (first, second, third):
        memo.fingerprint(path)
    memo.save()
    opened = _reads(monkeypatch)
    os.utime(first, ns=(first.stat().st_atime_ns, first.stat().st_mtime_ns + 10**9))  # touched
    with open(second, "ab") as handle:  # grown
        handle.write(b"x")
    copy = tmp_path / "copy"
    shutil.copy2(third, copy)
    os.replace(copy, third)  # same bytes, size and time: a new inode, as a re-download gives
    memo = FingerprintMemo(tmp_path / "cache")
    values = [memo.fingerprint(p) for p in (first, second, third)]
    assert opened == [first, second, third]
    assert values == [file_fingerprint(p) for p in (first, second, third)]


def test_a_torn_memo_is_rebuilt_and_interleaved_savers_keep_each_others_entries(tmp_path):
    """Two memos opened before either saves (two processes' starts), saved one after the other: the
    second save keeps the first's entries. Saves at the same instant are not tested: the later
    replace wins, and the lost entries are fingerprinted again at the next start."""
    a, b = _shards(tmp_path / "shards", n=2, size=1000)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / provenance.MEMO_NAME).write_text('{"half a rec')
    one, two = FingerprintMemo(tmp_path / "cache"), FingerprintMemo(tmp_path / "cache")
    assert one.entries == {}
    one.fingerprint(a)
    two.fingerprint(b)
    one.save()
    two.save()
    warm = FingerprintMemo(tmp_path / "cache")
    assert warm.fingerprint(a) == file_fingerprint(a) and warm.fingerprint(b) == file_fingerprint(b)
    assert warm.computed == 0
