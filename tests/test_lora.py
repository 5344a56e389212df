"""LoRA stage 2 (peft): what trains, the saved layout, merging, ZeRO-2/3 (exact resume: the
packed-fused-lora case of tests/resumecases.py)."""

from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText

from launch import REPO, run_train, step_losses
from tinydata import write_dataset

from llava_norm.cli import main as cli_main
from llava_norm.config import ConfigError, OptimConfig, load_config
from llava_norm.model.builder import ModelSpec, build_model, load_bundle
from llava_norm.model.lora import ADAPTER_WEIGHTS, PEFT_PREFIX, is_lora_dir, lora_targets
from llava_norm.train.params import freeze_for_lora, learning_rates, module_of, unused_vision_parameters
from llava_norm.config import LoraSettings
from llava_norm.data.prompts import training_prompt_settings
from llava_norm.evaluation.settings import default_run_name

ZERO2 = REPO / "configs/deepspeed/zero2.json"
ZERO3 = REPO / "configs/deepspeed/zero3.json"
RATES = dict(lr=2.0e-3, lr_vision_tower=1.0e-4, lr_projector=3.0e-3, lr_norm=4.0e-3, lr_lora=5.0e-3)
COMMON = ["train.max_steps=8", f"train.deepspeed={ZERO2}"]


def _config(root: Path, tiny_dir: Path) -> Path:
    data, images = write_dataset(root / "data", n=32, text_only_every=3)
    path = root / "stage2_lora.yaml"
    path.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: ln_textnorm_gwc}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], prompt_format: chat, num_workers: 0, max_length: 256,
       system_prompt: You name shapes., image_aspect: pad}}
