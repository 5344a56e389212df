"""llava-norm plan: parameter counts against built models, model states against DeepSpeed's
estimators, the activation trace, the verdict, and every shipped config offline."""

import json
import re
from pathlib import Path

import pytest
import torch
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

from llava_norm.config import ConfigError, load_config
from llava_norm.model.builder import ModelSpec, build_model
from llava_norm.plan import format_plan, make_plan
from llava_norm.plan.estimate import FIT_FRACTION
from llava_norm.plan.backbones import SHIPPED_BACKBONES, backbone_config
from llava_norm.plan.memory import Activations, count_parameters, trace_activations, trace_loss_kinds
from llava_norm.train.params import freeze_backbones

ROOT = Path(__file__).resolve().parents[1]


def _config(tmp_path, tiny_dir, train: str = ""):
    path = tmp_path / "c.yaml"
    path.write_text(f"model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: "
                    f"ln_textnorm_gwc}}\ntrain: {{output_dir: {tmp_path}/out{train}}}\n"
                    "data: {mixture: [{path: nowhere.json}], max_length: 160}\n")
    return load_config(path, check_paths=False)


@pytest.mark.parametrize("stage", [1, 2])
def test_parameter_counts_equal_the_built_model(tmp_path, tiny_dir, stage):
    config = _config(tmp_path, tiny_dir, f", stage: {stage}")
    plan = make_plan(config, alternatives=False)
    bundle = build_model(ModelSpec(vision_tower=f"{tiny_dir}/siglip", llm=f"{tiny_dir}/llama",
                                   norm_alignment="ln_textnorm_gwc"))
    freeze_backbones(bundle.model, stage)
    built = {c.name: (c.total, c.trained) for c in count_parameters(bundle.model)}
    planned = {c.name: (c.total, c.trained) for c in plan.components}
    # the built model's embeddings grew by the <image> row(s); the plan has no tokenizer
    grown = built.pop("llm embeddings")[0] - planned.pop("llm embeddings")[0]
    assert 0 <= grown <= 64 * bundle.model.config.text_config.hidden_size
    assert planned == built
    assert plan.trained == sum(p.numel() for p in bundle.model.parameters() if p.requires_grad) - (
        grown if stage == 2 else 0)
    # a tiny model's figures in units that show them, not 0.00 PFLOP and 0.0 GiB
    printed = format_plan(plan)
    assert re.search(r"\b[1-9][\d.]* GFLOP of model FLOPs", printed) and re.search(r"start-up: [1-9][\d.]* MiB", printed), \
        printed


