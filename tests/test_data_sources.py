"""Every kind of mixture entry through one loading path (llava_norm.data.sources / index):
LLaVA JSON with an image folder, parquet shards in the hub's layout (file, folder, glob), a hub
dataset id from the local cache; the same samples byte for byte; bad shards and rows under the
skip|error policy; the row index reused only when files, code and tokenizer match."""

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np

import pytest
import torch
from huggingface_hub import constants

from llava_norm.config import DataSource
from llava_norm.config_schema import ConfigError
from llava_norm.data import index as data_index
from llava_norm.data.conversation import conversation_tokenizer
from llava_norm.data.dataset import BadSampleError, SupervisedDataset
from llava_norm.model.builder import ModelSpec, build_model
from test_bad_data import BAD_IMAGES
from tinydata import write_dataset, write_next_dataset

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def bundle(tiny_dir):
    return build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama"))


def _dataset(bundle, *sources, policy="skip", estimate="tokens", system_prompt=None):
    encoder = conversation_tokenizer(bundle, "chat", {"date_string": "26 Jul 2024"})
    return SupervisedDataset(list(sources), encoder, bundle.image_processor, 256, on_bad_sample=policy,
                             length_estimate=estimate, system_prompt=system_prompt)


@pytest.fixture()
def corpus(tmp_path):
    data, images = write_dataset(tmp_path / "json", n=14, text_only_every=3)
    return data, images, write_next_dataset(data, images, tmp_path / "next", shards=3)


def _same_samples(a: SupervisedDataset, b: SupervisedDataset) -> None:
    assert len(a) == len(b) and a.modality_lengths.tolist() == b.modality_lengths.tolist()
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert (x.sample_id, x.input_ids, x.labels) == (y.sample_id, y.input_ids, y.labels)
        assert (x.pixel_values is None) == (y.pixel_values is None)
        assert x.pixel_values is None or torch.equal(x.pixel_values, y.pixel_values)