optim: {{{", ".join(f"{k}: {v}" for k, v in RATES.items())}, warmup_ratio: 0.0, scheduler: constant_with_warmup}}
train: {{stage: 2, per_device_batch_size: 2, grad_accum: 2, report_to: [], logging_steps: 1}}
lora: {{enabled: true, rank: 4, alpha: 8, dropout: 0.1, vision_tower: frozen}}
""")
    return path


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_dir):
    """One uninterrupted 2-process ZeRO-2 LoRA run, shared by the tests below."""
    root = tmp_path_factory.mktemp("lora")
    config = _config(root, tiny_dir)
    summary = run_train(config, [f"train.output_dir={root / 'ref'}", *COMMON])
    return config, root / "ref", summary


def _build(tiny_dir):
    return build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama", norm_alignment="ln_textnorm_gwc")).model


def test_lora_trains_adapters_projector_and_norm_only(lora_run, tiny_dir):
    _, out, summary = lora_run
    losses = step_losses(summary)
    values = [losses[s] for s in sorted(losses)]
    assert sorted(losses) == list(range(1, 9)) and sum(values[-3:]) < sum(values[:3]), values
    logged = next(e for e in summary["log_history"] if "lr/lora" in e)
    expected = learning_rates(OptimConfig(**RATES), lora=True)
    assert {k[3:]: v for k, v in logged.items() if k.startswith("lr/")} == pytest.approx(
        {k: expected[k] for k in ("lora", "projector", "norm")})

    model_dir = out / "model"
    assert is_lora_dir(model_dir)
    start = {k: v for k, v in _build(tiny_dir).state_dict().items()}
    base = load_file(str(model_dir / "model.safetensors"))
    assert set(start) - set(base) <= {"lm_head.weight"} and set(base) <= set(start)  # plain names, no lora_*
    changed = {module_of(k) for k in base if not torch.equal(start[k], base[k])}
    assert changed == {"projector", "norm"}, changed  # LLM and (frozen) vision tower bit-identical
    adapter = load_file(str(model_dir / ADAPTER_WEIGHTS))
    llm_linear = lora_targets(_build(tiny_dir))
    assert {k[len(PEFT_PREFIX):].rsplit(".lora_", 1)[0] for k in adapter} == set(llm_linear)
    assert all(v.abs().max() > 0 for k, v in adapter.items() if ".lora_B." in k)  # B starts at zero: trained
    assert set(load_file(str(out / "projector.safetensors"))) == {
        k for k in start if module_of(k) in ("projector", "norm")}


def _inputs(bundle):
    config = bundle.model.config
    pixels = bundle.image_processor(images=[Image.new("RGB", (40, 40), (220, 30, 30))],
                                    return_tensors="pt")["pixel_values"]
    text = bundle.tokenizer("What colour is the image?", add_special_tokens=False, return_tensors="pt").input_ids
    image = torch.full((1, config.image_seq_length), config.image_token_id)
    return {"input_ids": torch.cat([image, text], dim=1), "pixel_values": pixels}


@torch.no_grad()
def test_merged_model_matches_unmerged(lora_run, tmp_path):
    _, out, _ = lora_run
    merged_dir = tmp_path / "merged"
    cli_main(["merge-lora", str(out), str(merged_dir)])  # the run dir resolves to its model/
    for wrong in (merged_dir, tmp_path / "nowhere"):  # not a LoRA model: one line naming it
        with pytest.raises(SystemExit) as stop:
            cli_main(["merge-lora", str(wrong), str(tmp_path / "again")])
        assert stop.value.code == f"merge-lora: {wrong}: no adapter_config.json; not a LoRA model dir (nor a run " \
            "dir with one)"
    before = sorted(p.name for p in out.iterdir())
    for target, said in ((out, "write the merged model to a new directory, not over or inside the LoRA dir or "
                                "the run holding it"),  # the run's own folder
                         (out / "model" / "merged", "write the merged model to a new directory, not over or inside "
                                                    "the LoRA dir or the run holding it"),  # inside the model
                         (out / "merged", "write the merged model to a new directory, not over or inside the LoRA dir "
                                          "or the run holding it"),  # inside the run, beside its model
                         (merged_dir, "already holds files; give a new or empty directory")):  # another model's
        with pytest.raises(SystemExit) as stop:
            cli_main(["merge-lora", str(out), str(target)])
        assert stop.value.code == f"merge-lora: {target}: " + said + (" for the merged model" if target == merged_dir
                                                                       else "")
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written into the run
    (tmp_path / "empty").mkdir()  # an empty folder made for it is taken
    cli_main(["merge-lora", str(out), str(tmp_path / "empty")])
    assert (tmp_path / "empty" / "model.safetensors").is_file()
    assert not is_lora_dir(merged_dir) and not any("lora_" in k for k in load_file(
        str(merged_dir / "model.safetensors")))
    # evaluated or chatted with on its own, the merged model keeps the run's prompt settings
    settings = training_prompt_settings(merged_dir)
    assert settings == training_prompt_settings(out / "model")
    assert default_run_name(merged_dir) == default_run_name(out / "model") == "ln_textnorm_gwc"  # named as the run
    assert (settings.system_prompt, settings.image_aspect) == ("You name shapes.", "pad")
    unmerged = load_bundle(out / "model", merge_lora_adapter=False)
    inputs = _inputs(unmerged)
    lora_logits = unmerged.model.eval()(**inputs).logits
    unmerged.model.disable_adapters()
    base_logits = unmerged.model(**inputs).logits
    assert (lora_logits - base_logits).abs().max() > 1e-3  # the adapter matters, so the comparison can fail
    merged = AutoModelForImageTextToText.from_pretrained(merged_dir).eval()
    torch.testing.assert_close(merged(**inputs).logits, lora_logits, rtol=1e-4, atol=1e-5)
    merged_by_loader = load_bundle(out / "model").model.eval()  # load_bundle merges by default
    torch.testing.assert_close(merged_by_loader(**inputs).logits, lora_logits, rtol=1e-4, atol=1e-5)


def test_zero3_with_vision_lora_saves_and_loads(lora_run, tmp_path, tiny_dir):
    config, _, _ = lora_run
    out = tmp_path / "z3"
    run_train(config, [f"train.output_dir={out}", "train.max_steps=2", "train.save_steps=100",
                       f"train.deepspeed={ZERO3}", "lora.vision_tower=lora", "lora.target_modules=[q_proj,v_proj]"])
    adapter = load_file(str(out / "model" / ADAPTER_WEIGHTS))
    adapted = {k[len(PEFT_PREFIX):].rsplit(".lora_", 1)[0] for k in adapter}
    assert {a.rsplit(".", 1)[-1] for a in adapted if ".language_model." in a} == {"q_proj", "v_proj"}
    assert any(".vision_tower." in a for a in adapted)
    base = load_file(str(out / "model" / "model.safetensors"))
    start = _build(tiny_dir).state_dict()
    assert {module_of(k) for k in base if not torch.equal(start[k], base[k])} == {"projector", "norm"}
    assert load_bundle(out / "model").model.norm_layer is not None


def test_targets_and_trainable_sets(tiny_dir):
    model = _build(tiny_dir)
    llm = lora_targets(model)
    assert llm and all(n.startswith("model.language_model.") for n in llm)  # not lm_head, not the projector
    with pytest.raises(ValueError, match="key 'lora.lm_head'"):
        lora_targets(model, lm_head=True)  # the tiny Llama ties lm_head to its embeddings
    qwen = build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/qwen2")).model  # untied
    assert lora_targets(qwen, lm_head=True)[-1] == "lm_head"
    with pytest.raises(ValueError, match="key 'lora.target_modules': 'qkv'"):
        lora_targets(model, ["qkv"])
    unused = unused_vision_parameters(model)
    trainable = freeze_for_lora(model, LoraSettings(rank=2, alpha=4), "full")
    assert trainable == {"projector": True, "norm": True, "lora": True, "llm": False, "vision_tower": True}
    on = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {module_of(n) for n in on} == {"projector", "norm", "lora", "vision_tower"}
    assert unused and not on & unused  # layers past the feature layer stay frozen

    model = _build(tiny_dir)
    freeze_for_lora(model, LoraSettings(rank=2, alpha=4), "lora")
    vision_adapters = {n.split(".lora_")[0] for n, p in model.named_parameters()
                       if p.requires_grad and ".vision_tower." in n}
    assert vision_adapters and all(f"{n}.weight" not in unused for n in vision_adapters)
    assert not any(p.requires_grad for n, p in model.named_parameters() if module_of(n) in ("llm", "vision_tower"))


@pytest.mark.parametrize("overrides,message", [
    (["train.stage=1"], "key 'lora.enabled'"),
    (["lora.rank=0"], "key 'lora.rank'"),
    (["lora.dropout=1.0"], "key 'lora.dropout'"),
    (["lora.vision_tower=partial"], "key 'lora.vision_tower'"),
    (["lora.vision_tower=full", "train.train_vision_tower=false"], "key 'lora.vision_tower'"),
    (["lora.target_modules=[]"], "key 'lora.target_modules'"),
    (["optim.lr_lora=0"], "key 'optim.lr_lora'"),
    (["lora.rnk=4"], "key 'lora.rnk'"),
])
def test_lora_config_errors_name_the_key(overrides, message):
    path = REPO / "configs/tiny/ln_textnorm_gwc/stage2_lora.yaml"
    with pytest.raises(ConfigError, match=message):
        load_config(path, overrides, check_paths=False)


@pytest.mark.parametrize("backbone", ["llama3.2-3b", "qwen2.5-7b", "qwen3-8b", "clip336-llama3.2-3b", "tiny"])
def test_shipped_lora_configs(backbone):
    config = load_config(REPO / f"configs/{backbone}/ln_textnorm_gwc/stage2_lora.yaml", check_paths=False)
    stage2 = load_config(REPO / f"configs/{backbone}/ln_textnorm_gwc/stage2.yaml", check_paths=False)
    assert config.lora.enabled and config.train.stage == 2 and config.lora.target_modules is None
    assert config.model == stage2.model and config.data == stage2.data  # only the LoRA bits differ
    assert config.train.output_dir == f"{stage2.train.output_dir}_lora"
    if backbone != "tiny":
        assert (config.lora.rank, config.lora.alpha, config.optim.lr_lora, config.optim.lr_projector) == (
            128, 256, 2e-4, 2e-5)


def test_each_group_trains_at_its_own_configured_rate_and_decays_only_matrices(tiny_dir):
    """Every ``optim.lr*`` key reaches its own optimizer group, against literal rates (the launched
    runs compare the logged rates with ``learning_rates`` itself, which would carry a wrong entry
    to both sides); weight decay only on parameters of two or more dimensions; stage 1 trains the
    projector and the norm alone, stage 2 without ``train_vision_tower`` leaves the tower frozen."""
    from llava_norm.train.params import freeze_backbones, parameter_groups

    optim = OptimConfig(lr=1.0, lr_vision_tower=0.5, lr_projector=2.0, lr_norm=3.0, lr_lora=4.0, weight_decay=0.1)
    assert learning_rates(optim, lora=True) == {"llm": 1.0, "vision_tower": 0.5, "projector": 2.0, "norm": 3.0,
                                                "lora": 4.0}

    def groups(model):
        found = {}
        for group in parameter_groups(model, optim):
            name = group["name"].removesuffix("_decay")
            assert group["weight_decay"] == (0.1 if group["name"].endswith("_decay") else 0.0), group["name"]
            assert all((p.ndim >= 2) == group["name"].endswith("_decay") for p in group["params"]), group["name"]
            assert found.setdefault(name, group["lr"]) == group["lr"]
        return found

    def fresh():
        return build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama", norm_alignment="ln_textnorm_gwc")).model

    model = fresh()
    freeze_backbones(model, 2)
    assert groups(model) == {"llm": 1.0, "vision_tower": 0.5, "projector": 2.0, "norm": 3.0}
    model = fresh()
    freeze_backbones(model, 2, train_vision_tower=False)
    assert groups(model) == {"llm": 1.0, "projector": 2.0, "norm": 3.0}
    assert not any(p.requires_grad for p in model.model.vision_tower.parameters())
    model = fresh()
    freeze_backbones(model, 1)
    assert groups(model) == {"projector": 2.0, "norm": 3.0}
    model = fresh()
    freeze_for_lora(model, LoraSettings(rank=2, alpha=4), "frozen")
    assert groups(model) == {"lora": 4.0, "projector": 2.0, "norm": 3.0}


def test_the_norms_rate_falls_back_to_the_projectors_and_that_to_the_llms():
    """README, Training: `optim.lr_norm` (null = the projector's, which is null = the LLM's)."""
    rates = learning_rates(OptimConfig(lr=1.0, lr_projector=2.0))
    assert (rates["projector"], rates["norm"]) == (2.0, 2.0)
    rates = learning_rates(OptimConfig(lr=1.0))
    assert (rates["projector"], rates["norm"]) == (1.0, 1.0)
    assert learning_rates(OptimConfig(lr=1.0, lr_projector=2.0, lr_norm=3.0))["norm"] == 3.0
    assert "`optim.lr_norm` (null = the projector's, which is null = the LLM's)" in (REPO / "README.md").read_text()
