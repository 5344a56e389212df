"""``llava-norm check``: every problem a launch would meet, one line each, before a job is queued;
and ``train`` stopping on the same problems before anything loads."""

import json
import os
import re
import subprocess
import shutil
import sys
import time

import pytest

from launch import REPO, env
from tinydata import write_dataset, write_next_dataset

from llava_norm.train.preflight import preflight


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("check")
    data, images = write_dataset(root / "data", n=8, text_only_every=4)
    shards = write_next_dataset(data, images, root / "next", shards=2) / "data"
    config = root / "stage2.yaml"
    config.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: ln_textnorm_gwc}}
data: {{mixture: [{{path: "${{oc.env:CHECK_DATA,/nowhere}}/data.json", image_folder: {images}}}, {{path: {shards}}}],
       prompt_format: chat, max_length: 256}}
train: {{stage: 2, per_device_batch_size: 2, global_batch_size: 8, deepspeed: {REPO}/configs/deepspeed/zero2.json,
        output_dir: {root}/out, report_to: []}}
""")
    return root, config, data, images, shards


@pytest.fixture(scope="module")
def projector(tmp_path_factory):
    """Overrides naming a stage-1 projector file of the world's arm (its tensors' names, as the
    config checks read them; its origin not recorded, so allowed by the config)."""
    import torch
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("projector") / "projector.safetensors"
    save_file({f"model.multi_modal_projector.{name}.weight": torch.zeros(1) for name in ("linear_1", "linear_2", "norm")},
              str(path))
    return [f"model.pretrained_projector={path}", "model.allow_projector_mismatch=true"]


def test_a_good_launch_passes_with_a_summary(world, monkeypatch, projector):
    """Also: stage 2 without a stage-1 projector is said as a warning (it trains from a random
    projector and norm layer, silently before)."""
    root, config, data, _, _ = world
    monkeypatch.setenv("CHECK_DATA", str(data.parent))
    random_start = preflight(config, [], gpus=2, plan=False)
    assert random_start.ok and random_start.warnings == [
        f"{config}: key 'model.pretrained_projector' is unset: stage 2 starts the projector and norm layer from "
        "random weights, without stage 1's pretraining (give stage 1's projector.safetensors)"]
    report = preflight(config, projector, gpus=2, gpu_memory_gib=80)
    assert report.ok, report.problems
    text = "\n".join(report.summary)
    assert "world size 2 (1 node(s) x 2 GPUs), gradient accumulation 2, global batch 8" in text
    assert "data: 16 rows taken from 2 source(s)" in text  # 8 JSON rows + the same 8 in the shards
    assert re.search(r"plan: peak \S+ \S+ per GPU \(fits 80\.0 GiB\); host memory at start-up about \S+ \S+ per node$",
                     text, re.M), text  # the fit beside the peak it is of
    assert not report.warnings, report.warnings
    saves_none = preflight(config, [*projector, "train.save_steps=0"], gpus=2, gpu_memory_gib=80, plan=False)
    assert saves_none.ok and any("'train.save_steps': 0 writes no checkpoint" in w for w in saves_none.warnings)


def test_every_problem_is_one_line_naming_its_key_file_or_variable(world, monkeypatch, tmp_path):
    root, config, data, images, shards = world
    monkeypatch.delenv("CHECK_DATA", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    broken = tmp_path / "shards"
    broken.mkdir()
    for shard in shards.iterdir():
        broken.joinpath(shard.name).write_bytes(shard.read_bytes()[:99])  # a download cut short
    empty = tmp_path / "no_images"
    empty.mkdir()
    report = preflight(config, ["model.norm_alignment=ln_textnormx"], gpus=1)
    assert len(report.problems) == 1 and "key 'model.norm_alignment'" in report.problems[0]  # nothing else is read
    # every key the config refuses, not only the first
    report = preflight(config, ["model.norm_alignment=ln_textnormx", "optim.warmup=0.1", "train.max_step=3"], gpus=1)
    assert [p.split("key ")[1].split(":")[0] for p in report.problems] == \
        ["'model.norm_alignment'", "'optim.warmup'", "'train.max_step'"], report.problems
    # and only those: an override valid beside a later one is none, a clash of two is one problem
    stage1 = tmp_path / "stage1.yaml"
    stage1.write_text(config.read_text().replace("stage: 2", "stage: 1").replace(f"output_dir: {root}/out, ", ""))
    assert "output_dir" not in stage1.read_text()  # set by the last override only
    report = preflight(stage1, ["lora.enabled=true", "train.stage=2", "optim.warmupx=1",
                                f"train.output_dir={tmp_path}/out"], gpus=1, plan=False)
    assert [p.split("key ")[1].split(":")[0] for p in report.problems] == ["'optim.warmupx'"], report.problems
    # without the stage, the check between keys speaks for lora.enabled, beside the typo
    report = preflight(stage1, ["lora.enabled=true", "optim.warmupx=1", f"train.output_dir={tmp_path}/out"], gpus=1,
                       plan=False)
    assert [p.split("key ")[1].split(":")[0] for p in report.problems] == ["'lora.enabled'", "'optim.warmupx'"], \
        report.problems
    typos = tmp_path / "typos.yaml"  # and every key a file refuses, not only the first
    typos.write_text(f"base: {config}\nmodel: {{norm_aligment: ln_textnorm}}\ntrain: {{max_step: 3, logging_steps: abc}}\n")
    report = preflight(typos, ["optim.lr=1e-3"], gpus=1, plan=False)
    assert [p.split("key ")[1].split(":")[0] for p in report.problems] == \
        ["'model.norm_aligment'", "'train.max_step'", "'train.logging_steps'"], report.problems
    assert all(p.startswith(f"{typos}: key ") for p in report.problems), report.problems
    # and, on what merges, every value outside its choices or range, not only the first (but a
    # value the launch's own override replaces)
    values = tmp_path / "values.yaml"
    values.write_text(f"base: {config}\nmodel: {{norm_alignment: ln_textnorm_gcw}}\n"
                      "train: {per_device_batch_size: 1.5, logging_steps: 0}\n")
    report = preflight(values, [], gpus=1, plan=False)
    assert [p.split("key ")[1].split(":")[0] for p in report.problems] == \
        ["'train.per_device_batch_size'", "'model.norm_alignment'", "'train.logging_steps'"], report.problems
    report = preflight(values, ["train.logging_steps=5"], gpus=1, plan=False)
    assert [p.split("key ")[1].split(":")[0] for p in report.problems] == \
        ["'train.per_device_batch_size'", "'model.norm_alignment'"], report.problems
    shapes = tmp_path / "shapes.yaml"  # a value of the wrong shape is one of the keys, not the end of the list
    shapes.write_text(f"base: {config}\nmodel: {{norm_alignment: ln_textnorm_gcw}}\n"
                      "train: {max_step: 3, report_to: tensorboard, logging_steps: abc}\n")
    report = preflight(shapes, ["optim.warmupx=1"], gpus=1, plan=False)  # an override that does not merge
    assert [p.split("key ")[1].split(":")[0] for p in report.problems] == \
        ["'train.report_to'", "'train.max_step'", "'train.logging_steps'", "'model.norm_alignment'"], report.problems
    # each override a check between keys refuses, not only the first
    report = preflight(stage1, ["lora.enabled=true", "train.restart=true", "train.extend=true",
                                f"train.output_dir={tmp_path}/out"], gpus=1, plan=False)
    assert [p.split("key ")[1].split(":")[0] for p in report.problems] == ["'lora.enabled'", "'train.restart'"], \
        report.problems
    values.write_text(f"base: {config}\nmodel: {{norm_alignment: ln_textnorm_gcw}}\ntrain: {{logging_steps: 0}}\n")
    report = preflight(values, ["train.per_device_batch_size=0", "optim.warmupx=1"], gpus=1, plan=False)
    assert [p.split("key ")[1].split(":")[0] for p in report.problems] == \
        ["'model.norm_alignment'", "'train.per_device_batch_size'", "'train.logging_steps'", "'optim.warmupx'"], \
        report.problems
    report = preflight(config, ["optim.lr=abc", "optim.lr=1e-3", "train.foo=1"], gpus=1, plan=False)  # the last wins
    assert [p.split("key ")[1].split(":")[0] for p in report.problems] == ["'train.foo'"], report.problems
    report = preflight(config, ["train.restart=true", "train.extend=true", "optim.warmupx=1"], gpus=1, plan=False)
    assert [p.split("key ")[1].split(":")[0] for p in report.problems] == ["'train.restart'", "'optim.warmupx'"], \
        report.problems
    mixture = f"data.mixture=[{{path: {data}, image_folder: {empty}}}, {{path: {broken}}}]"
    report = preflight(config, [mixture, "model.llm=Org/not-downloaded-7B", "train.deepspeed=/nowhere/zero9.json",
                                "data.on_bad_sample=error", "train.report_to=[tensorboardx]"], gpus=3)
    problems = "\n".join(report.problems)
    assert all("\n" not in p for p in report.problems)
    assert "8 rows per step cannot be split over 1 node(s) x 3 GPUs at 2 per GPU; world sizes that work: [1, 2, 4]" \
        in problems
    assert f"key 'data.mixture[0].image_folder': none of 6 sampled images of {data} is under {empty}" in problems
    assert f"key 'data.mixture[1]': {broken}/train-00000-of-00002.parquet cannot be read as parquet" in problems
    assert "key 'model.llm': Org/not-downloaded-7B is not in the Hugging Face cache and HF_HUB_OFFLINE is set" \
        in problems
    assert "key 'train.report_to': ['tensorboardx'] has a name not among transformers'" in problems  # the machine's
    # without an image_folder the run reads images beside the file: so does the check (it passed them)
    unset = preflight(config, [f"data.mixture=[{{path: {data}}}]"], gpus=2, plan=False)
    assert f"key 'data.mixture[0].image_folder': none of 6 sampled images of {data} is under {data.parent} " \
           "(image_folder is not set: images are read beside the file)" in "\n".join(unset.problems), unset.problems
    # under data.on_bad_sample: skip (the default) the run steps over a cut-short shard: a warning
    report = preflight(config, [mixture], gpus=2, plan=False)
    assert not any("cannot be read as parquet" in p for p in report.problems)
    assert any("cannot be read as parquet" in w and "skipped.jsonl" in w for w in report.warnings), report.warnings
    report = preflight(config, ["train.deepspeed=/nowhere/zero9.json"], gpus=2)
    problems = "\n".join(report.problems)
    assert "environment variable CHECK_DATA is unset: key 'data.mixture[0].path' falls back to /nowhere/data.json" \
        in problems
    assert "key 'train.deepspeed'" in problems
    # the plan, which reads that file too, fails on it: one cause, said once (not again as "plan: ConfigError")
    assert [p for p in report.problems if "train.deepspeed" in p or p.startswith("plan:")] == [
        p for p in report.problems if p.endswith("key 'train.deepspeed': path does not exist: /nowhere/zero9.json")], \
        report.problems


def test_a_setting_the_arm_never_reads_is_a_warning(world, monkeypatch):
    """The new user's trial: model.scale_value and optim.lr_norm on arm none passed the check
    silently (in an ablation, the sign of an arm's config edited for another arm)."""
    _, config, data, _, _ = world
    monkeypatch.setenv("CHECK_DATA", str(data.parent))
    settings = ["model.scale_value=2.0", "optim.lr_norm=0.1"]

    def unused(arm: str) -> list[str]:
        report = preflight(config, [f"model.norm_alignment={arm}", *settings], gpus=2, plan=False)
        assert report.ok, report.problems
        return [w.split("key ")[1].split(":")[0] for w in report.warnings if "it changes nothing" in w]

    assert unused("none") == ["'model.scale_value'", "'optim.lr_norm'"]
    assert unused("scale_fixed") == ["'optim.lr_norm'"]  # its scale is a frozen buffer
    assert unused("ln_textnorm") == ["'model.scale_value'"]
    assert unused("scale_learned") == []


def test_a_gated_backbone_without_a_token_is_named(world, monkeypatch, tmp_path):
    _, config, data, _, _ = world
    monkeypatch.setenv("CHECK_DATA", str(data.parent))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no cached token, no cached model
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    report = preflight(config, ["model.llm=meta-llama/Llama-3.2-3B-Instruct"], gpus=2, plan=False)
    assert any("meta-llama/Llama-3.2-3B-Instruct is gated" in p and "HF_TOKEN" in p for p in report.problems), \
        report.problems


def test_wandb_without_a_key_is_named_before_anything_loads(world, monkeypatch, tmp_path):
    """report_to wandb (or all, which includes the installed wandb) with no way to log in:
    wandb.init would stop the run after the model and data loaded (its UsageError, a traceback
    per rank); the check says it in one line."""
    _, config, data, _, _ = world
    monkeypatch.setenv("CHECK_DATA", str(data.parent))
    for name in ("WANDB_MODE", "WANDB_DISABLED", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # none yet
    wandb = ["train.report_to=[wandb]"]
    problems = preflight(config, wandb, gpus=2, plan=False).problems
    assert any("'train.report_to': wandb has no API key here" in p and "WANDB_MODE=offline" in p for p in problems), \
        problems
    everything = preflight(config, ["train.report_to=[all]"], gpus=2, plan=False).problems  # wandb is installed
    assert any("'train.report_to': wandb has no API key here" in p for p in everything), everything
    import transformers.integrations.integration_utils as integrations

    with monkeypatch.context() as machine:  # a machine without wandb: all is what it has
        machine.setattr(integrations, "get_available_reporting_integrations", lambda: ["tensorboard"])
        assert preflight(config, ["train.report_to=[all]"], gpus=2, plan=False).ok
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password key\n")  # what `wandb login` writes
    assert preflight(config, wandb, gpus=2, plan=False).ok
    (tmp_path / "netrc").unlink()
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert preflight(config, wandb, gpus=2, plan=False).ok


def test_a_deepspeed_key_that_deepspeed_never_reads_or_refuses_is_named(world, monkeypatch, tmp_path):
    """DeepSpeed reads only the top-level keys it knows: a misspelt section trains without it, and
    says nothing. A section's own refusal (a key unknown under zero_optimization) comes only inside
    deepspeed.initialize, after the model has loaded. Both are said at the check."""
    import deepspeed

    _, config, data, _, _ = world
    monkeypatch.setenv("CHECK_DATA", str(data.parent))
    for shipped in ("zero2", "zero3"):
        report = preflight(config, [f"train.deepspeed={REPO}/configs/deepspeed/{shipped}.json"], gpus=2, plan=False)
        assert report.ok, report.problems
    shipped = json.loads((REPO / "configs/deepspeed/zero3.json").read_text())
    elsewhere = tmp_path / "mesh.json"  # keys deepspeed.initialize (and accelerate) read themselves
    elsewhere.write_text(json.dumps({**shipped, "data_parallel_size": 2, "sequence_parallel_size": 1}))
    assert preflight(config, [f"train.deepspeed={elsewhere}"], gpus=2, plan=False).ok
    misspelt = tmp_path / "misspelt.json"
    misspelt.write_text(json.dumps({**{key: value for key, value in shipped.items() if key != "zero_optimization"},
                                    "zero_optimisation": shipped["zero_optimization"]}))
    report = preflight(config, [f"train.deepspeed={misspelt}"], gpus=2, plan=False)
    assert report.problems == [
        f"{config}: key 'train.deepspeed': {misspelt} sets 'zero_optimisation', which DeepSpeed {deepspeed.__version__} "
        "never reads (did you mean 'zero_optimization'?); remove it or correct its name"], report.problems
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**shipped, "zero_optimization": {**shipped["zero_optimization"], "overlap_com": True}}))
    report = preflight(config, [f"train.deepspeed={unknown}"], gpus=2, plan=False)
    assert len(report.problems) == 1 and "\n" not in report.problems[0], report.problems
    assert f"key 'train.deepspeed': {unknown}: DeepSpeed {deepspeed.__version__} refuses it: 1 validation error for " \
           "DeepSpeedZeroConfig; overlap_com; Extra inputs are not permitted" in report.problems[0], report.problems


