"""Backbone warm-up: both losses fall, outputs load like hub checkpoints, reruns are skipped."""

import json

import pytest
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, SiglipModel

from llava_norm.model.builder import ModelSpec, build_model
from llava_norm_demo.synth import build_world
from llava_norm_demo.warmup import REPORT, LoopConfig, WarmupConfig, warm_up
from llava_norm_demo.warmup.loop import MARKER

FAST = WarmupConfig(lm=LoopConfig(steps=8, batch_size=4, lr=3e-3, warmup_steps=2),
                    lm_block_tokens=64, vision=LoopConfig(steps=8, batch_size=8, lr=1e-3, warmup_steps=2))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    build_world(out, seed=0, n_pretrain=200, n_instruct=100, n_text=300, n_bench=4)
    return out


@pytest.fixture(scope="module")
def warmed(tiny_dir, world, tmp_path_factory):
    out = tmp_path_factory.mktemp("warm")
    return out, warm_up(tiny_dir, world, out, FAST)


def test_both_held_out_losses_fall_and_norms_are_reported(warmed):
    out, report = warmed
    assert set(report["backbones"]) == {"llama", "siglip"}
    for name, entry in report["backbones"].items():
        assert entry["after"]["loss"] < entry["before"]["loss"] - 0.1, (name, entry["before"], entry["after"])
        assert not entry["reused"]
    lm, vision = report["backbones"]["llama"], report["backbones"]["siglip"]
    assert lm["after"]["text_norm_T"] > 0 and len(lm["after"]["hidden_norm_per_layer"]) == 4  # embeddings + 3 layers
    assert vision["after"]["visual_norm_feature_layer"] == vision["after"]["visual_norm_per_layer"][-2]
    assert json.loads((out / REPORT).read_text())["backbones"]["llama"]["after"] == lm["after"]


def test_outputs_load_through_from_pretrained_and_build_a_llava(warmed, tiny_dir):
    out, _ = warmed
    lm = AutoModelForCausalLM.from_pretrained(out / "llama")
    tower = SiglipModel.from_pretrained(out / "siglip")
    # The weights changed from the random source, and the LLaVA builder takes them like hub ids.
    source = load_file(str(tiny_dir / "llama/model.safetensors"))
    assert any(not v.equal(lm.state_dict()[k]) for k, v in source.items() if k in lm.state_dict())
    assert tower.logit_bias.item() != 0.0
    bundle = build_model(ModelSpec(str(out / "siglip"), str(out / "llama"), norm_alignment="ln_textnorm_gwc"))
    assert bundle.model.config.text_norm == pytest.approx(
        json.loads((out / REPORT).read_text())["backbones"]["llama"]["after"]["text_norm_T"], rel=1e-5)


def test_rerun_is_skipped_and_a_changed_setting_or_stale_output_reruns(warmed, tiny_dir, world, tmp_path):
    out, first = warmed
    weights = out / "siglip/model.safetensors"
    stamp = weights.stat().st_mtime_ns
    again = warm_up(tiny_dir, world, out, FAST)
    assert all(entry["reused"] for entry in again["backbones"].values())
    assert weights.stat().st_mtime_ns == stamp
    assert again["backbones"]["siglip"]["after"] == first["backbones"]["siglip"]["after"]

    # Same seed into a fresh directory: bit-identical weights (the run is deterministic).
    fresh = tmp_path / "fresh"
    warm_up(tiny_dir, world, fresh, WarmupConfig(llms=(), vision=FAST.vision))
    assert load_file(str(fresh / "siglip/model.safetensors")).keys() == load_file(str(weights)).keys()
    assert all(v.equal(load_file(str(weights))[k]) for k, v in load_file(str(fresh / "siglip/model.safetensors")).items())

    # An output without its marker (interrupted) and a different step count are both redone.
    (fresh / "siglip" / MARKER).unlink()
    assert not warm_up(tiny_dir, world, fresh, WarmupConfig(llms=(), vision=FAST.vision))["backbones"]["siglip"]["reused"]
    longer = WarmupConfig(llms=(), vision=LoopConfig(steps=9, batch_size=8, lr=1e-3, warmup_steps=2))
    assert not warm_up(tiny_dir, world, fresh, longer)["backbones"]["siglip"]["reused"]


def test_unknown_backbone_and_missing_world_are_named(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match="clip"):
        WarmupConfig(towers=("clip",))
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        warm_up(tiny_dir, tmp_path / "no-world", tmp_path / "out", FAST)
