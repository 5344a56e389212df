"""Configs: every shipped YAML loads; the paper's recipe is what ships; every config mistake is
one line naming the file and the key, raised by load_config before any model or data loads."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from llava_norm.config import CHOICES, RANGES, SCHEDULERS, ConfigError, effective_grad_accum, load_config, to_yaml
from llava_norm.config_schema import NORM_ARMS, TEMPLATE_KWARGS, resolve_dtype
from llava_norm.data.prompts import PromptSettings, training_prompt_settings
from llava_norm.layout import CONFIG_FILE
from tinydata import write_dataset

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
ARMS = list(NORM_ARMS)  # every arm has a config for every backbone
BACKBONES = ["llama3.2-3b", "qwen2.5-7b", "qwen3-8b", "clip336-llama3.2-3b", "tiny"]
SIGLIP = "google/siglip-so400m-patch14-384"
CLIP336 = "openai/clip-vit-large-patch14-336"


@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("arm", ARMS)
def test_every_cell_has_both_stages(backbone, arm):
    s1 = load_config(CONFIGS / backbone / arm / "stage1.yaml", check_paths=False)
    s2 = load_config(CONFIGS / backbone / arm / "stage2.yaml", check_paths=False)
    assert (s1.train.stage, s2.train.stage) == (1, 2)
    assert s1.model.norm_alignment == s2.model.norm_alignment == arm
    assert s2.model.pretrained_projector == f"{s1.train.output_dir}/projector.safetensors"
    if backbone != "tiny":
        assert (s1.optim.lr, s1.train.per_device_batch_size, s1.train.grad_accum, s1.train.global_batch_size) == (
            1e-3, 2, 2, 256)
        assert (s2.optim.lr, s2.optim.lr_vision_tower, s2.train.per_device_batch_size, s2.train.grad_accum,
                s2.train.global_batch_size) == (1e-5, 2e-6, 1, 4, 128)
        assert s1.optim.warmup_ratio == s2.optim.warmup_ratio == 0.03 and s1.train.seed == s2.train.seed == 42
        # the rest of App. E as the README lists it: cosine, weight decay 0, bf16 (on a GPU)
        for s in (s1, s2):
            assert (s.optim.scheduler, s.optim.weight_decay, resolve_dtype(s.train.precision, "cuda")) == \
                ("cosine", 0.0, "bfloat16")
        assert s1.model == replace(s2.model, pretrained_projector=None)  # same backbones in both stages
    if backbone.startswith("clip336"):
        # LLaVA-1.5's tower: penultimate layer, CLS dropped ("default"); the LLM of the llama3.2-3b cell.
        assert (s1.model.vision_tower, s1.model.vision_feature_layer, s1.model.vision_feature_select_strategy) == (
            CLIP336, -2, "default")
        assert s1.model.llm == load_config(CONFIGS / "llama3.2-3b" / arm / "stage1.yaml", check_paths=False).model.llm
    elif backbone != "tiny":
        assert s1.model.vision_tower == SIGLIP


def test_qwen3_thinking_off_survives_as_a_bool(tmp_path):
    """YAML `enable_thinking: false` must reach the template as False: Qwen3's template tests
    `enable_thinking is false`, which the string "False" fails without a word."""
    config = load_config(CONFIGS / "qwen3-8b/none/stage2.yaml", check_paths=False)
    assert config.model.llm == "Qwen/Qwen3-8B"
    assert config.data.template_kwargs == {**TEMPLATE_KWARGS, "enable_thinking": False}
    assert config.data.template_kwargs["enable_thinking"] is False
    # As evaluation reads it back: the run's config.yaml, then PromptSettings.
    (tmp_path / CONFIG_FILE).write_text(to_yaml(config))
    settings = training_prompt_settings(tmp_path / "model")
    assert settings.template_kwargs["enable_thinking"] is False
    assert PromptSettings.from_data(config.data.__dict__).template_kwargs["enable_thinking"] is False
    override = load_config(CONFIGS / "llama3.2-3b/none/stage2.yaml", ["data.template_kwargs.enable_thinking=false"],
                           check_paths=False)
    assert override.data.template_kwargs["enable_thinking"] is False


def test_global_batch_derives_accumulation(monkeypatch):
    cfg = load_config(CONFIGS / "llama3.2-3b/none/stage1.yaml", check_paths=False).train
    assert effective_grad_accum(cfg, 64) == 2 and effective_grad_accum(cfg, 8) == 16
    with pytest.raises(ConfigError, match="global_batch_size"):
        effective_grad_accum(cfg, 3)
    monkeypatch.setenv("WORLD_SIZE", "3")  # what torchrun gives each worker: checked at load time too
    with pytest.raises(ConfigError, match=r"stage1.yaml: key 'train.global_batch_size': 256 .* 3 processes; world "
                                          r"sizes that work: \[1, 2, 4, 8, 16, 32, 64, 128\]$"):  # as check lists them
        load_config(CONFIGS / "llama3.2-3b/none/stage1.yaml", check_paths=False)
    # one the per-device batch does not divide is said so, not as a count of processes
    with pytest.raises(ConfigError, match=r"250 is not a multiple of per_device_batch_size 8, so no number of "):
        load_config(CONFIGS / "llama3.2-3b/none/stage1.yaml", ["train.global_batch_size=250", "train.per_device_batch_size=8"],
                    check_paths=False)


def test_shipped_zero2_names_its_gradient_bucket_instead_of_hidden_size_squared():
    """configs/deepspeed/zero2.json sets reduce_bucket_size to 5e7 elements. With `auto`,
    transformers fills in hidden_size squared, which at Llama-3.2-3B is a bucket every 1.8 of its
    gradient tensors, each flush host work (bench/zero_overhead.py); the `auto` config is kept
    beside the script for a GPU comparison."""
    zero = json.loads((CONFIGS / "deepspeed/zero2.json").read_text())["zero_optimization"]
    assert zero["reduce_bucket_size"] == 50_000_000
    auto = json.loads((REPO / "bench/zero2_bucket_auto.json").read_text())
    assert auto["zero_optimization"]["reduce_bucket_size"] == "auto"
    assert {**auto, "zero_optimization": {**auto["zero_optimization"], "reduce_bucket_size": 50_000_000}} == \
        json.loads((CONFIGS / "deepspeed/zero2.json").read_text())  # the bucket is its only difference


def test_schedulers_are_transformers_schedulers():
    from transformers import SchedulerType

    assert set(SCHEDULERS) <= {s.value for s in SchedulerType}


@pytest.fixture()
def setup(tmp_path, tiny_dir):
    """A config that passes every check (check_paths included), and the files the cases point at."""
    data, images = write_dataset(tmp_path / "data", n=4)
    d = tmp_path
    (d / "bad.json").write_text("{not json")
    (d / "list.json").write_text("[1, 2]")
    (d / "a_file").write_text("x")
    ds = json.loads((CONFIGS / "deepspeed/zero2.json").read_text())
    (d / "ds_optimizer.json").write_text(json.dumps({**ds, "optimizer": {"type": "AdamW"}}))
    (d / "ds_stage7.json").write_text(json.dumps({**ds, "zero_optimization": {**ds["zero_optimization"], "stage": 7}}))
    (d / "ds_micro3.json").write_text(json.dumps({**ds, "train_micro_batch_size_per_gpu": 3}))
    (d / "ds_bf16.json").write_text(json.dumps({**ds, "bf16": {"enabled": True}}))
    (d / "ds_fixed.json").write_text(json.dumps({**ds, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}}))
    prefix = "model.multi_modal_projector."
    mlp = {f"{prefix}linear_{i}.{p}": torch.zeros(2) for i in (1, 2) for p in ("weight", "bias")}
    mlp_norm = {**mlp, f"{prefix}norm.weight": torch.ones(2), f"{prefix}norm.bias": torch.zeros(2)}

    def origin(arm, llm="llama", tower="siglip"):  # what a stage 1 records of its run (llava_norm.train.final.save_final)
        return {"norm_alignment": arm, "projector_type": "mlp2x_gelu", "vision_tower": str((tiny_dir / tower).resolve()),
                "llm": str((tiny_dir / llm).resolve()), "text_norm": "1.0"}

    save_file(mlp, str(d / "mlp_projector.safetensors"), metadata=origin("none"))
    save_file(mlp_norm, str(d / "mlp_norm_projector.safetensors"), metadata=origin("ln_textnorm_gwc"))
    save_file(mlp_norm, str(d / "qwen_projector.safetensors"), metadata=origin("ln_textnorm_gwc", "qwen2"))
    save_file(mlp_norm, str(d / "clip_projector.safetensors"), metadata=origin("ln_textnorm_gwc", tower="clip"))
    save_file(mlp_norm, str(d / "unrecorded_projector.safetensors"))
    (d / "checkpoint-2").mkdir()
    (d / "checkpoint-2/trainer_state.json").write_text("{}")
    (d / "not_a_checkpoint").mkdir()
    plain = d / "plain_llm"  # the tiny Llama without any chat template
    shutil.copytree(tiny_dir / "llama", plain, ignore=shutil.ignore_patterns("chat_template.*", "*.safetensors"))
    base = d / "base.yaml"
    base.write_text(f"model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama}}\n"
                    f"data: {{mixture: [{{path: {data}, image_folder: {images}}}]}}\n"
                    f"train: {{output_dir: {d}/out, report_to: []}}\n")
    return {"base": base, "d": d, "tiny": tiny_dir, "data": data, "images": images}


def _expand(items, setup):
    return [item.format(**setup) for item in items]


VALID = [
    [],
    ["train.deepspeed={d}/ds_fixed.json", "train.precision=bf16"],  # numbers that match are fine
    ["train.deepspeed=configs/deepspeed/zero3.json", "train.global_batch_size=8"],
    ["model.pretrained_projector={d}/mlp_projector.safetensors", "train.stage=2"],
    ["model.pretrained_projector={d}/mlp_norm_projector.safetensors", "model.norm_alignment=ln_textnorm_gwc"],
    ["train.resume={d}/checkpoint-2"],
    ["train.restart=true", "train.resume=none"],
    ["train.stage=2", "lora.enabled=true", "lora.target_modules=[q_proj, layers.0.mlp.up_proj]"],
    ["train.stage=2", "lora.enabled=true", "lora.lm_head=true", "model.llm={tiny}/qwen2"],  # untied
    ["model.llm={d}/plain_llm", "data.prompt_format=plain"],
    ["data.mixture=[{{path: {data}, take: 'first:50%'}}]", "train.report_to=[tensorboard]"],
]


@pytest.mark.parametrize("overrides", VALID)
def test_valid_settings_pass(setup, overrides, monkeypatch):
    monkeypatch.chdir(REPO)  # shipped DeepSpeed paths are relative to the repository root
    load_config(setup["base"], _expand(overrides, setup))


def test_a_projector_from_another_arm_llm_or_tower_is_refused_naming_both(setup):
    arm = _expand(["model.pretrained_projector={d}/mlp_norm_projector.safetensors", "model.norm_alignment=ln_textnorm"],
                  setup)
    with pytest.raises(ConfigError, match="norm_alignment 'ln_textnorm_gwc' \\(projector\\) vs 'ln_textnorm' "
                                          "\\(this config\\)"):
        load_config(setup["base"], arm)
    llm = _expand(["model.pretrained_projector={d}/qwen_projector.safetensors", "model.norm_alignment=ln_textnorm_gwc"],
                  setup)
    with pytest.raises(ConfigError, match=r"llm '\S*qwen2' \(projector\) vs '\S*llama' \(this config\)"):
        load_config(setup["base"], llm)
    tower = _expand(["model.pretrained_projector={d}/clip_projector.safetensors", "model.norm_alignment=ln_textnorm_gwc"],
                    setup)
    with pytest.raises(ConfigError, match=r"vision_tower '\S*clip' \(projector\) vs '\S*siglip' \(this config\)"):
        load_config(setup["base"], tower)
    for overrides in (arm, llm, tower):  # said explicitly, it is used
        load_config(setup["base"], [*overrides, "model.allow_projector_mismatch=true"])
    # A file without the tensors this arm and projector type load is refused by its modules,
    # allow_projector_mismatch or not: no model could load it.
    for overrides, found, needs in (
            (["model.pretrained_projector={d}/mlp_projector.safetensors", "model.norm_alignment=ln_textnorm"],
             "['linear_1', 'linear_2']", "['linear_1', 'linear_2', 'norm']"),
            (["model.pretrained_projector={d}/mlp_norm_projector.safetensors", "model.projector_type=linear",
              "model.norm_alignment=ln_default"], "['linear_1', 'linear_2', 'norm']", "['linear_1', 'norm']")):
        for allow in ([], ["model.allow_projector_mismatch=true"]):
            with pytest.raises(ConfigError, match=re.escape(f"holds projector modules {found}, but projector_type ")
                               + r".* needs " + re.escape(needs)):
                load_config(setup["base"], [*_expand(overrides, setup), *allow])
    # stage 1's run folder, or its whole model's weights, where its projector file goes: the file is named
    import shutil

    from safetensors.torch import save_file

    run = Path(setup["d"]) / "stage1-run"
    (run / "model").mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(setup["d"]) / "mlp_norm_projector.safetensors", run / "projector.safetensors")
    save_file({"model.language_model.norm.weight": torch.ones(2), "lm_head.weight": torch.ones(2, 2)},
              run / "model" / "model.safetensors")
    for given, said in ((run, f"{run} is a folder; give stage 1's projector file, {run / 'projector.safetensors'}"),
                        (run / "model", "is a folder; give stage 1's projector file (projector.safetensors in its run "
                                        "folder)"),
                        (run / "model" / "model.safetensors", "holds projector modules ['lm_head', 'model'], but "
                         "projector_type 'mlp2x_gelu' with norm_alignment 'ln_textnorm_gwc' needs ['linear_1', "
                         "'linear_2', 'norm'] (a whole model's weights? give stage 1's projector file)")):
        with pytest.raises(ConfigError, match=re.escape(f"key 'model.pretrained_projector': ") + ".*" + re.escape(said)):
            load_config(setup["base"], [f"model.pretrained_projector={given}", "model.norm_alignment=ln_textnorm_gwc"])
    # a copy that stopped part-way: its header whole, its tensors not (stage 2 met it in a traceback)
    whole = (run / "projector.safetensors").read_bytes()
    (run / "cut.safetensors").write_bytes(whole[:-10])
    with pytest.raises(ConfigError, match=re.escape(f"key 'model.pretrained_projector': {run / 'cut.safetensors'} is "
                                                    f"cut short: its header says {len(whole):,} bytes, the file has "
                                                    f"{len(whole) - 10:,}")):
        load_config(setup["base"], [f"model.pretrained_projector={run / 'cut.safetensors'}",
                                    "model.norm_alignment=ln_textnorm_gwc"])


def test_a_take_out_of_range_is_said_so():
    from llava_norm.config_schema import parse_take

    for take, said in (("first:0", "a count must be at least 1"), ("first:150%", "a share must be above 0% and at most 100%"),
                       ("first:0%", "a share must be above 0% and at most 100%"), ("first:x", "is not 'all', 'first:N'")):
        with pytest.raises(ConfigError, match=re.escape(f"key 'data.mixture[0].take': {take!r}") + ".*" + re.escape(said)):
            parse_take(take, "data.mixture[0].take")


def _bad(value: str) -> str:
    """A value just outside a RANGES spec."""
    return {"> 0": "0", ">= 1": "0", ">= 0": "-1", "[0, 1)": "1"}[value]


# (overrides, expected key (a regex), YAML text for a child of base.yaml or None)
CASES = [
    (["model.norm_alignmnt=ln_default"], "model.norm_alignmnt", None),  # unknown key
    ([], "train.max_stepz", "base: base.yaml\ntrain: {max_stepz: 3}\n"),
    (["train.stage=two"], "train.stage", None),  # wrong type
    ([], "optim.lr", "base: base.yaml\noptim: {lr: fast}\n"),
    (["train.train_vision_tower=maybe"], "train.train_vision_tower", None),
    (["train.stage=3"], "train.stage", None),
    (["train.profile_steps=[3,2]"], "train.profile_steps", None),  # last before first
    (["train.profile_steps=[0,2]"], "train.profile_steps", None),
    (["foo"], "foo", None),  # not KEY=VALUE
    (["data.mixture.0.path=x.json"], r"data.mixture.0.path", None),
    ([], "base", "base: missing_parent.yaml\n"),
    ([], "base", "base: child.yaml\n"),  # circular
    (["data.mixture=[]"], "data.mixture", None),
    (["data.mixture=[{{path: {data}, take: 'first:0'}}]"], r"data.mixture\[0\].take", None),
    (["data.mixture=[{{path: /nonexistent/x.json}}]"], r"data.mixture\[0\].path", None),  # missing data path
    (["data.mixture=[{{path: {images}}}]"], r"data.mixture\[0\].path", None),  # a directory
    (["data.mixture=[{{path: {data}, image_folder: /nonexistent/img}}]"], r"data.mixture\[0\].image_folder", None),
    (["data.mixture=[{{path: {data}, image_folder: {data}}}]"], r"data.mixture\[0\].image_folder", None),
    (["model.llm=./missing_local_llm"], "model.llm", None),
    (["model.vision_tower={images}"], "model.vision_tower", None),  # no config.json
    (["model.vision_tower={tiny}/llama"], "model.vision_tower", None),  # an LLM where the tower belongs
    (["model.llm={tiny}/siglip"], "model.llm", None),  # a dual encoder where the LLM belongs
    (["model.llm={d}/plain_llm"], "data.prompt_format", None),  # chat format, no chat template
    (["train.stage=1", "lora.enabled=true"], "lora.enabled", None),  # LoRA with a stage-1 config
    (["train.stage=2", "lora.enabled=true", "lora.target_modules=[]"], "lora.target_modules", None),
    (["train.stage=2", "lora.enabled=true", "lora.target_modules=[qkv]"], "lora.target_modules", None),
    (["train.stage=2", "lora.enabled=true", "lora.lm_head=true"], "lora.lm_head", None),  # tiny Llama is tied
    (["lora.vision_tower=partial"], "lora.vision_tower", None),
    (["data.packing=true", "model.trust_remote_code=true"], "model.trust_remote_code", None),
    # the untied tiny Qwen2, whose adapted lm_head is fine with the plain loss (VALID above)
    (["train.stage=2", "lora.enabled=true", "lora.lm_head=true", "model.llm={tiny}/qwen2", "train.loss=fused"],
     "lora.lm_head", None),
    (["train.stage=2", "lora.enabled=true", "lora.vision_tower=full", "train.train_vision_tower=false"],
     "lora.vision_tower", None),
    (["train.deepspeed={d}/missing.json"], "train.deepspeed", None),  # DeepSpeed file missing
    (["train.deepspeed={d}/bad.json"], "train.deepspeed", None),  # malformed JSON
    (["train.deepspeed={d}/list.json"], "train.deepspeed", None),
    (["train.deepspeed={d}/ds_optimizer.json"], "train.deepspeed", None),
    (["train.deepspeed={d}/ds_stage7.json"], "train.deepspeed", None),  # DeepSpeed refuses it once the model loaded
    (["train.deepspeed={d}/ds_micro3.json"], "train.deepspeed", None),  # per-device batch is 2
    (["train.deepspeed={d}/ds_bf16.json", "train.precision=fp32"], "train.deepspeed", None),
    (["train.resume={d}/missing_checkpoint"], "train.resume", None),
    (["train.resume={d}/not_a_checkpoint"], "train.resume", None),
    (["train.restart=true", "train.extend=true"], "train.restart", None),
    (["train.restart=true", "train.resume={d}/checkpoint-2"], "train.restart", None),
    (["train.output_dir={d}/a_file"], "train.output_dir", None),
    (["train.output_dir={d}/a_file/run"], "train.output_dir", None),  # under a file: it cannot be made
    (["model.pretrained_projector={d}/missing.safetensors"], "model.pretrained_projector", None),
    (["model.pretrained_projector={d}/bad.json"], "model.pretrained_projector", None),
    (["model.pretrained_projector={d}/mlp_projector.safetensors", "model.norm_alignment=ln_textnorm"],
     "model.pretrained_projector", None),  # a stage-1 projector of another arm
    (["model.pretrained_projector={d}/mlp_norm_projector.safetensors", "model.projector_type=linear",
      "model.norm_alignment=ln_default"], "model.pretrained_projector", None),
    # the GWC arm's stage-1 projector has the same tensors as ln_textnorm's and ln_default's
    (["model.pretrained_projector={d}/mlp_norm_projector.safetensors", "model.norm_alignment=ln_textnorm"],
     "model.pretrained_projector", None),
    (["model.pretrained_projector={d}/qwen_projector.safetensors", "model.norm_alignment=ln_textnorm_gwc"],
     "model.pretrained_projector", None),  # trained with another LLM
    (["model.pretrained_projector={d}/unrecorded_projector.safetensors", "model.norm_alignment=ln_textnorm_gwc"],
     "model.pretrained_projector", None),  # records no arm or backbones
    (["train.global_batch_size=7"], "train.global_batch_size", None),  # not a multiple of 2: on no world size
    (["data.mixture=[{{path: {data}}}, {{pth: {data}}}]"], "data.mixture\\[1\\].pth", None),  # a typo inside an entry
    ([], "data.mixture\\[0\\].image_foldr", "base: base.yaml\ndata: {mixture: [{path: x.json, image_foldr: y}]}\n"),
    # a value of the wrong shape: a mapping for a list, a list for a mapping, a value for a section
    ([], "data.mixture", "base: base.yaml\ndata: {mixture: {path: x.json}}\n"),
    ([], "data.template_kwargs", "base: base.yaml\ndata: {template_kwargs: [1]}\n"),
    ([], "train", "base: base.yaml\ntrain: 5\n"),
    (["data.template_kwargs=[1]"], "data.template_kwargs", None),
    (["train.max_steps=0"], "train.max_steps", None),
    (["train.epochs=0"], "train.epochs", None),
    (["optim.scheduler=cosine_with_min_lr"], "optim.scheduler", None),  # needs kwargs transformers lacks here
    (["train.report_to=[wandbx]"], "train.report_to", None),
    (["train.report_to=[none, tensorboard]"], "train.report_to", None),
    *[([f"{key}=bogus"], key, None) for key in CHOICES],  # every enum key
    *[([f"{key}={_bad(spec)}"], key, None) for key, spec in RANGES.items()],  # every bounded number
    # inf passes every lower bound: a run at optim.lr=inf trained to NaN weights and said it was done
    *[([f"{key}=inf"], key, None) for key, spec in RANGES.items() if not spec.startswith("[")],
]


def _load_case(setup, overrides, yaml_text):
    path = setup["base"]
    if yaml_text is not None:
        path = setup["d"] / "child.yaml"
        path.write_text(yaml_text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, _expand(overrides, setup))
    return path, str(caught.value)


@pytest.mark.parametrize("overrides,key,yaml_text", CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_config_errors_name_the_file_and_key(setup, overrides, key, yaml_text):
    path, message = _load_case(setup, overrides, yaml_text)
    assert "\n" not in message
    assert re.match(rf"{re.escape(str(path))}: key '{key}': \S", message), message


def test_missing_required_keys_and_bad_yaml_name_the_file(setup):
    path, message = _load_case(setup, [], "train: {stage: 1}\n")  # no base: nothing required is set
    assert message.startswith(f"{path}: key 'model.llm': required, but not set"), message
    path, message = _load_case(setup, [], "model: {llm: [unclosed\n")
    assert message.startswith(f"{path}: invalid YAML at line") and "\n" not in message, message
    # the same in a command-line value: that override is named, not taken for the file's own YAML
    path, message = _load_case(setup, ["optim.lr=1e-3", "data.mixture=[{{path: x.json}}"], None)  # (_expand's braces)
    assert message == f"{path}: key 'data.mixture': the command-line value '[{{path: x.json}}' is not valid YAML: " \
        "did not find expected ',' or ']'", message
    with pytest.raises(ConfigError, match="nowhere.yaml: config file not found"):
        load_config(setup["d"] / "nowhere.yaml")
    # a base that is neither a file name nor a list of them (list() took a mapping's keys for files)
    # (and one that is 0, false, {} or '': refused, not dropped as if there were none)
    for base, said in (("5", "5"), ("{a: 1}", "{'a': 1}"), ("0", "0"), ("false", "False"), ("{}", "{}"), ("''", "''")):
        path, message = _load_case(setup, [], f"base: {base}\n")
        assert message == f"{path}: key 'base': {said} is not a file name or a list of them", message


def test_a_value_the_command_line_gave_is_named_as_the_command_lines(setup):
    """Not blamed on the file alone; of several overrides, the one that set the key."""
    path, message = _load_case(setup, ["train.max_steps=3", "optim.lr=nan"], None)
    assert message == f"{path}: key 'optim.lr': must be a finite number >= 0, got nan (the command line's optim.lr=nan)"
    path, message = _load_case(setup, ["optim.lr=1e-3", "train.max_stepz=3"], None)
    assert message.endswith("(the command line's train.max_stepz=3)") and "optim.lr" not in message, message
    # an indexed key's error names the list it is in: its override is named all the same
    path, message = _load_case(setup, ["optim.lr=1e-3", "data.mixture[0].path=x.json"], None)
    assert message.endswith("(the command line's data.mixture[0].path=x.json)") and "optim.lr" not in message, message
    # a lone value where a list goes (transformers takes report_to=wandb): the list form is given
    path, message = _load_case(setup, ["train.report_to=wandb"], None)
    assert message == f"{path}: key 'train.report_to': expected a list, got a single value: write [wandb] (the " \
        "command line's train.report_to=wandb)", message
    path, message = _load_case(setup, ["train.max_steps=3"], "base: base.yaml\noptim: {lr: -1}\n")  # the file's own
    assert message == f"{path}: key 'optim.lr': must be >= 0, got -1.0", message


def test_an_error_in_a_base_file_names_that_file(setup):
    (setup["d"] / "parent.yaml").write_text("base: base.yaml\ndata: {image_aspec: pad}\n")
    path, message = _load_case(setup, [], "base: parent.yaml\n")
    assert message.startswith(f"{setup['d'] / 'parent.yaml'}: key 'data.image_aspec'"), message


def test_uninstalled_integrations_and_flash_attention(setup):
    from transformers.integrations.integration_utils import (INTEGRATION_TO_CALLBACK,
                                                             get_available_reporting_integrations)
    from transformers.utils import is_flash_attn_2_available

    absent = [n for n in INTEGRATION_TO_CALLBACK if n not in get_available_reporting_integrations() + ["azure_ml"]]
    if absent:
        _, message = _load_case(setup, [f"train.report_to=[{absent[0]}]"], None)
        assert f"key 'train.report_to': ['{absent[0]}'] not installed" in message
    if not is_flash_attn_2_available():
        _, message = _load_case(setup, ["model.attn_implementation=flash_attention_2"], None)
        assert "key 'model.attn_implementation'" in message


def test_a_named_fused_loss_kernel_needs_its_package(setup, monkeypatch):
    from llava_norm import config_checks

    # liger's distribution absent, cce's present (whatever this machine has installed)
    monkeypatch.setattr(config_checks, "FUSED_LOSS_DISTRIBUTIONS", {"liger": "no-such-distribution", "cce": "torch"})
    fused = ["train.loss=fused", "train.stage=2"]
    _, message = _load_case(setup, fused + ["train.fused_loss_kernel=liger"], None)
    assert "key 'train.fused_loss_kernel': liger needs the no-such-distribution package" in message, message
    load_config(setup["base"], fused)  # the chunked torch kernel, the default, needs none
    load_config(setup["base"], ["train.fused_loss_kernel=liger"])  # unused by the plain loss
    load_config(setup["base"], fused + ["train.fused_loss_kernel=cce"])


@pytest.mark.parametrize("overrides,key,said", [
    (["train.deepspeed={d}/bad.json"], "train.deepspeed", "launch check"),  # malformed DeepSpeed JSON: the file it names
    (["lora.enabled=true"], "lora.enabled", "config error"),  # LoRA with a stage-1 config
    (["optim.lr_lora=0", "train.stage=2"], "optim.lr_lora", "config error"),
])
def test_cli_reports_one_line_before_any_load(setup, overrides, key, said):
    """The real command: exit status, one stderr line naming file and key, nothing loaded or written."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "llava_norm.cli", "train", str(setup["base"]),
                             *_expand(overrides, setup)], capture_output=True, text=True, cwd=REPO, env=env,
                            timeout=300)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"{said}: {setup['base']}: key '{key}'"), lines[0]
    assert result.stdout == ""
    assert not (setup["d"] / "out").exists()  # run_training would have created output_dir
    assert time.monotonic() - start < 120