def test_the_command_exits_non_zero_and_train_stops_before_loading(world, tmp_path):
    root, config, data, _, _ = world
    command = [sys.executable, "-m", "llava_norm.cli", "check", str(config), "--gpus", "3"]
    done = subprocess.run(command, cwd=REPO, env={**env(), "CHECK_DATA": str(data.parent)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1 and "problem: " in done.stdout and "check: 1 problem(s)" in done.stdout, done.stdout
    done = subprocess.run([*command[:-1], "2", "--json"], cwd=REPO, env={**env(), "CHECK_DATA": str(data.parent)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and json.loads(done.stdout)["problems"] == [], done.stdout + done.stderr
    assert "Setting accelerator" not in done.stdout + done.stderr  # no DeepSpeed warning on a machine without a GPU
    # train on one process: the same check, before any model or data loads
    out = tmp_path / "runs" / "tiny" / "run"  # in folders the launch makes
    done = subprocess.run([sys.executable, "-m", "llava_norm.cli", "train", str(config), f"train.output_dir={out}",
                           "train.deepspeed=null"], cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "launch check: environment variable CHECK_DATA is unset" in done.stderr
    assert "launch check: key 'data.mixture[0].path': file not found: /nowhere/data.json" in done.stderr
    assert not (tmp_path / "runs").exists()  # nothing written: no folder left, nor the parents made for it


def test_a_sweep_is_checked_before_its_slurm_files_are_written(tmp_path):
    """The new user's trial: an arm typo, six GPUs for a global batch of 128, LLAVA_DATA and
    EVAL_DATA unset, the backbones not downloaded on an offline node: each said, nothing written."""
    import shutil

    configs = tmp_path / "configs"
    shutil.copytree(REPO / "configs", configs)
    stage1 = configs / "llama3.2-3b/ln_textnorm/stage1.yaml"
    text = stage1.read_text()
    assert text.count("norm_alignment: ln_textnorm") == 1
    stage1.write_text(text.replace("norm_alignment: ln_textnorm", "norm_alignment: nnone"))
    environment = {k: v for k, v in env().items() if k not in ("LLAVA_DATA", "EVAL_DATA")}
    out = tmp_path / "slurm"
    done = subprocess.run([sys.executable, "-m", "llava_norm.cli", "sweep", str(configs / "llama3.2-3b"),
                           "--arms", "none,ln_textnorm", "--seeds", "0,1", "--slurm", str(out), "--slurm-gpus", "6"],
                          cwd=REPO, env={**environment, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1 and "nothing written" in done.stderr, done.stdout + done.stderr
    problems = [line for line in done.stdout.splitlines() if line.startswith("problem: ")]
    text = "\n".join(problems)
    assert "ln_textnorm, stage 1: " in text and "key 'model.norm_alignment'" in text and "nnone" in text
    # the same cause in every arm's file is one problem (the file's path is said by arm and stage)
    assert [line.split(": ")[1] for line in problems if "cannot be split over 1 node(s) x 6 GPUs" in line] == \
        ["none, stage 1", "every arm, stage 2"], text
    # a cause several configs share is said once, with where it was found (ln_textnorm's stage 1
    # config is refused before its data and backbones are read)
    assert [line.split(": ")[1] for line in problems if "environment variable LLAVA_DATA is unset" in line] == \
        ["none, stage 1", "every arm, stage 2"], text
    assert "evaluation: mmbench_en_dev: data path does not exist: data/eval/mmbench; the data root is data/eval: " \
        "--data-root DIR or EVAL_DATA=DIR names another" in text and "EVAL_DATA is unset" not in text
    assert [line.split(": ")[1] for line in problems if "meta-llama/Llama-3.2-3B-Instruct is not in the Hugging Face "
            "cache" in line] == ["none, stages 1 and 2; ln_textnorm, stage 2"], text
    assert not out.exists()


def test_a_chains_evaluation_words_are_checked_before_anything_trains(tmp_path, monkeypatch):
    """--eval-arg is passed on to each evaluation, after both stages trained: a misspelt flag or a
    bad value is said first, by the sweep (Slurm files included) and the pipeline, and nothing is
    written or launched."""
    from llava_norm.cli import main

    monkeypatch.chdir(REPO)
    out = tmp_path / "slurm"
    for command, bad, said in (
            (["sweep", "configs/tiny", "--arms", "none", "--slurm", str(out)], "--limt=5",
             "sweep: --eval-arg: unrecognized arguments: --limt=5"),
            (["pipeline", "configs/tiny/none", "--runs", str(tmp_path / "runs")], "--limit=0",
             "pipeline: --eval-arg: limit must be a positive int")):
        with pytest.raises(SystemExit) as stop:
            main([*command, f"--eval-arg={bad}"])
        assert str(stop.value.code).startswith(said), stop.value.code
    assert not out.exists() and not (tmp_path / "runs").exists()


def test_a_chain_without_its_benchmark_data_stops_before_anything_trains(tmp_path, monkeypatch):
    """The new user's trial: a pipeline or local sweep with a data root that lacks the benchmarks
    trained both stages, then failed at evaluation. Said first, naming the root; nothing written.
    The --eval-arg words win as in eval: their --data-root or --data is where the data is looked for.
    Arm directories that are not ones are said all at once (one at a time before)."""
    from llava_norm.cli import main
    from llava_norm.evaluation.arguments import eval_data_problem

    monkeypatch.chdir(REPO)
    for command in (["pipeline", "configs/tiny/none"], ["sweep", "configs/tiny", "--arms", "none"]):
        with pytest.raises(SystemExit) as stop:
            main([*command, "--runs", str(tmp_path / "runs"), "--data-root", "/nowhere/eval", "--benchmarks", "pope"])
        assert stop.value.code == (f"{command[0]}: evaluation: pope: data path does not exist: /nowhere/eval/pope; "
                                   "the data root is /nowhere/eval: --data-root DIR or EVAL_DATA=DIR names another "
                                   "(see eval/README.md for where to get it)"), stop.value.code
    assert not (tmp_path / "runs").exists()
    (tmp_path / "eval" / "pope").mkdir(parents=True)
    (tmp_path / "pope.jsonl").write_text("")
    assert eval_data_problem([f"--data-root={tmp_path / 'eval'}"], "pope", "/nowhere/eval") is None
    assert eval_data_problem([f"--data=pope={tmp_path / 'pope.jsonl'}"], "pope", "/nowhere/eval") is None
    assert eval_data_problem([], "pope", str(tmp_path / "eval")) is None
    # every arm directory that is not one, at once (one a run, a missing one said as missing)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "stage1.yaml").write_text("")
    with pytest.raises(SystemExit) as stop:
        main(["pipeline", str(tmp_path / "nowhere"), "configs/tiny/none", str(tmp_path / "half"), "--runs",
              str(tmp_path / "runs"), "--benchmarks", "pope", "--data-root", str(tmp_path / "eval")])
    assert stop.value.code == (
        f"pipeline: {tmp_path / 'nowhere'}: no such arm directory (from {REPO}; an arm directory holds stage1.yaml "
        f"and stage2.yaml)\n{tmp_path / 'half'}: no stage2.yaml (an arm directory needs stage1.yaml and stage2.yaml)")
    assert not (tmp_path / "runs").exists()
    # relative paths among the words are made absolute from where the chain starts: its
    # evaluations run in the checkout
    from llava_norm import pipeline

    started = []
    monkeypatch.setattr(pipeline, "plan", lambda config: (started.append(config), ([], {}))[1])
    monkeypatch.chdir(tmp_path)
    main(["pipeline", str(REPO / "configs/tiny/none"), "--runs", "runs", "--benchmarks", "pope",
          "--eval-arg=--data-root=eval", "--eval-arg=--data", "--eval-arg=pope=pope.jsonl", "--eval-arg=--limit=2"])
    assert started[0].eval_args == [f"--data-root={tmp_path / 'eval'}", "--data", f"pope={tmp_path / 'pope.jsonl'}",
                                    "--limit=2"]
    monkeypatch.chdir(REPO)


CHAINS = {"pipeline": ["configs/tiny/none"], "sweep": ["configs/tiny", "--arms", "none", "--seeds", "2"]}


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_ctrl_c_on_a_chain_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys, chain):
    """Ctrl-C reaches the step a pipeline or sweep launched (which says where it stands) and the
    chain itself, which waits on it: one line and the shell's interrupt status."""
    from llava_norm import pipeline
    from llava_norm.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(pipeline, "plan", lambda config: ([], {}))
    monkeypatch.setattr(pipeline, "run_steps", interrupted)
    (tmp_path / "eval" / "pope").mkdir(parents=True)  # the chain's benchmark data, checked first
    try:  # a KeyboardInterrupt escaping would stop pytest itself: caught here, as a failure
        main([chain, *CHAINS[chain], "--runs", str(tmp_path / "runs"), "--benchmarks", "pope",
              "--data-root", str(tmp_path / "eval")])
    except SystemExit as stop:
        code = stop.code
    except KeyboardInterrupt:
        code = "the interrupt escaped as a traceback"
    assert code == 130
    assert capsys.readouterr().err.strip() == \
        f"{chain}: interrupted; finished steps are kept, and the same command goes on from them"


# A launch that needs a moment, after the signal it is given (SIGTERM or SIGINT), to say where it stands.
SLOW_TO_STOP = """
import os, pathlib, signal, sys, time
said, ready, name, status = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def stop(signum, frame):
    time.sleep(1.0)
    pathlib.Path(said).write_text(f"stopped on {name}")
    sys.exit(status)
signal.signal(getattr(signal, name), stop)
pathlib.Path(ready).write_text(str(os.getpid()))
time.sleep(60)
"""


def _chain_of_one_slow_launch(tmp_path, monkeypatch, signal_name: str, status: int):
    """(where the launch says it stopped, where it writes its pid once it waits, the pipeline to run):
    one step whose launch is SLOW_TO_STOP on ``signal_name``."""
    from llava_norm import chain_launch, pipeline
    from llava_norm.cli import main

    said, ready = tmp_path / "said", tmp_path / "ready"
    command = [sys.executable, "-c", SLOW_TO_STOP, str(said), str(ready), signal_name, str(status)]
    step = pipeline.Step("slow to stop", lambda: False, lambda: chain_launch.launch(command, None))
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(pipeline, "plan", lambda config: ([step], {}))
    (tmp_path / "eval" / "pope").mkdir(parents=True)
    return said, ready, lambda: main(["pipeline", "configs/tiny/none", "--runs", str(tmp_path / "runs"),
                                      "--benchmarks", "pope", "--data-root", str(tmp_path / "eval")])


def test_ctrl_c_on_a_chain_lets_its_launch_stop_first(tmp_path, monkeypatch, capsys):
    """Ctrl-C reaches the chain and its launch at once (one process group); the chain waits for the
    launch to say its line (subprocess.run would kill it a quarter second in), then says its own, 130."""
    import signal
    import threading

    said, ready, chain = _chain_of_one_slow_launch(tmp_path, monkeypatch, "SIGINT", 130)

    def ctrl_c():  # as a terminal sends it: to the launch and to the chain
        while not ready.is_file() or not ready.read_text():
            time.sleep(0.05)
        os.kill(int(ready.read_text()), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # (a pytest worker may ignore it)
    threading.Thread(target=ctrl_c, daemon=True).start()
    try:
        with pytest.raises(SystemExit) as stop:
            chain()
    finally:
        signal.signal(signal.SIGINT, before)
    assert stop.value.code == 130 and said.read_text() == "stopped on SIGINT"
    assert capsys.readouterr().err.strip().endswith(
        "pipeline: interrupted; finished steps are kept, and the same command goes on from them")


def test_sigterm_to_a_chain_alone_is_passed_to_its_launch_which_is_let_stop(tmp_path, monkeypatch, capsys,
                                                                             sigterm_to_self):
    """`kill PID` of a pipeline or sweep: its running launch gets the SIGTERM and the time to stop
    (subprocess.run would kill it a quarter second after an interrupt, and torchrun's workers
    with it, before they say which checkpoint the rerun resumes from); then the chain's line, 143."""
    said, ready, chain = _chain_of_one_slow_launch(tmp_path, monkeypatch, "SIGTERM", 143)
    sigterm_to_self(when=ready.exists)
    with pytest.raises(SystemExit) as stop:
        chain()
    assert stop.value.code == 143
    assert said.read_text() == "stopped on SIGTERM"
    assert capsys.readouterr().err.strip().endswith(
        "pipeline: terminated by SIGTERM; finished steps are kept, and the same command goes on from them")


def test_a_malformed_jsonl_line_is_a_warning_under_skip_and_a_problem_under_error(world, tmp_path):
    """One JSONL line that does not read is one bad row (the dataset skips it under skip, the
    default), not a launch-stopping problem; under error it stops the launch, naming the line."""
    _, config, data, images, _ = world
    lines = [json.dumps(row) for row in json.loads(data.read_text())]
    lines[3] = lines[3][:20]  # a line cut short
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(lines) + "\n")
    mixture = f"data.mixture=[{{path: {jsonl}, image_folder: {images}}}]"
    report = preflight(config, [mixture], gpus=2, plan=False)
    assert report.ok, report.problems
    assert any(f"{jsonl}: line 4: invalid JSON at column " in w and "skipped.jsonl" in w for w in report.warnings)
    assert "data: 7 rows taken from 1 source(s)" in "\n".join(report.summary)
    strict = preflight(config, [mixture, "data.on_bad_sample=error"], gpus=2, plan=False)
    assert [p for p in strict.problems if f"{jsonl}: line 4: invalid JSON at column " in p]
    jsonl.write_text(json.dumps(json.loads(data.read_text()), indent=1))  # a JSON list named .jsonl: no line reads
    report = preflight(config, [mixture], gpus=2, plan=False)
    assert [p for p in report.problems if p.startswith(f"key 'data.mixture[0]': {jsonl}: none of its ")], report.problems


def test_some_images_missing_is_a_warning_under_skip_and_a_problem_under_error(world, tmp_path, projector):
    """Two of a source's images gone (a partial unpack): the run skips their rows when drawn, or
    under error stops at the first; the check says which, before a job is queued, of the rows
    the source's take leaves to the run only."""
    _, config, data, images, _ = world
    folder = tmp_path / "images"
    shutil.copytree(images, folder)
    gone = sorted(folder.iterdir())[:2]
    for path in gone:
        path.unlink()
    mixture = f"data.mixture=[{{path: {data}, image_folder: {folder}}}]"
    said = f"key 'data.mixture[0].image_folder': 2 of 6 sampled images of {data} are missing under {folder} " \
           f"(first looked for: {gone[0].name})"
    report = preflight(config, [mixture], gpus=2, plan=False)
    assert report.ok and any(w.startswith(said) and "skipped.jsonl" in w for w in report.warnings), report.warnings
    strict = preflight(config, [mixture, "data.on_bad_sample=error"], gpus=2, plan=False)
    assert any(p.startswith(said) for p in strict.problems), strict.problems
    # the rows a take leaves out are never drawn: only the images of the rows the run takes count
    rows = json.loads(data.read_text())
    kept = next(i for i, row in enumerate(rows) if "image" in row)  # its image is the one left
    shutil.rmtree(folder)
    shutil.copytree(images, folder)
    for path in folder.iterdir():
        if path.name != rows[kept]["image"]:
            path.unlink()
    taken = f"data.mixture=[{{path: {data}, image_folder: {folder}, take: 'first:{kept + 1}'}}]"
    strict = preflight(config, [taken, "data.on_bad_sample=error", *projector], gpus=2, plan=False)
    assert strict.ok and not strict.warnings, (strict.problems, strict.warnings)
    taken = f"data.mixture=[{{path: {data}, image_folder: {folder}, take: 'first:{kept + 2}'}}]"
    assert "1 of 2 sampled images" in "\n".join(preflight(config, [taken], gpus=2, plan=False).warnings)


def test_rows_that_break_the_row_rules_are_said_before_the_launch(world, tmp_path):
    """A row the index build would reject at launch: a warning under skip (the run drops it), a
    problem under error (the launch would stop at it); a source none of whose rows passes is a
    problem either way (the launch ended in 'no usable rows' after the check said OK)."""
    _, config, data, images, _ = world
    rows = json.loads(data.read_text())
    broken = [*rows, {"id": "no-turns", "image": next(row["image"] for row in rows if "image" in row)},
              {"id": "gpt-first", "conversations": [{"from": "gpt", "value": "hi"}]}]
    (tmp_path / "some.json").write_text(json.dumps(broken))
    some = f"data.mixture=[{{path: {tmp_path / 'some.json'}, image_folder: {images}}}]"
    said = f"key 'data.mixture[0]': {tmp_path / 'some.json'}: row no-turns"
    report = preflight(config, [some], gpus=2, plan=False)
    assert report.ok and [w for w in report.warnings if w.startswith(said)], report.warnings
    strict = preflight(config, [some, "data.on_bad_sample=error"], gpus=2, plan=False)
    assert [p for p in strict.problems if p.startswith(said)], strict.problems
    assert [p for p in strict.problems if "row gpt-first" in p] and len(strict.problems) == 2, strict.problems
    (tmp_path / "none.json").write_text(json.dumps(broken[-2:]))
    none = f"data.mixture=[{{path: {tmp_path / 'none.json'}, image_folder: {images}}}]"
    assert any(p.startswith("key 'data.mixture[0]': none of the 2 rows the run takes passes the row rules (first: ")
               for p in preflight(config, [none], gpus=2, plan=False).problems)
    # the plain format's own rule (stage 1's captions): a caption right after the first user turn
    two_asks = {"id": "two-asks", "conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"},
                                                    {"from": "gpt", "value": "c"}]}
    (tmp_path / "plain.json").write_text(json.dumps([*rows, two_asks]))
    plain = [f"data.mixture=[{{path: {tmp_path / 'plain.json'}, image_folder: {images}}}]", "data.prompt_format=plain"]
    warned = preflight(config, plain, gpus=2, plan=False).warnings
    assert [w for w in warned if "row two-asks: plain format needs an assistant caption right after" in w], warned


def test_a_datasets_cache_that_cannot_be_made_is_a_problem(world, tmp_path, monkeypatch):
    """HF_DATASETS_CACHE, where the launch builds its row index, under a file: the launch ended in
    a NotADirectoryError traceback after the check said OK."""
    _, config, _, _, _ = world
    (tmp_path / "data.json").write_text("[]")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "data.json" / "cache"))
    said = preflight(config, [], gpus=2, plan=False).problems
    assert f"variable HF_DATASETS_CACHE: {tmp_path / 'data.json' / 'cache'} cannot be made: {tmp_path / 'data.json'} " \
           "is a file" in said, said


def test_a_take_of_no_row_is_a_problem(world):
    """A share that rounds to no row, beside a good source: the launch would take nothing from it,
    unsaid (it trained on the other source alone)."""
    _, config, data, images, shards = world
    rows = len(json.loads(data.read_text()))
    nothing = f"data.mixture=[{{path: {data}, image_folder: {images}}}, {{path: {data}, take: 'first:1%'}}]"
    said = preflight(config, [nothing], gpus=2, plan=False).problems
    assert [p for p in said if f"key 'data.mixture[1].take': 'first:1%' of {rows} rows is no row" in p], said
    half = f"data.mixture=[{{path: {data}, image_folder: {images}, take: 'first:50%'}}, {{path: {shards}, take: 'first:3'}}]"
    summary = "\n".join(preflight(config, [half], gpus=2, plan=False).summary)
    assert f"data: {rows // 2 + 3} rows taken from 2 source(s)" in summary, summary  # the takes, not the files' rows
    nothing = f"data.mixture=[{{path: {data}, image_folder: {images}}}, {{path: {shards}, take: 'first:1%'}}]"
    said = preflight(config, [nothing], gpus=2, plan=False).problems  # parquet shards: counted from their footers
    assert [p for p in said if f"key 'data.mixture[1].take': 'first:1%' of {rows} rows is no row" in p], said


def test_a_grad_accum_the_global_batch_overrides_is_a_warning(world):
    """train.grad_accum given on the command line beside train.global_batch_size changes nothing
    (the accumulation is derived from the global batch): said, unless it is what the global batch
    gives anyway. A YAML base's own value (the shipped stage-2 base sets 4) is not said."""
    _, config, _, _, _ = world
    batch = ["train.global_batch_size=16", "train.per_device_batch_size=2"]

    def said(*overrides):
        return [w for w in preflight(config, [*batch, *overrides], gpus=2, plan=False).warnings if "grad_accum" in w]

    assert said("train.grad_accum=8") == [f"{config}: key 'train.grad_accum': 8 is given, but train.global_batch_size 16 "
                                          "decides the accumulation (4 on 1 node(s) x 2 GPUs): it changes nothing "
                                          "(train.global_batch_size=null to use it)"]
    assert said("train.grad_accum=4") == said() == []


def test_a_take_past_the_sources_rows_is_a_warning(world):
    """``first:N`` beyond a source's rows takes them all, as LLaVA-NeXT's loader does: said as a
    warning naming the key, for JSON and for parquet (counted from the footers), under either
    bad-sample policy; a take within the rows says nothing."""
    _, config, data, images, shards = world
    rows = len(json.loads(data.read_text()))
    over = f"data.mixture=[{{path: {data}, image_folder: {images}, take: 'first:{rows + 1}'}}, " \
           f"{{path: {shards}, take: 'first:{rows + 5}'}}]"
    for policy in ("skip", "error"):
        report = preflight(config, [over, f"data.on_bad_sample={policy}"], gpus=2, plan=False)
        assert not report.problems, report.problems
        for i, take in ((0, rows + 1), (1, rows + 5)):
            line = f"key 'data.mixture[{i}].take': 'first:{take}' asks for more rows than the source's {rows}: " \
                   f"the run takes all {rows}"
            assert line in report.warnings, report.warnings
        assert f"data: {2 * rows} rows taken from 2 source(s)" in "\n".join(report.summary)
    within = f"data.mixture=[{{path: {data}, image_folder: {images}, take: 'first:{rows}'}}]"
    assert not [w for w in preflight(config, [within], gpus=2, plan=False).warnings if "asks for more rows" in w]


def test_a_data_file_without_rows_is_a_problem(world, tmp_path):
    """An empty JSONL beside a good source: the launch check names it (it counted 0 rows and
    passed before, and the index build then ended in datasets' own error)."""
    _, config, data, images, _ = world
    (tmp_path / "empty.jsonl").write_text("\n")
    mixture = f"data.mixture=[{{path: {data}, image_folder: {images}}}, {{path: {tmp_path / 'empty.jsonl'}}}]"
    report = preflight(config, [mixture], gpus=2, plan=False)
    assert f"key 'data.mixture[1]': {tmp_path / 'empty.jsonl'}: holds no rows (an empty file or list?)" in \
        report.problems, report.problems


def test_shards_without_the_hub_layouts_columns_or_rows_are_said(world, tmp_path):
    """A shard without 'conversations' and one without a row beside a good one: the run drops each
    whole (bad_columns, no_rows), so the launch check says so, from the footers, under skip as
    warnings and under error as problems."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    _, config, _, _, shards = world
    folder = tmp_path / "shards"
    folder.mkdir()
    good = sorted(shards.glob("*.parquet"))[0]
    shutil.copy(good, folder / "a.parquet")
    pq.write_table(pa.table({"id": ["x"], "text": ["hi"]}), folder / "b.parquet")
    pq.write_table(pq.read_schema(good).empty_table(), folder / "c.parquet")  # the right columns, no row
    said = [f"{folder / 'b.parquet'}: no column 'conversations'", f"{folder / 'c.parquet'}: holds no rows"]
    skip = preflight(config, [f"data.mixture=[{{path: {folder}}}]"], gpus=2, plan=False)
    assert skip.ok and all([w for w in skip.warnings if line in w] for line in said), skip.warnings
    assert f"data: {pq.ParquetFile(good).metadata.num_rows} rows taken from 1 source(s)" in "\n".join(skip.summary)
    stop = preflight(config, [f"data.mixture=[{{path: {folder}}}]", "data.on_bad_sample=error"], gpus=2, plan=False)
    assert all([p for p in stop.problems if line in p] for line in said), stop.problems
    # without the good shard no row is left: a problem under skip too (the run would stop); and
    # 'conversations' stored as JSON text is as unusable as none
    (folder / "a.parquet").unlink()
    table = pq.read_table(good)
    pq.write_table(table.set_column(table.schema.get_field_index("conversations"), "conversations",
                                    pa.array([str(v) for v in table.column("conversations").to_pylist()])),
                   folder / "d.parquet")
    none = preflight(config, [f"data.mixture=[{{path: {folder}}}]"], gpus=2, plan=False)
    assert [p for p in none.problems if f"key 'data.mixture[0]': none of its 3 shard(s) holds a row the run can read "
            "(above): this source would train nothing" in p], none.problems
    assert [w for w in none.warnings if f"{folder / 'd.parquet'}: column 'conversations' is string, not the hub's "
            "list of turns" in w], none.warnings


def test_a_backbone_of_the_wrong_kind_is_one_line_naming_its_key(world, tiny_dir, monkeypatch):
    """The tiny Llama given as the vision tower: one problem naming the key, and no plan error
    beside it (the plan failed on the Llama config's missing num_channels, naming no key)."""
    _, config, data, _, _ = world
    monkeypatch.setenv("CHECK_DATA", str(data.parent))
    report = preflight(config, [f"model.vision_tower={tiny_dir}/llama"], gpus=2, gpu_memory_gib=80)
    assert report.problems == [f"{config}: key 'model.vision_tower': {tiny_dir}/llama holds a llama model, not a "
                               "vision tower (its config.json has neither vision_config nor image_size)"]
    assert "plan: none until the problems above are fixed" in report.summary
    # both at relative paths that are not there (the warm-up not yet run): each said as a missing
    # path, not one of them in huggingface_hub's words about repo ids
    for where in ("runs/nowhere", "/nowhere"):  # (absolute: the config check names only the first backbone)
        report = preflight(config, [f"model.vision_tower={where}/siglip", f"model.llm={where}/llama"], gpus=2,
                           plan=False)
        said = [p for p in report.problems if "model." in p]
        assert len(said) == 2 and all(f"path does not exist: {where}/" in p for p in said), said
        assert not any("Repo id" in p or "repo_name" in p for p in report.problems), report.problems


def test_a_hub_card_that_its_shards_do_not_reach_is_said(world, monkeypatch, tmp_path):
    """A partial download of a hub dataset: its card says 20 rows, its two shards hold 8. Under
    data.on_bad_sample skip a warning (the run goes on without them), under error a problem."""
    import shutil

    from huggingface_hub import constants

    _, config, _, _, shards = world
    commit = "0123456789abcdef0123456789abcdef01234567"
    cached = tmp_path / "hub" / "datasets--org--next"
    shutil.copytree(shards.parent, cached / "snapshots" / commit)
    (cached / "refs").mkdir()
    (cached / "refs" / "main").write_text(commit)
    card = cached / "snapshots" / commit / "README.md"
    assert card.read_text().count("num_examples: 8") == 1
    card.write_text(card.read_text().replace("num_examples: 8", "num_examples: 20"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    said = "key 'data.mixture[0]': the dataset card says 20 rows, the 2 shards hold 8: a partial download?"
    skip = preflight(config, ["data.mixture=[{hub: org/next}]"], gpus=2, plan=False)
    assert skip.ok and [w for w in skip.warnings if said in w], skip.warnings
    stop = preflight(config, ["data.mixture=[{hub: org/next}]", "data.on_bad_sample=error"], gpus=2, plan=False)
    assert [p for p in stop.problems if said in p], stop.problems
    # a take sized for the whole card (what a partial download leaves short): both are said
    sized = preflight(config, ["data.mixture=[{hub: org/next, take: 'first:20'}]", "data.on_bad_sample=error"],
                      gpus=2, plan=False)
    assert [p for p in sized.problems if said in p], sized.problems
    assert [w for w in sized.warnings if "'first:20' asks for more rows than the source's 8" in w], sized.warnings


def test_a_backbone_that_is_neither_a_folder_nor_a_repo_id_is_one_line(world):
    """A relative path that does not exist here (two slashes: not a repo id either) is named by
    its key, not met as huggingface_hub's validation traceback."""
    _, config, _, _, _ = world
    report = preflight(config, ["model.llm=checkpoints/llama/v2"], gpus=1)
    assert [p for p in report.problems if p.endswith("key 'model.llm': path does not exist: checkpoints/llama/v2")], \
        report.problems
    # one cause is said once: not again by the backbone check or by the plan, which cannot be made
    for override, key in (("model.llm=checkpoints/llama/v2", "model.llm"), ("model.vision_tower=/nowhere/siglip",
                                                                            "model.vision_tower")):
        report = preflight(config, [override], gpus=1)
        assert len([p for p in report.problems if f"'{key}'" in p]) == 1, report.problems
        assert "plan: none until the problems above are fixed" in report.summary


def test_a_plan_that_does_not_fit_is_a_problem(world, monkeypatch):
    """`check` exits 1 on any problem (test_the_command_exits_non_zero...); a plan over the GPU's
    memory is one, with the single changes that fit (`plan` itself only reports)."""
    _, config, data, _, _ = world
    monkeypatch.setenv("CHECK_DATA", str(data.parent))
    report = preflight(config, [], gpus=2, gpu_memory_gib=0.01)
    assert not report.ok
    assert [p for p in report.problems if p.startswith("plan: peak ") and "does not fit 0.0 GiB" in p], report.problems


def test_a_template_key_the_chat_template_never_reads_is_named(world, tiny_dir, monkeypatch, tmp_path):
    """A misspelt data.template_kwargs key (Jinja ignores variables it does not read) is one line
    naming the key and the variables the template reads, from chat_template.jinja or, in another
    folder, from tokenizer_config.json's named templates (a list, or a mapping whose template uses
    transformers' loop controls and generation block); a key it reads, the default date on a
    template without it and the plain format pass."""
    root, config, data, _, _ = world
    monkeypatch.setenv("CHECK_DATA", str(data.parent))
    report = preflight(config, ["data.template_kwargs={date_string: 1 Jan 2025, date_strng: 1 Jan 2025}"], gpus=2,
                       plan=False)
    assert report.problems == [
        f"{config}: key 'data.template_kwargs.date_strng': the chat template of {tiny_dir}/llama reads no variable "
        "'date_strng' (the variables it reads: date_string, system_message)"], report.problems
    assert preflight(config, ["data.prompt_format=plain", "data.template_kwargs={date_strng: 1}"], gpus=2,
                     plan=False).ok
    qwen = tmp_path / "qwen2"
    shutil.copytree(tiny_dir / "qwen2", qwen)
    template = (qwen / "chat_template.jinja").read_text()
    (qwen / "chat_template.jinja").unlink()
    settings = json.loads((qwen / "tokenizer_config.json").read_text())
    settings["chat_template"] = [{"name": "default", "template": template}, {"name": "tool_use", "template": "{{ x }}"}]
    (qwen / "tokenizer_config.json").write_text(json.dumps(settings))
    on_qwen = [f"model.llm={qwen}", "data.template_kwargs={date_string: 1 Jan 2025, enable_thinking: false}"]
    assert preflight(config, on_qwen, gpus=2, plan=False).problems == [
        f"{config}: key 'data.template_kwargs.enable_thinking': the chat template of {qwen} reads no variable "
        "'enable_thinking' (the variables it reads: none besides transformers' own)"]
    # a key the template reads passes: Qwen3's enable_thinking (its configs set it)
    assert preflight(config, [f"model.llm={tiny_dir}/qwen3", "data.template_kwargs={enable_thinking: false}"], gpus=2,
                     plan=False).ok
    # syntax of transformers' template environment (loop controls, the generation block), in a
    # tokenizer_config.json that keeps its named templates as a mapping: still read
    settings["chat_template"] = {"default": "{% for m in messages %}{% if m.role == 'x' %}{% break %}{% endif %}"
                                            "{% generation %}{{ m.content }}{{ enable_thinking }}{% endgeneration %}"
                                            "{% endfor %}"}
    (qwen / "tokenizer_config.json").write_text(json.dumps(settings))
    assert preflight(config, [f"model.llm={qwen}", "data.template_kwargs={enable_thinkng: false}"], gpus=2,
                     plan=False).problems == [
        f"{config}: key 'data.template_kwargs.enable_thinkng': the chat template of {qwen} reads no variable "
        "'enable_thinkng' (the variables it reads: enable_thinking)"]


def test_the_check_from_outside_the_checkout_says_where_relative_paths_were_read(tmp_path, monkeypatch, capsys):
    """The new user's trial: `llava-norm check` on a shipped config from another directory listed
    its relative paths (runs/..., configs/deepspeed/...) as missing with nothing saying why."""
    from llava_norm.cli import main

    config = str(REPO / "configs/tiny/none/stage1.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["check", config, "train.output_dir=/nowhere/out"])
    out = capsys.readouterr().out
    assert "path does not exist: runs/tiny/" in out  # what it is about
    assert out.splitlines()[-1] == f"note: relative paths were read from {tmp_path.resolve()}, where this command " \
        f"runs; each launch reads them from the checkout, {REPO} (scripts/_launch.sh): run the command from there"
    monkeypatch.chdir(REPO)  # from the checkout, the same paths (the tiny world not built there, say): no note
    with pytest.raises(SystemExit):
        main(["check", config, "model.llm=runs/nowhere/llama"])
    assert "note:" not in capsys.readouterr().out
