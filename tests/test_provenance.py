"""Provenance records: fingerprints catch the changes that matter and ignore the ones that do
not, and a training record names every result-changing key and input."""

import json
import shutil

import pytest
import torch

from llava_norm import provenance
from llava_norm.config import load_config
from llava_norm.provenance import differences, environment_differences, fingerprint, make_record
from llava_norm.train.record import training_record
from tinydata import write_dataset


def test_small_file_fingerprint_is_its_content(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text('{"rope_theta": 500000.0}')
    b.write_text('{"rope_theta": 500001.0}')  # same size, one digit apart
    assert fingerprint(a) != fingerprint(b)
    shutil.copy(a, tmp_path / "moved.json")
    assert fingerprint(tmp_path / "moved.json") == fingerprint(a)  # where a file lives does not matter


def test_large_file_fingerprint_samples_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "WHOLE_FILE_BYTES", 1 << 20)
    data = bytearray(8 << 20)
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(data))
    base = fingerprint(path)
    data[0] = 1  # the header
    path.write_bytes(bytes(data))
    assert fingerprint(path) != base
    data[0] = 0
    data[len(data) // 2 + 1234] = 7  # inside no sampled block: a retrained file changes everywhere
    path.write_bytes(bytes(data))
    middle = fingerprint(path)
    assert middle == base  # the blind spot the sampling accepts, where it is
    step = (len(data) - 2 * provenance._EDGE) // (provenance.SAMPLED_BLOCKS + 1)
    data[provenance._EDGE + step] = 5  # inside the first sampled block between the edges
    path.write_bytes(bytes(data))
    assert fingerprint(path) != middle
    middle = fingerprint(path)
    data[-1] = 9  # the tail
    path.write_bytes(bytes(data))
    assert fingerprint(path) != middle
    path.write_bytes(bytes(data) + b"\0")  # the size
    assert fingerprint(path) != middle


def test_folder_fingerprint_sees_names_sizes_and_sampled_contents(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "WHOLE_FOLDER_FILES", 4)
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(10):
        (folder / f"{i:03d}.png").write_bytes(bytes([i]) * 100)
    base = fingerprint(folder)
    (folder / "003.png").rename(folder / "003b.png")
    assert fingerprint(folder) != base  # a renamed file
    (folder / "003b.png").rename(folder / "003.png")
    assert fingerprint(folder) == base
    (folder / "000.png").write_bytes(b"\xff" * 100)  # same size, sampled (the first of the sorted names)
    assert fingerprint(folder) != base
    (folder / "000.png").write_bytes(bytes([0]) * 100)
    (folder / "010.png").write_bytes(b"x")  # an added file
    assert fingerprint(folder) != base


def test_a_hub_id_without_a_local_copy_is_named_not_guessed():
    assert fingerprint("meta-llama/Llama-3.2-3B-Instruct").startswith("hub:meta-llama/Llama-3.2-3B-Instruct")
    with pytest.raises(FileNotFoundError, match="no such file"):
        fingerprint("/nonexistent/model")


def test_differences_name_keys_inputs_and_seed_but_not_code(tmp_path):
    data = tmp_path / "data.json"
    data.write_text("[1]")
    old = make_record("stage2", {"optim.lr": 1e-5, "train.epochs": 1}, {"data": data}, seed=1)
    same_elsewhere = tmp_path / "copy.json"
    shutil.copy(data, same_elsewhere)
    assert differences(old, make_record("stage2", {"optim.lr": 1e-5, "train.epochs": 1}, {"data": same_elsewhere},
                                        seed=1)) == []
    data.write_text("[2]")
    new = make_record("stage2", {"optim.lr": 2e-5, "train.epochs": 1}, {"data": data}, seed=2)
    found = differences(old, new)
    assert found[0] == "optim.lr: 1e-05 -> 2e-05"
    assert any(d.startswith("input data changed") for d in found) and "seed: 1 -> 2" in found
    other_code = {**new.environment, "source": "0" * 16, "libraries": {**new.environment["libraries"], "torch": "0"}}
    assert differences(new, make_record("stage2", new.config, {"data": data}, seed=2)) == []
    assert [d.split(":")[0] for d in environment_differences(other_code, new.environment)] == ["code", "torch"]
    # Another CPU's float kernels give other last bits: noted like a version.
    assert new.environment["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()
    other_cpu = {**new.environment, "cpu_kernels": "SOMETHING_ELSE"}
    assert environment_differences(other_cpu, new.environment) == [
        f"CPU float kernels: SOMETHING_ELSE -> {new.environment['cpu_kernels']}"]
    older = {k: v for k, v in new.environment.items() if k != "cpu_kernels"}  # records from before the field
    assert environment_differences(older, new.environment) == []


def test_training_record_separates_settings_inputs_and_operational_keys(tmp_path, tiny_dir):
    data, images = write_dataset(tmp_path / "data", n=4)
    base = [f"model.vision_tower={tiny_dir}/siglip", f"model.llm={tiny_dir}/llama",
            f"data.mixture=[{{path: {data}, image_folder: {images}}}]", f"train.output_dir={tmp_path}/out"]

    def record(*overrides, world=1):
        return training_record(load_config("configs/tiny/none/stage1.yaml", [*base, *overrides]), world)

    reference = record()
    assert set(reference.inputs) == {"model.vision_tower", "model.llm", "data.mixture.0.path",
                                     "data.mixture.0.image_folder", "train.deepspeed"}
    assert "train.output_dir" not in reference.config and "model.llm" not in reference.config
    # Where and how often to write never makes a run stale.
    assert differences(reference, record(f"train.output_dir={tmp_path}/elsewhere", "train.save_steps=7",
                                         "train.logging_steps=3", "data.num_workers=0")) == []
    assert [d.split(":")[0] for d in differences(reference, record("optim.lr=3e-4"))] == ["optim.lr"]
    assert [d.split(":")[0] for d in differences(reference, record(world=2))] == ["world_size"]
    rows = json.loads(data.read_text())
    data.write_text(json.dumps(rows[:-1]))
    assert [d.split(" (")[0] for d in differences(reference, record())] == ["input data.mixture.0.path changed"]


def test_the_code_version_covers_the_projects_sibling_packages():
    """The demo's guest wing is code that makes results too: a change to it changes the recorded
    source digest, like a change to the core."""
    from llava_norm.provenance import PACKAGE, source_digest, source_packages

    assert {p.name for p in source_packages()} >= {"llava_norm", "llava_norm_demo"}
    before = source_digest()
    probe = PACKAGE.parent / "llava_norm_demo" / "_digest_probe.py"
    try:
        probe.write_text("X = 1\n")
        assert source_digest() != before
    finally:
        probe.unlink()
    assert source_digest() == before


def test_a_table_row_is_marked_where_its_checkpoint_data_or_training_record_no_longer_holds(tmp_path):
    """``llava-norm table`` re-checks each row (README, Provenance): the checkpoint and the
    benchmark files still have the fingerprints the result was computed from, and the training
    record beside the checkpoint is complete and names it. Each is broken here in turn."""
    from llava_norm.evaluation.sources import row_source

    run, data = tmp_path / "run", tmp_path / "pope.parquet"
    model, weights = run / "model", run / "model" / "model.safetensors"
    model.mkdir(parents=True)
    weights.write_bytes(b"weights")
    data.write_bytes(b"items")
    record = make_record("stage2", {"train": {"max_steps": 2}}, {})
    record.complete, record.outputs = True, {"model": fingerprint(model)}
    provenance.write_record(run, record)
    results = {"pope": {"settings": {"checkpoint": str(model), "checkpoint_fingerprint": fingerprint(model),
                                     "data_path": str(data), "data_fingerprint": fingerprint(data)},
                        "environment": {}, "finished": "2026-11-29"}}

    def marks(**where) -> list[str]:
        return row_source("run", results, **where).marks

    assert marks() == []
    weights.write_bytes(b"weights, trained on")
    assert marks() == ["stale: the checkpoint changed after it was evaluated"]
    weights.write_bytes(b"weights")
    data.write_bytes(b"other items")
    assert marks() == ["stale: pope data changed after it was evaluated"]
    data.write_bytes(b"items")
    moved = data.rename(tmp_path / "moved.parquet")
    assert marks() == [f"pope data {data} not found: cannot be verified"]
    assert marks(data={"pope": moved}) == []  # where the pipeline says the files are now
    moved.rename(data)
    record.complete = False
    provenance.write_record(run, record)
    assert marks() == ["the training record is incomplete (an interrupted run)"]
    record.complete, record.outputs = True, {"model": "another"}
    provenance.write_record(run, record)
    assert marks() == ["stale: the training record names another checkpoint"]
    (run / provenance.RECORD).unlink()
    assert marks() == [f"no training record ({run / 'provenance.json'})"]
    shutil.move(model, tmp_path / "elsewhere")
    assert marks() == [f"checkpoint {model} not found: cannot be verified"]
    # one row, two models: a benchmark evaluated on another checkpoint than the rest
    results["ai2d"] = {**results["pope"], "settings": {**results["pope"]["settings"], "checkpoint_fingerprint": "other"}}
    assert marks()[0] == "benchmarks evaluated on 2 different checkpoints", marks()