def _hub_cache(tmp_path, monkeypatch, snapshot_of) -> None:
    """A huggingface_hub cache holding dataset org/next at COMMIT (and main -> COMMIT), offline."""
    repo = tmp_path / "hub" / "datasets--org--next"
    shutil.copytree(snapshot_of, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_every_source_kind_gives_the_same_samples(bundle, corpus, tmp_path, monkeypatch):
    data, images, next_dir = corpus
    reference = _dataset(bundle, DataSource(path=str(data), image_folder=str(images)))
    assert len(reference) == 14 and not reference.rejected
    _hub_cache(tmp_path, monkeypatch, next_dir)
    for source in (DataSource(path=str(next_dir)), DataSource(path=str(next_dir / "data" / "train-*.parquet")),
                   DataSource(hub="org/next"), DataSource(hub="org/next", revision=COMMIT, config="default")):
        parquet = _dataset(bundle, source)
        _same_samples(reference, parquet)
        assert all(type(row.image).__name__ == "EmbeddedImage" for row in parquet.rows if row.image)
    monkeypatch.setattr(data_index, "PARALLEL_BYTES", 0)  # shards read by two processes: the order holds
    monkeypatch.setattr(data_index.os, "cpu_count", lambda: 2)
    _same_samples(_dataset(bundle, DataSource(path=str(data), image_folder=str(images)), system_prompt="Hi."),
                  _dataset(bundle, DataSource(path=str(next_dir)), system_prompt="Hi."))
    # a single shard and a share of the rows: the first 3 of the shard's rows, in order
    shard = sorted((next_dir / "data").glob("*.parquet"))[0]
    part = _dataset(bundle, DataSource(path=str(shard), take="first:3"))
    assert [row.row_id for row in part.rows] == [row.row_id for row in reference.rows][:3]


def test_a_take_past_a_sources_rows_takes_them_all_and_says_so(bundle, corpus, caplog):
    data, images, next_dir = corpus
    whole = _dataset(bundle, DataSource(path=str(data), image_folder=str(images)))
    n = len(whole.rows)
    with caplog.at_level(logging.WARNING, logger="llava_norm.data.dataset"):
        over = _dataset(bundle, DataSource(path=str(next_dir), take=f"first:{n + 3}"))
    assert [row.row_id for row in over.rows] == [row.row_id for row in whole.rows]
    assert f"key 'data.mixture[0].take': 'first:{n + 3}' asks for more rows than the source's {n}: the run takes " \
           f"all {n}" in caplog.text, caplog.text


def test_hub_id_errors_name_what_is_missing(bundle, corpus, tmp_path, monkeypatch):
    _hub_cache(tmp_path, monkeypatch, corpus[2])
    with pytest.raises(ConfigError, match=r"org/next@v9 is not in the local cache .*HF_HUB_OFFLINE"):
        _dataset(bundle, DataSource(hub="org/next", revision="v9"))
    with pytest.raises(ConfigError, match="cannot read its configs"):
        _dataset(bundle, DataSource(hub="org/next", config="nope"))
    with pytest.raises(ConfigError, match="has no split 'test'"):
        _dataset(bundle, DataSource(hub="org/next", split="test"))
    with pytest.raises(ConfigError, match="images are embedded; remove it"):
        _dataset(bundle, DataSource(path=str(corpus[2]), image_folder=str(corpus[1])))
    with pytest.raises(ConfigError, match="holds no parquet shards"):
        _dataset(bundle, DataSource(path=str(tmp_path / "hub" / "*.nothing")))


def test_bad_shards_and_rows_follow_the_policy(bundle, tmp_path):
    data, images = write_dataset(tmp_path / "json", n=8)
    rows = json.loads(data.read_text())
    rows[2]["conversations"][1]["from"] = "robot"  # breaks the rules: refused at load
    data.write_text(json.dumps(rows))
    (images / "0005.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")  # refused when drawn
    next_dir = write_next_dataset(data, images, tmp_path / "next", shards=2)
    shards = sorted((next_dir / "data").glob("*.parquet"))
    truncated = next_dir / "data" / "train-00002-of-00002.parquet"  # a download cut short: no footer
    truncated.write_bytes(shards[0].read_bytes()[:300])

    dataset = _dataset(bundle, DataSource(path=str(next_dir)))
    assert {(r["file"], r["row"], r["cause"]) for r in dataset.rejected} == {
        (str(shards[0]), "s2", "bad_conversation"), (str(truncated), "*", "shard_unreadable")}
    conversation = next(r for r in dataset.rejected if r["cause"] == "bad_conversation")["message"]
    assert conversation.startswith(f"{shards[0]}: row s2 (row 2): turn 1 has unknown role 'robot'")
    assert [row.row_id for row in dataset.rows] == ["s0", "s1", "s3", "s4", "s5", "s6", "s7"]
    drawn = dataset[4]  # s5's image does not decode: replaced by the next row, and recorded
    assert drawn.sample_id == "s6"
    assert [(r["file"], r["row"], r["cause"]) for r in drawn.skipped] == [(str(shards[1]), "s5", "image_corrupt")]
    assert "row 1), embedded image" in drawn.skipped[0]["message"]

    with pytest.raises(BadSampleError, match=r"row s2 \(row 2\): turn 1 has unknown role"):
        _dataset(bundle, DataSource(path=str(next_dir)), policy="error")
    truncated.unlink()
    shards[0].unlink()
    with pytest.raises(BadSampleError, match=r"s5: cannot decode image .*row 1\), embedded image"):
        _dataset(bundle, DataSource(path=str(next_dir)), policy="error")[1]


@pytest.mark.parametrize("cause", sorted(c for c in BAD_IMAGES if BAD_IMAGES[c] is not None))
def test_a_bad_embedded_image_is_replaced_and_recorded_by_its_cause(bundle, tmp_path, cause):
    """Each kind of bad image test_bad_data.py meets as a file, embedded in a parquet shard."""
    data, images = write_dataset(tmp_path / "json", n=4)
    (images / "0001.png").write_bytes(BAD_IMAGES[cause])
    next_dir = write_next_dataset(data, images, tmp_path / "next", shards=1)
    drawn = _dataset(bundle, DataSource(path=str(next_dir)))[1]
    assert drawn.sample_id == "s2" and [(r["row"], r["cause"]) for r in drawn.skipped] == [("s1", cause)]
    assert "embedded image" in drawn.skipped[0]["message"]


def test_index_is_reused_only_when_files_code_and_tokenizer_match(bundle, corpus, monkeypatch, capfd, tiny_dir):
    data, images, next_dir = corpus
    built = []

    def builds() -> int:  # the index is built in worker processes (one per shard run): count what they print
        built.append(capfd.readouterr().out.count("[llava-norm] data index (rank"))
        return sum(built)

    source = DataSource(path=str(next_dir))
    first = _dataset(bundle, source)
    assert builds() == 1
    _same_samples(first, _dataset(bundle, source))
    assert builds() == 1  # mapped from the cache
    _dataset(bundle, source, system_prompt="Be brief.")  # other token counts
    _dataset(bundle, source, estimate="words")  # no token counts
    assert builds() == 3
    rows = json.loads(data.read_text())
    rows[0]["conversations"][1]["value"] = "A different answer, longer than before."
    data.write_text(json.dumps(rows))
    write_next_dataset(data, images, next_dir, shards=3)  # the same shard names, new content
    changed = _dataset(bundle, source)
    assert builds() == 4
    assert changed.rows[0].messages[1]["content"] == "A different answer, longer than before."
    rules, read = Path(data_index.__file__).with_name("rows.py"), Path.read_bytes
    with monkeypatch.context() as edited:  # the row rules' code changed: one more byte in rows.py as read
        edited.setattr(Path, "read_bytes", lambda path: read(path) + (b"\n" if path == rules else b""))
        _dataset(bundle, source)
    assert builds() == 5
    shard = next((next_dir / "data").glob("*.parquet"))
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))  # an edit the sampled
    _dataset(bundle, source)                                   # fingerprint of a big file could miss
    assert builds() == 6
    other = build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama"))
    _dataset(other, source)
    assert builds() == 6  # the same tokenizer, loaded again
    other.tokenizer.add_tokens(["<not-in-the-data>"])  # another tokenizer, the same prompt settings
    _dataset(other, source)
    assert builds() == 7