@pytest.mark.parametrize("script,config", [("pretrain.sh", "stage2.yaml"), ("finetune.sh", "stage1.yaml")])
def test_a_stage_script_refuses_the_other_stages_config(tmp_path, script, config):
    """pretrain.sh given a stage-2 config (or finetune.sh a stage-1 one) says so before anything
    loads; it used to override train.stage and train the other stage without a word. The config
    is named relative to where the script is called from (it runs from the repository root)."""
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(REPO / "scripts" / script), config, f"train.output_dir={out}"],
                            capture_output=True, text=True, cwd=REPO / "configs/tiny/none",
                            env={**os.environ, "GPUS_PER_NODE": "1"}, timeout=120)
    other, this = (2, 1) if script == "pretrain.sh" else (1, 2)
    assert result.returncode != 0 and not out.exists()
    assert result.stderr.strip() == (
        f"config error: {REPO / 'configs/tiny/none' / config}: key 'train.stage': the config trains stage {other}, "
        f"not stage {this} (scripts/{script} runs stage {this}): use the other script, or give train.stage={this}")


def test_the_scripts_read_paths_from_where_they_are_called(tmp_path):
    """The new user's trial: a misspelt config given to pretrain.sh from another folder was named
    as if under the repository root, and eval.sh read a relative checkpoint from there."""
    run = tmp_path / "stage2"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    said = {}
    for script, given in (("pretrain.sh", "stage1.yml"), ("eval.sh", "stage2")):
        result = subprocess.run(["bash", str(REPO / "scripts" / script), given], capture_output=True, text=True,
                                cwd=tmp_path, env={**os.environ, "GPUS_PER_NODE": "1"}, timeout=120)
        assert result.returncode != 0
        said[script] = result.stderr.strip().splitlines()[-1]
    assert said["pretrain.sh"] == f"config error: {tmp_path / 'stage1.yml'}: config file not found", said
    assert said["eval.sh"] == f"eval: {run} is a training run's folder, not a saved model: its model is " \
                              f"{run / 'model'}", said


