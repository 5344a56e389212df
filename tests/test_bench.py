"""The bench/ scripts' logic (never their timings): the GPU kit's CPU run (which runs gpu_step,
fused_loss and packing small), the FLOP model, padding count, the dry run's checks, data start-up."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import gpu_step  # noqa: E402
from llava_norm.plan import flops  # noqa: E402
import recipe_time  # noqa: E402
from _harness import random_llava  # noqa: E402
from padding import padding_share  # noqa: E402


def test_mfu_is_achieved_tflops_over_the_peak():
    # 494.7 TFLOP in one second on a 989.4 TFLOP/s device is half its peak (a unit slip gave 0.0%).
    tflops, mfu = gpu_step.achieved(494.7e12, 1.0, 989.4)
    assert tflops == pytest.approx(494.7) and mfu == pytest.approx(0.5)
    assert gpu_step.achieved(1e12, 2.0, None) == (0.5, None)


def _linear_weights(module: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


def test_flop_model_counts_the_model_weights():
    vision, text = gpu_step.toy_vision(), gpu_step.toy_llm()
    model = random_llava(vision, text, (vision.image_size // vision.patch_size) ** 2)
    layers, counted = flops.vision_matmul_params(vision, -2)
    tower = model.model.vision_tower
    assert layers == vision.num_hidden_layers - 1
    assert counted == (sum(_linear_weights(layer) for layer in tower.encoder.layers[:layers])
                       + tower.embeddings.patch_embedding.weight.numel())
    assert flops.llm_matmul_params(text) == (_linear_weights(model.model.language_model)
                                                + model.lm_head.weight.numel())


@pytest.mark.parametrize("make, tied, published", [(lambda: gpu_step.shipped(gpu_step.LLMS["llama-3.2-3b"]), True, 3.21e9),
                                                   (lambda: gpu_step.shipped(gpu_step.LLMS["qwen2.5-7b"]), False, 7.62e9),
                                                   (recipe_time.qwen2_5_0_5b, True, 0.494e9)])
def test_real_llm_configs_have_the_published_size(make, tied, published):
    text = make()
    embeddings = text.hidden_size * text.vocab_size * (1 if tied else 2)
    lm_head = text.hidden_size * text.vocab_size
    total = flops.llm_matmul_params(text) - lm_head + embeddings
    assert total == pytest.approx(published, rel=0.005)  # norms and biases are the rest


def test_padding_share_counts_pad_over_all_slots():
    lengths = np.array([3, 1, 2, 2, 5])
    # batches [3, 1] and [2, 2] (the partial [5] is dropped): 2 pad tokens in 10 slots
    assert padding_share([0, 1, 2, 3, 4], lengths, 2) == pytest.approx(2 / 10)
    assert padding_share([1, 2, 3, 0], lengths, 1) == 0.0


def test_recipe_shapes_are_the_published_models():
    layers, params = flops.vision_matmul_params(recipe_time.siglip_base_224(), -2)  # SigLIP-base tower: 86M
    assert layers == 11 and params == pytest.approx(86e6 * 11 / 12, rel=0.05)
    parts = recipe_time.chain_seconds(0.3)
    assert parts["stage 2"] > parts["stage 1"] > 0 and recipe_time.chain_seconds(0.15)["stage 2"] == pytest.approx(
        2 * parts["stage 2"])


def test_gpu_kit_toy_runs_every_part(tmp_path):
    """The kit's CPU smoke run: every part runs, the training part through llava-norm train, and
    the results file has each part's figures."""
    done = subprocess.run([sys.executable, str(BENCH / "gpu_kit.py"), "--toy", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (tmp_path / "gpu_kit.md").read_text()
    for part in ("gpu_step", "fused_loss", "packing", "train"):
        assert f"## {part}: ok" in report, report
    # each bench's own last lines, as the kit ran it
    step = (tmp_path / "gpu_step.log").read_text().strip().splitlines()
    for ckpt in ("off", "on"):
        assert any("toy sdpa batch 1x" in line and f"ckpt {ckpt}: step" in line and "tokens/s" in line
                   and ", plan " in line for line in step), step
    assert step[-1].startswith("MFU: n/a"), step
    loss = (tmp_path / "fused_loss.log").read_text().strip().splitlines()
    plain, fused = (next(line for line in loss if f" {kind}: peak" in line) for kind in ("plain", "fused"))
    assert plain.split("loss ")[1] == fused.split("loss ")[1]  # the same loss value from both paths
    assert loss[-1].startswith("target ") and "of 1 vocabularies" in loss[-1], loss
    packing = (tmp_path / "packing.log").read_text().strip().splitlines()
    assert packing[-1].startswith("row budget 4096 (2 x max_length): lowest fill"), packing
    assert "steps logged: 2;" in report  # the trainer ran its two steps and logged them
    assert "memory per GPU" in (tmp_path / "train.log").read_text()  # the launch printed its plan
    summary = json.loads((tmp_path / "train" / "run" / "train_summary.json").read_text())
    assert summary["complete"] and summary["global_step"] == 2
    planned = json.loads((tmp_path / "train_plan.json").read_text())
    assert planned["planned_peak_gib"] > 0 and planned["measured_peak_gib"] is None  # no CUDA here


@pytest.mark.parametrize("llm", ["llama", "qwen2"])
def test_dry_run_checks_hold_on_tiny_backbones(tiny_dir, llm):
    """bench/dry_run.py's checks (run at full width by hand: minutes) on the tiny backbones."""
    from dry_run import check_stack

    lines = check_stack(tiny_dir / "siglip", tiny_dir / llm, dtype="float32")
    assert len(lines) == 4 and lines[3].startswith("GWC at width")


def test_dry_run_gwc_check_fails_without_compensation(tiny_dir, monkeypatch):
    from dry_run import check_stack

    from llava_norm.model import norm_align

    monkeypatch.setattr(norm_align._ScaleGradient, "apply", staticmethod(lambda x, factor: x))
    with pytest.raises(AssertionError, match="not equal"):  # the GWC check, the only tensor comparison it breaks
        check_stack(tiny_dir / "siglip", tiny_dir / "llama", dtype="float32")


def test_data_startup_measures_a_rank_on_the_next_layout(tmp_path, tiny_dir, capsys):
    """bench/data_startup.py's pieces at a few rows (its timings are never asserted): the corpus
    is in the hub layout, a rank reaches its first batch, and both draw paths give samples."""
    import data_startup

    data_startup.write_corpus(tmp_path / "next", rows=40, shards=2)
    assert sorted(p.name for p in (tmp_path / "next" / "data").iterdir()) == [
        "train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    report = data_startup.rank(str(tmp_path / "next" / "data"), workers=0, tokenizer_dir=str(tiny_dir / "llama"))
    assert report["rows"] == 40 and report["batch_rows"] == 8 and report["mib"]["anon"] > 0
    json_ms, parquet_ms = data_startup.draw_cost(tmp_path, tiny_dir / "llama", rows=12, draws=4)
    assert json_ms > 0 and parquet_ms > 0 and "ms from parquet" in capsys.readouterr().out