def test_the_index_key_covers_every_module_of_the_row_rules_and_the_image_placement(corpus, monkeypatch, tmp_path):
    """Named here, not read from RULE_MODULES: the files whose code decides an index's rows and
    token counts, and the placement of <image> (which moves it in the counted text)."""
    from llava_norm.data.sources import resolve
    from llava_norm.provenance import FingerprintMemo

    data, images, _ = corpus
    source = resolve(DataSource(path=str(data), image_folder=str(images)), "data.mixture[0]")
    key = lambda placement="front": data_index.index_fingerprint(source, {"tokens": True}, placement,
                                                                 FingerprintMemo(tmp_path))
    before, read = key(), Path.read_bytes
    assert key() == before and key("keep") != before
    for name in ("rows.py", "sources.py", "index.py", "conversation.py", "prompts.py"):
        rules = Path(data_index.__file__).with_name(name)
        with monkeypatch.context() as edited:  # one more byte in the module as read
            edited.setattr(Path, "read_bytes", lambda path: read(path) + (b"\n" if path == rules else b""))
            assert key() != before, name


def test_memory_holds_positions_not_rows(bundle, corpus):
    """The rows stay in the memory-mapped index; the dataset keeps arrays of positions and lengths."""
    data, images, _ = corpus
    dataset = _dataset(bundle, DataSource(path=str(data), image_folder=str(images)))
    assert all(index.cache_files for index in dataset.indexes)  # memory-mapped from disk, not in memory
    held = {k: v for k, v in vars(dataset).items() if isinstance(v, (list, tuple, dict)) and len(v) >= len(dataset)}
    assert held == {} and isinstance(dataset.modality_lengths, np.ndarray)


def test_records_fingerprint_globs_and_hub_snapshots(tiny_dir, corpus, tmp_path, monkeypatch):
    """A run's provenance sees a changed shard behind a glob or a hub id (pipeline reuse rests on it)."""
    from llava_norm.config import load_config
    from llava_norm.provenance import differences
    from llava_norm.train.record import training_record

    data, images, next_dir = corpus
    _hub_cache(tmp_path, monkeypatch, next_dir)
    snapshot = tmp_path / "hub" / "datasets--org--next" / "snapshots" / COMMIT
    base = [f"model.vision_tower={tiny_dir}/siglip", f"model.llm={tiny_dir}/llama", f"train.output_dir={tmp_path}/out",
            "model.pretrained_projector=null"]

    def record(source: str):
        return training_record(load_config("configs/tiny/none/stage2.yaml", [*base, f"data.mixture=[{source}]"]), 1)

    by_glob, by_hub = record(f"{{path: '{next_dir}/data/*.parquet'}}"), record("{hub: org/next, revision: main}")
    assert by_hub.inputs["data.mixture.0.hub"]["path"] == str(snapshot)
    assert by_hub.config["data.mixture.0.revision"] == "main"
    shard = next((snapshot / "data").glob("*.parquet"))
    shard.write_bytes(shard.read_bytes() + b"\0")
    for shard in (next_dir / "data").glob("*.parquet"):
        shard.write_bytes(shard.read_bytes() + b"\0")
    assert [d.split(" (")[0] for d in differences(by_glob, record(f"{{path: '{next_dir}/data/*.parquet'}}"))] == [
        "input data.mixture.0.path changed"]
    assert [d.split(" (")[0] for d in differences(by_hub, record("{hub: org/next, revision: main}"))] == [
        "input data.mixture.0.hub changed"]