@pytest.mark.parametrize("name,value", [("GPUS_PER_NODE", "0"), ("GPUS_PER_NODE", "two"), ("NNODES", "1x")])
def test_the_launcher_refuses_a_process_or_node_count_that_is_not_one_in_one_line(name, value):
    """torchrun met these as its own AssertionError or ValueError traceback."""
    given = {"GPUS_PER_NODE": "2", "NNODES": "1", name: value}
    done = subprocess.run(["bash", str(REPO / "scripts/_launch.sh"), "train", "c.yaml"], capture_output=True, text=True,
                          env={**os.environ, **given, "PYTHON": "/bin/echo"}, timeout=60)
    assert (done.returncode, done.stderr) == (2, f"_launch.sh: {name}={value}: expected a whole number of at least 1\n")
    assert done.stdout == ""  # nothing launched


def test_the_pipeline_script_reads_the_paths_typed_from_where_they_were_typed(tmp_path, monkeypatch):
    """scripts/pipeline.sh runs the chain in the checkout (the configs' own paths are the
    checkout's): the arm directories, --runs, --data-root, --table and the evaluation's data
    paths the user typed were read from there, so `--runs ../runs/x` typed in configs/ trained
    outside the checkout. It names where they were typed; the chain reads them from there."""
    from llava_norm.chain_cli import CALLED_FROM, PIPELINE_RUNS, _defaults, _paths_from_caller
    from llava_norm.cli import build_parser

    fake = tmp_path / "python"  # in place of the interpreter: where it runs, and what it is told
    fake.write_text('#!/bin/sh\necho "$LLAVA_NORM_CALLED_FROM $(pwd)"\n')
    fake.chmod(0o755)
    done = subprocess.run(["bash", str(REPO / "scripts/pipeline.sh")], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(fake)}, timeout=60)
    assert done.stdout.split() == [str(tmp_path), str(REPO)], done.stdout + done.stderr

    def parsed(*words: str):  # the pipeline's own parser, then what _pipeline does with the paths
        monkeypatch.setenv(CALLED_FROM, str(tmp_path))
        args = build_parser().parse_args(["pipeline", *words])
        _paths_from_caller(args)
        _defaults(args)
        return args

    monkeypatch.delenv("EVAL_DATA", raising=False)
    args = parsed("--runs", "../r", "--table", "t", "--eval-arg=--data=mmlu=m", "--eval-arg=--data-root",
                  "--eval-arg=d", "--eval-arg=--limit=5", "mine/none", "/abs/arm")
    assert args.arms == [str(tmp_path / "mine/none"), "/abs/arm"]
    assert (args.runs, args.table) == (str(tmp_path / "../r"), str(tmp_path / "t"))
    assert args.data_root == "data/eval"  # a default is the checkout's
    assert args.eval_arg == [f"--data=mmlu={(tmp_path / 'm').resolve()}", "--data-root", str((tmp_path / "d").resolve()),
                             "--limit=5"]
    # typed, a path equal to a default is read from where it was typed (it was the checkout's);
    # EVAL_DATA, set in the shell the command was typed in, too
    args = parsed("--runs", PIPELINE_RUNS, "--data-root", "data/eval", "arm")
    assert (args.runs, args.data_root) == (str(tmp_path / PIPELINE_RUNS), str(tmp_path / "data/eval"))
    monkeypatch.setenv("EVAL_DATA", "bench")
    assert parsed("arm").data_root == str(tmp_path / "bench")
    assert parsed("arm").runs == PIPELINE_RUNS  # not typed: the checkout's
    assert CALLED_FROM not in os.environ  # read once: no launch of the chain inherits it


