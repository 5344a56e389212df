"""scripts/pipeline.sh on tiny configs: two arms through stage 1 -> stage 2 -> eval -> table,
and a second invocation that reuses every finished step."""

import csv
import subprocess

from launch import REPO, env
from tinydata import write_dataset

from llava_norm.synth import build_world


def test_pipeline_trains_evaluates_and_tabulates_two_arms_then_reuses_them(tmp_path, tiny_dir):
    world = tmp_path / "world"
    build_world(world, seed=5, n_pretrain=10, n_instruct=10, n_text=20, n_bench=4, bench_sizes={"pope": 2})
    data, images = write_dataset(tmp_path / "data", n=8, text_only_every=4)
    # The tiny configs, pointed at this test's backbones and data; one process without
    # DeepSpeed keeps it quick (the multi-process paths have their own tests).
    common = [f"model.vision_tower={tiny_dir}/siglip", f"model.llm={tiny_dir}/llama",
              f"data.mixture=[{{path: {data}, image_folder: {images}}}]", "train.max_steps=2",
              "train.deepspeed=null", "train.per_device_batch_size=2", "train.save_steps=2"]
    runs = tmp_path / "runs"
    command = ["bash", "scripts/pipeline.sh", "--runs", str(runs), "--data-root", str(world / "benchmarks"),
               "--benchmarks", "pope,ai2d,mmlu", "--eval-arg=--limit=2", "--eval-arg=--max-new-tokens-cap=4",
               *[f"--stage1={o}" for o in common], *[f"--stage2={o}" for o in common],
               "configs/tiny/none", "configs/tiny/ln_textnorm_gwc"]
    environment = {**env(), "GPUS_PER_NODE": "1"}
    first = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]

    rows = list(csv.DictReader((runs / "results.csv").open()))
    assert [r["run"] for r in rows] == ["none", "ln_textnorm_gwc"]
    assert rows[0]["is_baseline"] == "True" and float(rows[0]["pope_delta"]) == 0.0
    assert {"pope", "ai2d", "mmlu", "average"} <= set(rows[0])
    assert "| ln_textnorm_gwc |" in (runs / "results.md").read_text()
    for arm in ("none", "ln_textnorm_gwc"):
        assert (runs / arm / "stage2/model/model.safetensors").exists()
        assert (runs / arm / "stage1.log").exists()

    second = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    statuses = [line.split()[-3] for line in second.stdout.splitlines() if line.strip().endswith(" s")]
    assert statuses == ["reused"] * 6 + ["done"], second.stdout
