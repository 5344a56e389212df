"""Configs: every shipped YAML loads; errors name the key; the paper's recipe is what ships."""

from pathlib import Path

import pytest

from llava_norm.config import ConfigError, effective_grad_accum, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ARMS = ["none", "ln_default", "ln_textnorm", "ln_textnorm_gwc"]


@pytest.mark.parametrize("backbone", ["llama3.2-3b", "qwen2.5-7b", "tiny"])
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
        assert s1.optim.warmup_ratio == s2.optim.warmup_ratio == 0.03 and s1.train.seed == 42
        assert s1.model.vision_tower == "google/siglip-so400m-patch14-384"


def test_global_batch_derives_accumulation():
    cfg = load_config(CONFIGS / "llama3.2-3b/none/stage1.yaml", check_paths=False).train
    assert effective_grad_accum(cfg, 64) == 2 and effective_grad_accum(cfg, 8) == 16
    with pytest.raises(ConfigError, match="global_batch_size"):
        effective_grad_accum(cfg, 3)


@pytest.fixture()
def base_yaml(tmp_path):
    data = tmp_path / "d.json"
    data.write_text("[]")
    path = tmp_path / "base.yaml"
    path.write_text(f"model: {{vision_tower: org/vision, llm: org/llm}}\n"
                    f"data: {{mixture: [{{path: {data}}}]}}\ntrain: {{output_dir: {tmp_path}/out}}\n")
    return path


@pytest.mark.parametrize("overrides,message", [
    (["model.norm_alignmnt=ln_default"], "key 'model.norm_alignmnt'"),
    (["train.stage=two"], "key 'train.stage'"),
    (["model.norm_alignment=ln_fancy"], "key 'model.norm_alignment'"),
    (["data.mixture=[{path: /nonexistent/x.json}]"], r"key 'data.mixture\[0\].path': path does not exist"),
    (["model.llm=./missing_local_llm"], "key 'model.llm': path does not exist"),
    (["data.mixture=[]"], "key 'data.mixture'"),
])
def test_config_errors_name_the_key(base_yaml, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(base_yaml, overrides)


def test_inheritance_and_unknown_key_in_file(base_yaml, tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text("base: base.yaml\nmodel: {norm_alignment: ln_textnorm_gwc}\n")
    config = load_config(child, ["optim.lr=3e-5"])
    assert (config.model.norm_alignment, config.optim.lr, config.model.llm) == ("ln_textnorm_gwc", 3e-5, "org/llm")
    child.write_text("base: base.yaml\ntrain: {max_stepz: 3}\n")
    with pytest.raises(ConfigError, match=r"child.yaml: key 'train.max_stepz'"):
        load_config(child)
    missing = tmp_path / "m.yaml"
    missing.write_text("train: {stage: 1}\n")
    with pytest.raises(ConfigError, match="required key"):
        load_config(missing)