@pytest.mark.parametrize("command", ["train", "plan"])
def test_train_and_plan_name_every_key_the_config_refuses_not_the_first_alone(command, tmp_path):
    """As `llava-norm check` lists them: a launch that fixes one key at a time would otherwise
    meet the next only on its next try (a queued job each time, on a cluster)."""
    from llava_norm.cli import main

    config = REPO / "configs/tiny/none/stage1.yaml"
    with pytest.raises(SystemExit) as stop:
        main([command, str(config), "optim.warmupx=1", f"train.output_dir={tmp_path}", "train.foo=2"])
    said = str(stop.value.code).splitlines()
    assert [line.split(": key ")[1].split(":")[0] for line in said] == ["'optim.warmupx'", "'train.foo'"], said
    assert all(line.startswith(f"config error: {config}: key ") for line in said), said
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["train", "check", "plan"])
def test_a_command_without_its_config_names_only_the_config_as_missing(command, capsys):
    """The overrides are optional: argparse names a '*' positional without a default as required."""
    from llava_norm.cli import main

    with pytest.raises(SystemExit) as stop:
        main([command])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: the following arguments are required: config")


def test_a_key_in_the_wrong_section_is_told_where_it_lives():
    config = CONFIGS / "llama3.2-3b/none/stage1.yaml"
    with pytest.raises(ConfigError, match=r"key 'train.lr': Key 'lr' not in 'TrainConfig'; the key is 'optim.lr' "):
        load_config(config, ["train.lr=1e-3"], check_paths=False)
    with pytest.raises(ConfigError, match=r"key 'optim.vision_tower': .*; the key is 'model.vision_tower' or "
                                          r"'lora.vision_tower'"):
        load_config(config, ["optim.vision_tower=x"], check_paths=False)
    with pytest.raises(ConfigError) as said:  # a key of no section: OmegaConf's own words alone
        load_config(config, ["train.max_stepz=3"], check_paths=False)
    assert "the key is" not in str(said.value)