def test_an_image_folder_without_the_images_is_refused_at_load(bundle, tmp_path, caplog):
    """The 558K check of the image folder: none of the sampled images there is a config error
    (before any step), some missing a warning (those rows are skipped when drawn)."""
    data, images = write_dataset(tmp_path / "json", n=6)
    nested = tmp_path / "unzipped"
    (nested / "images").parent.mkdir()
    images.rename(nested / "images")  # the unzip added a level of folders
    with pytest.raises(ConfigError, match=r"data.mixture\[0\].image_folder': none of 6 images sampled .* under "):
        _dataset(bundle, DataSource(path=str(data), image_folder=str(nested)))
    (nested / "images" / "0003.png").unlink()
    with caplog.at_level("WARNING"):
        dataset = _dataset(bundle, DataSource(path=str(data), image_folder=str(nested / "images")))
    assert "1 of 6 images sampled" in caplog.text and len(dataset) == 6
    assert caplog.text.rstrip().endswith("rows without their image are skipped when drawn")
    caplog.clear()
    with caplog.at_level("WARNING"):  # the warning says what the policy will do
        _dataset(bundle, DataSource(path=str(data), image_folder=str(nested / "images")), policy="error")
    assert caplog.text.rstrip().endswith("the first row drawn without its image stops the run (data.on_bad_sample: error)")


def test_hub_layout_problems_are_named(bundle, corpus, tmp_path, monkeypatch):
    """A card whose row count the shards do not reach (a partial download), and a shard whose
    image column is not the hub's struct, follow the bad-sample policy like any bad input."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data, images, next_dir = corpus
    card = next_dir / "README.md"
    card.write_text(card.read_text().replace("num_examples: 14", "num_examples: 20"))
    _hub_cache(tmp_path, monkeypatch, next_dir)
    dataset = _dataset(bundle, DataSource(hub="org/next"))
    assert [(r["row"], r["cause"]) for r in dataset.rejected] == [("*", "rows_missing")] and len(dataset) == 14
    assert "the dataset card says 20 rows, its 3 shards in" in dataset.rejected[0]["message"]
    with pytest.raises(BadSampleError, match="hold 14: a partial download"):
        _dataset(bundle, DataSource(hub="org/next"), policy="error")

    odd = tmp_path / "odd" / "[v1] shards"  # brackets in a real folder name: not a glob
    odd.mkdir(parents=True)
    pq.write_table(pa.table({"id": ["x"], "conversations": [[{"from": "human", "value": "<image>\nhi"},
                                                              {"from": "gpt", "value": "yo"}]],
                             "image": [b"raw bytes"]}), odd / "part.parquet")
    shutil.copy(sorted((next_dir / "data").glob("*.parquet"))[0], odd / "good.parquet")
    dataset = _dataset(bundle, DataSource(path=str(odd)))
    assert [(r["row"], r["cause"]) for r in dataset.rejected] == [("*", "bad_columns")]
    assert "column 'image' is binary, not the hub's image struct" in dataset.rejected[0]["message"]

    hollow = tmp_path / "hollow"  # a shard of the hub's columns without a row, beside a good one
    hollow.mkdir()
    good = sorted((next_dir / "data").glob("*.parquet"))[0]
    shutil.copy(good, hollow / "a.parquet")
    pq.write_table(pq.read_schema(good).empty_table(), hollow / "b.parquet")
    dataset = _dataset(bundle, DataSource(path=str(hollow)))
    assert [(r["file"], r["row"], r["cause"]) for r in dataset.rejected] == [(str(hollow / "b.parquet"), "*", "no_rows")]
    assert len(dataset) == pq.ParquetFile(good).metadata.num_rows


def test_a_path_of_the_wrong_kind_is_named_for_what_it_is(corpus, tmp_path):
    """A new user's tries: a Markdown file, a folder of JSON files and parquet shards, each with an
    image_folder. Only the shards are said to be parquet (the file and the folder were too)."""
    from llava_norm.data.sources import resolve

    data, images, next_dir = corpus
    (tmp_path / "notes.md").write_text("# rows\n")
    with pytest.raises(ConfigError, match=r"^key 'm.path': \S+notes\.md is neither \.json/\.jsonl nor \.parquet"):
        resolve(DataSource(path=str(tmp_path / "notes.md"), image_folder=str(images)), "m")
    with pytest.raises(ConfigError, match=r"holds no parquet shards but JSON files: name each JSON file"):
        resolve(DataSource(path=str(data.parent), image_folder=str(images)), "m")
    with pytest.raises(ConfigError, match=r"^key 'm.image_folder': \S+ is parquet, whose images are embedded"):
        resolve(DataSource(path=str(next_dir), image_folder=str(images)), "m")
