"""The bench/ scripts' logic (never their timings): the GPU kit's CPU run (which runs gpu_step,
fused_loss and packing small), the FLOP model, padding count, the dry run's checks, data start-up."""

import json
import os
import re
import subprocess
import sys
import time
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


# Imported by a library only when installed (pandas: pytz; anyio, httpcore2: sniffio), so their
# absence on the GPU machine breaks nothing.
IMPORTED_WHEN_PRESENT = {"pytz", "sniffio"}


def _names(path: Path) -> set[str]:
    return {re.split(r"[=<>\s]", line.strip())[0].lower().replace("_", "-")
            for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def test_gpu_kit_toy_runs_every_part_and_imports_only_what_the_gpu_machine_has(tmp_path):
    """The kit's CPU run: every part of both halves, the training part through llava-norm train, a
    results file with each part's figures; and every distribution any of its processes imported is
    on the GPU machine's list or among the carried wheels (a missing one would fail the GPU run)."""
    imports = tmp_path / "imports"
    imports.mkdir()
    # one intra-op thread, as every launch in the suite: OpenMP threads beyond the cores the other
    # test workers leave free spin while they wait for each other
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KIT_RECORD_IMPORTS": str(imports),
           "PYTHONPATH": os.pathsep.join([str(BENCH / "kit_imports"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(BENCH / "gpu_kit.py"), "--toy", "--out", str(tmp_path / "out"),
                           "--work", str(tmp_path / "work")], capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_kit.json").read_text())
    assert list(report["parts"]) == ["step_llama", "liger_llama", "fused_loss", "train", "step_qwen", "liger_qwen"]
    assert all(part["status"] == "ok" for part in report["parts"].values()), report["parts"]
    steps = report["parts"]["step_llama"]["results"]
    assert {(r["packed"], r["checkpointing"]) for r in steps} == {(False, False), (False, True), (True, False)}
    assert all(r["tokens_per_s"] > 0 and r["error"] is None and r["shares"] for r in steps)
    # the fixed rows ran compiled and eager, two accumulated micro-batches a step
    assert {(r["compiled"], r["accum"]) for r in steps if not r["rows"].endswith("micro-batches")} == \
        {(True, 2), (False, 2)}
    packed = next(r for r in steps if r["packed"])
    check = packed["packing_logit_error"]  # taken on the fresh model: real logits, not NaN read as 0
    assert check["samples"] >= 2 and check["max_logit"] > 0 and check["relative"] < 1e-2
    assert report["parts"]["liger_llama"]["results"][0]["error"] == "Liger's Triton kernels need CUDA"
    loss = report["parts"]["fused_loss"]["results"]
    assert [r["kernel"] for r in loss] == ["torch"] and loss[0]["memory_ratio"] > 0
    train = report["parts"]["train"]["results"]
    assert train[0]["steps_logged"] == 2 and train[0]["planned_peak_gib"] > 0
    assert train[0]["measured_peak_gib"] is None  # no CUDA here
    markdown = (tmp_path / "out" / "gpu_kit.md").read_text()
    assert "## train: ok" in markdown and "| qwen0.5b_zero2 | 2 x " in markdown

    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    local = {p.stem for p in BENCH.glob("*.py")} | {"llava_norm", "llava_norm_demo", "sitecustomize", "__main__"}
    modules = set().union(*(set(f.read_text().split()) for f in imports.glob("*.txt")))
    assert len(list(imports.glob("*.txt"))) >= 5 and "deepspeed" in modules  # the trainer's process recorded too
    available = _names(BENCH / "gpu_machine_packages.txt") | _names(BENCH / "gpu_kit_wheels.txt") | {"llava-norm"}
    # a module is there when any distribution that provides it is ("google" is protobuf's and others')
    lacking = {m: owners[m] for m in modules - local - set(sys.stdlib_module_names) - IMPORTED_WHEN_PRESENT
               if m in owners and not {d.lower().replace("_", "-") for d in owners[m]} & available}
    lacking.update({m: [d] for m, d in __import__("gpu_kit").GPU_IMPORTS.items() if d not in available})
    assert "datasets" in modules and not lacking, lacking


def test_gpu_kit_stops_at_once_naming_a_missing_package(tmp_path):
    code = ("import sys, gpu_kit; gpu_kit.NEEDED += ('not_a_carried_module',); "
            f"sys.argv = ['gpu_kit.py', '--toy', '--out', r'{tmp_path}']; gpu_kit.main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=BENCH, timeout=120)
    assert done.returncode == 1 and "missing packages, nothing run: not_a_carried_module" in done.stderr
    assert not (tmp_path / "gpu_kit.json").exists()
    wheels = subprocess.run(["bash", str(BENCH / "gpu_kit.sh"), "--toy"], capture_output=True, text=True,
                            env={**os.environ, "KIT_WHEELS": str(tmp_path / "none")}, timeout=60)
    assert wheels.returncode == 2 and "no wheels in" in wheels.stderr


def test_a_kit_part_at_its_limit_keeps_its_results_and_leaves_no_process(tmp_path):
    import gpu_kit

    pidfile = tmp_path / "grandchild.pid"
    child = ("import subprocess, time; p = subprocess.Popen(['sleep', '120']); "
             f"open(r'{pidfile}', 'w').write(str(p.pid)); "
             "print('KIT-RESULT {\"step\": 1}', flush=True); time.sleep(120)")
    report = gpu_kit.Report(tmp_path / "out", {"kit": "test", "environment": {"date": "today"}})
    code = gpu_kit.run_part("part", [sys.executable, "-c", child], 3, report, tmp_path / "part.log")
    assert code == 124
    saved = json.loads((tmp_path / "out" / "gpu_kit.json").read_text())["parts"]["part"]
    assert saved["status"] == "stopped at its limit" and saved["results"] == [{"step": 1}]
    grandchild = int(pidfile.read_text())
    time.sleep(0.5)
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]


def test_a_kit_trainer_run_gets_only_the_time_its_backbones_left(tmp_path, monkeypatch):
    """The train part's time runs from its start: writing a run's backbones (minutes at the 7B)
    comes out of the run's limit, and a run with under 30 s left after it is not launched."""
    import gpu_kit

    clock, limits = [1000.0], []
    monkeypatch.setattr(gpu_kit.time, "monotonic", lambda: clock[0])

    def setup(run, work, toy, overrides):
        clock[0] += 100  # the backbones of this run
        return tmp_path / f"{run.name}.yaml", None

    def part(name, command, limit_s, report, log):
        limits.append(limit_s)
        return 0

    monkeypatch.setattr(gpu_kit, "train_setup", setup)
    monkeypatch.setattr(gpu_kit, "run_part", part)
    monkeypatch.setattr(gpu_kit, "figures_after", lambda *args: {"steps_logged": 20})
    report = gpu_kit.Report(tmp_path / "out", {"kit": "test", "environment": {"date": "today"}})
    names = [run.name for run in gpu_kit.TRAIN_RUNS[:2]]
    assert gpu_kit.run_train(report, tmp_path, tmp_path / "out", 300, False, names, []) == 0
    assert limits == [200.0, 100.0]  # 300 s less each run's 100 s of backbones (the runs themselves take none here)
    code = gpu_kit.run_train(report, tmp_path, tmp_path / "out", 120, False, names[:1], [])
    assert code == 124 and limits == [200.0, 100.0]  # 20 s left after the backbones: not launched
    assert report.data["parts"]["train"]["results"][-1]["error"] == "not run: its backbones took the part's time"


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
    with pytest.raises(AssertionError, match="GWC check: the gradient into the projector is not"):
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


def test_each_kit_trainer_run_config_says_what_the_run_names(tmp_path):
    """The kit's trainer runs' YAML, loaded as `llava-norm train` loads it: the ZeRO stage, the
    micro-batch, checkpointing, compile and the loss each run's entry names."""
    import _kit_train

    from llava_norm.config import load_config

    for run in _kit_train.TRAIN_RUNS:
        path = tmp_path / f"{run.name}.yaml"
        path.write_text(_kit_train._config_text(run, run.vision, run.llm, tmp_path, tmp_path, "stage2.yaml", 20))
        t = load_config(path, check_paths=False).train
        assert (t.deepspeed.endswith(f"zero{run.zero}.json"), t.per_device_batch_size, t.gradient_checkpointing,
                t.compile, t.loss) == (True, run.batch, run.checkpointing, run.compile, run.loss), run.name
    assert {r.loss for r in _kit_train.TRAIN_RUNS} == {"plain", "fused"}


def test_a_kit_run_stopped_after_its_complete_summary_keeps_its_figures(tmp_path):
    """A trainer run the kit stopped at its limit (exit 124) has figures only if it wrote its
    complete summary first; without one, with an incomplete one, or with one older than its launch,
    it is an error. The plan beside a run's peak is planned with the overrides the run was given."""
    import json
    import time

    import _kit_train

    run = _kit_train.TRAIN_RUNS[1]  # llama3b_zero2: planned from its shipped backbone configs
    path = tmp_path / f"{run.name}.yaml"
    path.write_text(_kit_train._config_text(run, run.vision, run.llm, tmp_path, tmp_path, "stage2.yaml", 20))
    assert _kit_train.figures_after(run, path, 124) == {"error": "exit 124"}  # no summary
    summary = tmp_path / "runs" / run.name / "train_summary.json"
    summary.parent.mkdir(parents=True)
    steps = [{"step": i, "tokens": 4000, "tokens_per_second": 4000.0, "longest_row": 1000, "peak_memory_gib": 72.0}
             for i in range(1, 21)]
    summary.write_text(json.dumps({"complete": False, "log_history": steps}))
    assert _kit_train.figures_after(run, path, 124) == {"error": "exit 124"}
    summary.write_text(json.dumps({"complete": True, "log_history": steps}))
    # an earlier run's summary, left by a launch stopped before it cleared the folder, is not this run's
    assert _kit_train.figures_after(run, path, 124, launched=time.time() + 60) == {"error": "exit 124"}
    figures = _kit_train.figures_after(run, path, 124, launched=time.time() - 60)
    assert figures["note"] == "stopped at its limit after writing its complete summary"
    assert figures["measured_peak_gib"] == 72.0 and figures["tokens_per_s"] == 4000.0 and "meets" in figures
    # the plan beside it is the plan of what ran: the trainer's overrides too (no DeepSpeed: DDP's layout)
    assert figures["planned_layout"] == "zero2"
    plain = _kit_train.figures_after(run, path, 0, ("train.deepspeed=null",))
    assert plain["planned_layout"] == "ddp" and plain["planned_peak_gib"] != figures["planned_peak_gib"]