def test_model_states_are_deepspeeds_estimators(tmp_path, tiny_dir):
    """DeepSpeed's own estimators, plus for ZeRO-2 the shipped zero2.json's two gradient buckets of
    5e7 elements in bf16 (overlap_comm), which the estimator leaves out."""
    config = _config(tmp_path, tiny_dir, f", stage: 2, deepspeed: {ROOT}/configs/deepspeed/zero3.json")
    plan = make_plan(config, gpus=4, nodes=2, alternatives=False)
    trained, frozen = plan.trained, plan.total_params - plan.trained
    assert frozen > 0  # the tower's layers past the feature layer
    _, zero2 = estimate_zero2_model_states_mem_needs(trained, 4, 2, cpu_offload=False)
    assert plan.states["zero2"].total == zero2 + 2 * frozen + 2 * 50_000_000 * 2
    largest = max(sum(p.numel() for p in m.parameters(recurse=False))
                  for m in build_model(ModelSpec(vision_tower=f"{tiny_dir}/siglip",
                                                 llm=f"{tiny_dir}/llama")).model.modules())
    _, zero3, _ = estimate_zero3_model_states_mem_needs(trained, largest, 4, 2, cpu_offload=False,
                                                        cpu_offload_params=False)
    # the built model's embedding may be up to 64 rows larger than the config's
    assert plan.states["zero3"].total == pytest.approx(zero3 + 2 * frozen // 8, rel=0.02)
    assert plan.layout == "zero3"


@pytest.mark.parametrize("softmax", ["auto", "eager"])
def test_one_tower_trace_for_both_loss_kinds_gives_each_kinds_own_trace(tmp_path, tiny_dir, softmax):
    """A plain-loss plan traces the vision tower once for its plain and fused figures: each equals
    the trace of that loss kind alone."""
    from llava_norm.plan.backbones import meta_model

    meta, tokens_per_image, _ = meta_model(_config(tmp_path, tiny_dir).model, attn_implementation="llava_norm_plan")
    alone = [trace_activations(meta, 2, 160, 2, tokens_per_image, kind, softmax) for kind in ("plain", "fused")]
    assert alone[0] != alone[1]
    assert trace_loss_kinds(meta, 2, 160, 2, tokens_per_image, ("plain", "fused"), softmax) == alone


def test_meta_trace_equals_the_trace_of_real_tensors(tmp_path, tiny_dir):
    """What the plan counts on the meta device is what the same forward saves with real weights."""
    from llava_norm.plan.backbones import meta_model

    config = _config(tmp_path, tiny_dir)
    meta, tokens_per_image, _ = meta_model(config.model, attn_implementation="llava_norm_plan",
                                          dtype=torch.float32)
    real = build_model(ModelSpec(vision_tower=f"{tiny_dir}/siglip", llm=f"{tiny_dir}/llama",
                                 norm_alignment="ln_textnorm_gwc", attn_implementation="llava_norm_plan")).model
    on_meta = trace_activations(meta, 2, 160, 2, tokens_per_image)
    on_cpu = trace_activations(real, 2, 160, 2, tokens_per_image)
    assert on_meta.layers == on_cpu.layers
    # outside the layers only the logits differ: the built vocabulary gained the <image> row(s)
    grown = real.config.text_config.vocab_size - meta.config.text_config.vocab_size
    assert grown > 0 and on_cpu.largest_tensor - on_meta.largest_tensor == 2 * 160 * grown * 4
    assert 0 < on_cpu.outside_layers - on_meta.outside_layers <= 2 * 160 * grown * 4 * 2
    # it grows with the batch, and the fp32 logits of every position are in it
    vocab = meta.config.text_config.vocab_size
    assert on_meta.largest_tensor >= 2 * 160 * vocab * 4
    assert trace_activations(meta, 4, 160, 4, tokens_per_image).total(False) > 1.9 * on_meta.total(False)
    # With the fused loss, whose chunks a meta forward skips (they would compute nothing there):
    # the same layers, and outside them only the fused term's own vocabulary difference.
    from llava_norm.model.loss import fused_held_bytes

    fused_meta = trace_activations(meta, 2, 160, 2, tokens_per_image, "fused")
    fused_cpu = trace_activations(real, 2, 160, 2, tokens_per_image, "fused")
    assert fused_meta.layers == fused_cpu.layers == on_meta.layers
    hidden, rows = meta.config.text_config.hidden_size, 2 * 160
    held = {m: fused_held_bytes(rows, hidden, m.lm_head.weight.shape[0], 4, True, compiled=True) for m in (meta, real)}
    assert fused_cpu.outside_layers - fused_meta.outside_layers == held[real] - held[meta] > 0


def test_checkpointing_keeps_layer_inputs_and_rebuilds_one_layer():
    acts = Activations(outside_layers=100, layers=((50, 5), (70, 5), (60, 5)), largest_tensor=30)
    assert acts.total(False) == 100 + 180
    assert acts.total(True) == 100 + 15 + 70


def test_fit_verdict_and_the_changes_that_fit(tmp_path, capsys):
    from llava_norm.cli import main

    # one GPU unless told, as `llava-norm check` and a lone `train` launch
    main(["plan", str(ROOT / "configs/qwen2.5-7b/ln_textnorm_gwc/stage2.yaml"), "--gpu", "h100-80gb", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert (plan["gpus"], plan["nodes"]) == (1, 1)
    assert plan["fits"] is False and plan["sources"]["llm"].startswith("shipped")
    assert any(a["change"].startswith("ZeRO-3 on") for a in plan["alternatives"])
    main(["plan", str(ROOT / "configs/qwen2.5-7b/ln_textnorm_gwc/stage2.yaml"), "--gpus", "8", "--gpu", "h100-80gb"])
    out = capsys.readouterr().out
    assert "FITS: peak" in out
    params = {k: v["total"] for k, v in plan["parameters"].items()}
    assert sum(params.values()) == pytest.approx(0.428e9 + 7.62e9, rel=0.01)  # SigLIP-SO400M tower + Qwen2.5-7B


@pytest.mark.parametrize("global_batch", [", global_batch_size: 4", ", grad_accum: 1, global_batch_size: null"])
def test_the_smaller_batch_change_offers_the_peak_of_that_change(tmp_path, tiny_dir, global_batch):
    """The alternative "train.per_device_batch_size=B (grad_accum grows ...)" offers the peak that
    config's own plan has: accumulating where the config did not changes how gradients and
    activations overlap (it offered the peak without accumulation, 14% low, as a fit)."""
    def planned(batch, accum):
        return make_plan(_config(tmp_path, tiny_dir, f", stage: 2, per_device_batch_size: {batch}, grad_accum: {accum}, "
                                                     "global_batch_size: null"), alternatives=False).peak()

    base, half, quarter = planned(4, 1), planned(2, 2), planned(1, 4)
    assert base > half > quarter
    for room, batch, peak in (((base + half) / 2, 2, half), ((half + quarter) / 2, 1, quarter)):
        plan = make_plan(_config(tmp_path, tiny_dir, f", stage: 2, per_device_batch_size: 4{global_batch}"),
                         gpu_memory_gib=room / FIT_FRACTION / 2 ** 30)
        offered = [(change.split(" ")[0], round(gib * 2 ** 30)) for change, gib in plan.alternatives
                   if change.startswith("train.per_device_batch_size")]
        assert offered == [(f"train.per_device_batch_size={batch}", peak)], (offered, base, half, quarter)


def test_unknown_gpu_is_an_error_naming_the_known_ones():
    from llava_norm.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["plan", str(ROOT / "configs/llama3.2-3b/none/stage2.yaml"), "--gpu", "h100-80g"])
    assert "unknown GPU 'h100-80g'; known:" in stop.value.code and "h100-80gb" in stop.value.code


SHIPPED = sorted(p for d in ("llama3.2-3b", "qwen2.5-7b", "qwen3-8b", "clip336-llama3.2-3b", "recipe-1gpu")
                 for p in (ROOT / "configs" / d / "ln_textnorm_gwc").glob("stage*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_every_shipped_config_plans_offline(path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(ROOT)
    plan = make_plan(load_config(path, check_paths=False), gpus=8, gpu_memory_gib=80.0, alternatives=False)
    assert all(source.startswith("shipped") for source in plan.sources.values())
    assert plan.trained > 0 and plan.step_flops.total > 0 and plan.peak() > 0


def test_every_backbone_the_configs_name_is_shipped():
    names = set()
    for yaml in (ROOT / "configs" / "_base").glob("*.yaml"):
        for line in yaml.read_text().splitlines():
            key, _, value = line.strip().partition(":")
            if key in ("vision_tower", "llm") and "/" in value and "runs/" not in value:
                names.add(value.split("#")[0].strip())
    assert names and all((SHIPPED_BACKBONES / name / "config.json").is_file() for name in names), names
    for name in names:
        assert backbone_config(name, "model.llm").source.startswith("shipped")


def test_a_hub_id_the_hub_cannot_be_reached_for_says_how_to_run_offline(monkeypatch):
    """A backbone neither local, cached nor shipped, where the hub does not answer (transformers'
    own wording for no connection, stood in for: the real one retries for half a minute): the
    key, the id and how to run without internet; another failure says only what it was."""
    import llava_norm.plan.backbones as backbones

    def unreachable(name, **kwargs):
        if kwargs.get("local_files_only"):
            raise OSError(f"{name} is not in the cache")
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
                      "in the cached files.\nCheck your internet connection")

    monkeypatch.setattr(backbones.AutoConfig, "from_pretrained", unreachable)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ConfigError) as said:
        backbone_config("org/some-llm", "model.llm")
    assert str(said.value).startswith("key 'model.llm': 'org/some-llm' is not a local directory, not in the hub cache")
    assert str(said.value).endswith("; without internet here, download it where there is (hf download org/some-llm) "
                                    "into the cache this machine reads (HF_HOME) and set HF_HUB_OFFLINE=1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # already set: the hub was not asked, and setting it is no advice
    with pytest.raises(ConfigError) as said:
        backbone_config("org/some-llm", "model.llm")
    assert str(said.value).endswith("; HF_HUB_OFFLINE is set, so the hub was not asked: download it (hf download "
                                    "org/some-llm) into the cache this machine reads (HF_HOME)")
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def refused(name, **kwargs):
        raise OSError("org/other is not a valid model identifier")

    monkeypatch.setattr(backbones.AutoConfig, "from_pretrained", refused)
    with pytest.raises(ConfigError) as said:
        backbone_config("org/other", "model.llm")
    assert str(said.value).endswith("the hub did not answer (org/other is not a valid model identifier)")


def test_accumulated_gradients_do_not_overlap_the_activations():
    from llava_norm.plan.memory import States, peak_bytes

    states, acts = States("zero2", total=100, gradients=30), Activations(10, ((20, 1),), largest_tensor=5)
    assert peak_bytes(states, acts, False, grad_accum=1) == 70 + max(30, 30 + 10)  # overlap while released
    assert peak_bytes(states, acts, False, grad_accum=4) == 100 + 30 + 10  # earlier gradients stay alive


def test_lora_flops_skip_the_frozen_llms_weight_gradients(tmp_path, tiny_dir):
    full = make_plan(_config(tmp_path, tiny_dir, ", stage: 2"), alternatives=False)
    (tmp_path / "lora").mkdir()
    path = tmp_path / "lora" / "c.yaml"
    path.write_text((tmp_path / "c.yaml").read_text() + "lora: {enabled: true, rank: 4, vision_tower: lora}\n")
    lora = make_plan(load_config(path, check_paths=False), alternatives=False)
    text = full.config.model  # same backbones
    assert text == lora.config.model
    assert lora.step_flops.llm < full.step_flops.llm  # 4 of 6 per weight: no weight gradients
    assert lora.step_flops.vision == full.step_flops.vision  # adapters in the tower: its backward runs


def test_lora_adapters_made_on_meta_are_the_ones_peft_moves_there(tmp_path, tiny_dir, monkeypatch):
    """The plan makes LoRA's adapters on the meta device (no random numbers for a 7B model's
    adapters: every initialisation peft and torch run lands on meta): they must come out as
    peft's own path leaves them, built on the CPU and moved to each base layer's device and dtype
    (bf16 here): the same parameters and the same trace."""
    from llava_norm.config import lora_vision_mode
    from llava_norm.plan.backbones import meta_model
    from llava_norm.plan.estimate import _freeze
    from llava_norm.train.params import freeze_for_lora

    initialised = []  # (init, device) of each tensor LoRA's layers initialise: A by kaiming (and the Linear's
    for name in ("kaiming_uniform_", "zeros_"):  # own reset), B by zeros
        def recorded(tensor, *a, real=getattr(torch.nn.init, name), name=name, **k):
            initialised.append((name, tensor.device.type))
            return real(tensor, *a, **k)
        monkeypatch.setattr(torch.nn.init, name, recorded)
    config = _config(tmp_path, tiny_dir, ", stage: 2")
    config.lora.enabled, config.lora.rank, config.lora.vision_tower = True, 4, "lora"
    planned, tokens_per_image, _ = meta_model(config.model, attn_implementation="llava_norm_plan")
    initialised.clear()
    _freeze(planned, config)
    assert {init for init, _ in initialised} == {"kaiming_uniform_", "zeros_"}, initialised
    assert {device for _, device in initialised} == {"meta"}, initialised
    stock, _, _ = meta_model(config.model, attn_implementation="llava_norm_plan")
    initialised.clear()
    freeze_for_lora(stock, config.lora, lora_vision_mode(config))
    assert ("kaiming_uniform_", "cpu") in initialised  # what the plan avoids: peft's own path draws them on the CPU

    def described(model):
        return [(n, p.shape, p.dtype, p.device.type, p.requires_grad) for n, p in model.named_parameters()]

    assert described(planned) == described(stock)
    assert any("lora_A" in n and dtype == torch.bfloat16 for n, _, dtype, _, _ in described(planned))
    assert trace_activations(planned, 2, 160, 2, tokens_per_image) == trace_activations(stock, 2, 160, 2,
                                                                                         tokens_per_image)


def test_overrides_may_follow_the_options(capsys):
    from llava_norm.cli import main

    main(["plan", str(ROOT / "configs/llama3.2-3b/ln_textnorm_gwc/stage2.yaml"), "--gpus", "8", "--json",
          "train.loss=fused", "train.gradient_checkpointing=false"])
    plan = json.loads(capsys.readouterr().out)
    assert plan["checkpointing"] is False
    main(["plan", str(ROOT / "configs/llama3.2-3b/ln_textnorm_gwc/stage2.yaml"), "--json", "--seq-len", "1500",
          "--images-per-row", "2"])
    rows = json.loads(capsys.readouterr().out)["micro_batch"]
    assert (rows["tokens"], rows["images_per_row"]) == (1500, 2)
    with pytest.raises(SystemExit):
        main(["plan", str(ROOT / "configs/llama3.2-3b/ln_textnorm_gwc/stage2.yaml"), "--bogus"])
    with pytest.raises(SystemExit, match="at least 1"):
        main(["plan", str(ROOT / "configs/llama3.2-3b/ln_textnorm_gwc/stage2.yaml"), "--images-per-row", "0"])


def test_the_fused_terms_blocks_are_counted_only_for_the_eager_softmax(tmp_path, tiny_dir):
    """train.fused_loss_softmax reaches the plan: eager adds the fp32 blocks the compiled kernel
    (what auto runs on a GPU) never makes; the plan traces the bf16 model, every position a label."""
    from transformers import AutoConfig

    from llava_norm.model.loss import fused_held_bytes

    plans = {s: make_plan(_config(tmp_path, tiny_dir, f", stage: 2, loss: fused, fused_loss_softmax: {s}"),
                          alternatives=False) for s in ("auto", "eager")}
    llm = AutoConfig.from_pretrained(f"{tiny_dir}/llama")
    rows = plans["auto"].batch * plans["auto"].seq
    blocks = (fused_held_bytes(rows, llm.hidden_size, llm.vocab_size, 2, True, compiled=False)
              - fused_held_bytes(rows, llm.hidden_size, llm.vocab_size, 2, True, compiled=True))
    assert plans["eager"].activations.outside_layers - plans["auto"].activations.outside_layers == blocks > 0


@pytest.mark.parametrize("zero, buckets", [
    ({"reduce_bucket_size": "auto", "overlap_comm": True}, 2 * 96 * 96),  # transformers: hidden_size squared
    ({"reduce_bucket_size": 1000}, 1000),  # DeepSpeed: overlap_comm off unless set, so one bucket
    ({}, 500_000_000),  # DeepSpeed's own default size
    ({"reduce_bucket_size": 1000, "overlap_comm": True, "contiguous_gradients": False}, 0),  # no staging buffers
])
def test_zero2_gradient_bucket_term_for_each_setting(zero, buckets):
    """The bucket term's arithmetic for each setting (DeepSpeed's own allocation is held against it in
    test_training_single.py): ``reduce_bucket_size`` elements, two with overlap_comm, in the training
    precision, bf16 (2 bytes) unless the run is fp32."""
    from llava_norm.plan.estimate import gradient_bucket_bytes

    settings = {"zero_optimization": {"stage": 2, **zero}}
    assert gradient_bucket_bytes(settings, 96, "auto") == 2 * buckets
    assert gradient_bucket_bytes(settings, 96, "fp32") == 4 * buckets


def test_rows_too_short_for_one_image_are_said_naming_the_key():
    """data.max_length (or data.pack_max_tokens when packing) below one image's tokens: training
    would skip every row with an image; the plan says which key, not the trace's row arithmetic."""
    config = ROOT / "configs/recipe-1gpu/none/stage2.yaml"
    for overrides, key in ((["data.max_length=5"], "key 'data.max_length': 5 tokens"),
                           (["data.packing=true", "data.pack_max_tokens=100"], "key 'data.pack_max_tokens': 100 tokens")):
        with pytest.raises(ValueError, match=f"{key} per row do not hold 1 image\\(s\\) of 196 tokens"):
            make_plan(load_config(config, overrides, check_paths=False), alternatives=False)
