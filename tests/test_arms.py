"""The arms beyond the paper's four: RMSNorm with text-norm init (with and without GWC), and the
scaling arms (to norm T; by a frozen c; by one learned s). Each: its formula, its initialisation,
its gradient; built through the real builder, saved and loaded; c calibrated at stage 1."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from llava_norm.config import load_config
from llava_norm.config_schema import NORM_ARMS, ConfigError
from llava_norm.model.builder import ModelSpec, build_model, load_bundle
from llava_norm.model.norm_align import GlobalWeightCompensatedLayerNorm, VisualScale, build_alignment, get_arm

D, T = 48, 1.7


def _tokens(seed=0):
    torch.manual_seed(seed)
    return (torch.randn(3, 9, D) * 20 + 2).requires_grad_()


def test_every_arm_name_builds_its_layer():
    kinds = {name: type(build_alignment(arm, D, T, 1e-6, 1e-5, "auto")).__name__ for name, arm in NORM_ARMS.items()}
    assert kinds == {"none": "NoneType", "ln_default": "GlobalWeightCompensatedLayerNorm",
                     "ln_textnorm": "GlobalWeightCompensatedLayerNorm",
                     "ln_textnorm_gwc": "GlobalWeightCompensatedLayerNorm",
                     "rms_textnorm": "GlobalWeightCompensatedLayerNorm",
                     "rms_textnorm_gwc": "GlobalWeightCompensatedLayerNorm",
                     "scale_to_t": "VisualScale", "scale_fixed": "VisualScale", "scale_learned": "VisualScale"}


def test_rms_textnorm_is_rmsnorm_and_every_token_leaves_at_norm_T():
    layer = build_alignment(get_arm("rms_textnorm"), D, T, 1e-6, 1e-5, "auto")
    x = _tokens()
    out = layer(x)
    torch.testing.assert_close(out, F.rms_norm(x, (D,), layer.weight, layer.eps))
    assert layer.bias is None and layer.weight[0].item() == pytest.approx(T / math.sqrt(D))
    torch.testing.assert_close(out.norm(dim=-1), torch.full((3, 9), T), rtol=1e-4, atol=1e-4)  # each token, not a mean


def test_rms_gwc_projector_gradient_is_sqrt_d_over_T_times_the_plain_one():
    plain = build_alignment(get_arm("rms_textnorm"), D, T, 1e-6, 1e-5, "auto")
    gwc = build_alignment(get_arm("rms_textnorm_gwc"), D, T, 1e-6, 1e-5, "auto")
    upstream = torch.randn(3, 9, D)
    grads = []
    for layer in (plain, gwc):
        x = _tokens()
        (layer(x) * upstream).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0] * math.sqrt(D) / T, rtol=1e-5, atol=1e-6)
    # the gain's own gradient is plain RMSNorm's in both
    torch.testing.assert_close(gwc.weight.grad, plain.weight.grad)


def test_rms_gwc_is_exact_for_any_gain():
    layer = GlobalWeightCompensatedLayerNorm(D, init_gain=0.3, compensate=True, rms=True)
    with torch.no_grad():  # of both signs, so mean|g| is not mean(g)
        layer.weight.mul_((torch.rand(D) + 0.5) * torch.where(torch.arange(D) % 3 == 0, -1.0, 1.0))
    x, upstream = _tokens(), torch.randn(3, 9, D)
    (layer(x) * upstream).sum().backward()
    w = layer.weight.detach().clone().requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    (F.rms_norm(x_ref, (D,), w, layer.eps) * upstream).sum().backward()
    s = layer.weight.detach().abs().mean().item()
    torch.testing.assert_close(x.grad, x_ref.grad / s)
    torch.testing.assert_close(layer.weight.grad, w.grad)


def test_scale_to_t_puts_every_token_at_T_with_no_parameters():
    layer = build_alignment(get_arm("scale_to_t"), D, T, 1e-6, 1e-5, "auto")
    x = _tokens()
    out = layer(x)
    torch.testing.assert_close(out.norm(dim=-1), torch.full((3, 9), T))
    torch.testing.assert_close(F.normalize(out, dim=-1), F.normalize(x, dim=-1))  # direction kept
    assert not list(layer.parameters()) and not list(layer.buffers())
    out.sum().backward()  # the gradient reaches the projector through the rescaling
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_scale_fixed_multiplies_by_a_frozen_c_and_scale_learned_learns_s():
    fixed = build_alignment(get_arm("scale_fixed"), D, T, 1e-6, 1e-5, 0.25)
    learned = build_alignment(get_arm("scale_learned"), D, T, 1e-6, 1e-5, 0.25)
    x = _tokens()
    torch.testing.assert_close(fixed(x), 0.25 * x)
    assert not list(fixed.parameters()) and "scale" in fixed.state_dict()  # a buffer: saved, never trained
    torch.testing.assert_close(learned(x), 0.25 * x)
    (learned(x) * x.detach()).sum().backward()
    assert learned.scale.grad.item() == pytest.approx(float((x.detach() ** 2).sum()), rel=1e-5)  # d(s x . x)/ds
    assert build_alignment(get_arm("scale_fixed"), D, T, 1e-6, 1e-5, "auto").scale.item() == 1.0  # until calibrated


def test_scale_value_must_be_auto_or_positive(tmp_path):
    base = tmp_path / "c.yaml"
    base.write_text("model: {vision_tower: v, llm: l, norm_alignment: scale_fixed}\n"
                    "data: {mixture: [{path: d.json}]}\ntrain: {output_dir: out}\n")
    for bad in ("-1", "0", "big"):
        with pytest.raises(ConfigError, match="model.scale_value"):
            load_config(base, [f"model.scale_value={bad}"], check_paths=False)
    assert load_config(base, ["model.scale_value=0.5"], check_paths=False).model.scale_value == 0.5


@pytest.mark.parametrize("arm", ["rms_textnorm_gwc", "scale_to_t", "scale_fixed", "scale_learned"])
def test_new_arms_build_save_and_load_through_the_real_classes(tiny_dir, tmp_path, arm):
    bundle = build_model(ModelSpec(str(tiny_dir / "siglip"), str(tiny_dir / "llama"), norm_alignment=arm,
                                   scale_value=0.5 if arm.startswith("scale_f") else "auto"))
    layer = bundle.model.norm_layer
    assert isinstance(layer, VisualScale if arm.startswith("scale") else GlobalWeightCompensatedLayerNorm)
    with torch.no_grad():  # values no initialisation gives: the load must read them, not make them again
        for value in layer.state_dict().values():
            value.copy_(torch.rand_like(value) + 0.5)
    bundle.save(tmp_path / "m")
    loaded = load_bundle(tmp_path / "m").model
    assert {k: v for k, v in loaded.norm_layer.state_dict().items()}.keys() == layer.state_dict().keys()
    for key, value in layer.state_dict().items():
        torch.testing.assert_close(loaded.norm_layer.state_dict()[key], value)
    pixels = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(loaded.model.get_image_features(pixel_values=pixels).pooler_output[0],
                               bundle.model.model.get_image_features(pixel_values=pixels).pooler_output[0])
    if arm == "scale_to_t":
        feats = bundle.model.model.get_image_features(pixel_values=pixels).pooler_output[0]
        torch.testing.assert_close(feats.norm(dim=-1), torch.full(feats.shape[:-1], bundle.model.config.text_norm))


def test_scale_fixed_auto_is_calibrated_at_stage_1_stored_and_carried_into_stage_2(tmp_path, tiny_dir, capsys):
    """c = T / mean norm of the projected visual tokens of the first training images, printed,
    saved with stage 1's projector and model, and what stage 2 starts from (not recalibrated)."""
    from tinydata import write_dataset

    from llava_norm.train.run import CALIBRATION_IMAGES, run_training

    data, images = write_dataset(tmp_path / "data", n=20)
    config = tmp_path / "c.yaml"
    config.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: scale_fixed}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], num_workers: 0, max_length: 256}}
train: {{stage: 1, output_dir: {tmp_path}/s1, max_steps: 2, per_device_batch_size: 2, save_steps: 100}}
""")
    stage1 = load_config(config)
    run_training(stage1)
    printed = capsys.readouterr().out
    c = load_file(str(tmp_path / "s1/projector.safetensors"))["model.multi_modal_projector.norm.scale"].item()
    assert f"c = T / mean norm of the projected visual tokens of {CALIBRATION_IMAGES} training images = {c:.6g}" \
        in printed
    # the same c, computed independently from the built model and the first images
    bundle = build_model(ModelSpec(str(tiny_dir / "siglip"), str(tiny_dir / "llama"), norm_alignment="scale_fixed",
                                   seed=stage1.train.seed))
    from llava_norm.data.collate import collate
    from llava_norm.data.conversation import conversation_tokenizer
    from llava_norm.data.dataset import SupervisedDataset

    encoder = conversation_tokenizer(bundle, "plain", {})
    dataset = SupervisedDataset(stage1.data.mixture, encoder, bundle.image_processor, 256, "resize", "skip", "tokens")
    pixels = collate([dataset[i] for i in range(CALIBRATION_IMAGES)], 0, "right")["pixel_values"]
    tokens = bundle.model.model.get_image_features(pixel_values=pixels).pooler_output
    expected = bundle.model.config.text_norm / torch.cat([t.reshape(-1, t.shape[-1]) for t in tokens]
                                                          ).norm(dim=-1).mean().item()
    assert c == pytest.approx(expected, rel=1e-4) and c != 1.0
    assert json.loads((tmp_path / "s1/model/config.json").read_text())["norm_alignment"] == "scale_fixed"
    assert load_bundle(tmp_path / "s1/model").model.norm_layer.scale.item() == pytest.approx(c)

    config.write_text(config.read_text().replace("stage: 1", "stage: 2").replace("/s1", "/s2")
                      .replace("norm_alignment: scale_fixed", f"norm_alignment: scale_fixed, pretrained_projector: "
                               f"{tmp_path}/s1/projector.safetensors"))
    run_training(load_config(config))
    assert "scale_value auto" not in capsys.readouterr().out
    assert load_bundle(tmp_path / "s2/model").model.norm_layer.scale.item() == pytest.approx(c)  # frozen, carried


@pytest.mark.parametrize("arm", [a for a in NORM_ARMS if a != "none"])
def test_every_arm_trains_and_logs_its_layer(tmp_path, tiny_dir, arm):
    """A real stage-1 run of each arm with the layer's statistics logged every step (as the tiny
    configs do): the logging must cope with whatever parameters the arm has (scale_to_t: none)."""
    from tinydata import write_dataset

    from llava_norm.train.run import run_training

    data, images = write_dataset(tmp_path / "data", n=8)
    config = tmp_path / "c.yaml"
    config.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: {arm}}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], num_workers: 0, max_length: 256}}
train: {{stage: 1, output_dir: {tmp_path}/s1, max_steps: 2, per_device_batch_size: 2, save_steps: 100,
         logging_steps: 1, norm_stats_steps: 1}}
""")
    run_training(load_config(config))
    logged = json.loads((tmp_path / "s1/train_summary.json").read_text())["log_history"]
    keys = {k for entry in logged for k in entry if k.startswith("norm/")}
    expected = {"layernorm": {"norm/gain_l2", "norm/gain_abs_mean", "norm/gain_abs_std", "norm/bias_abs_mean"},
                "scale_to_t": set(), "scale_fixed": {"norm/scale"}, "scale_learned": {"norm/scale"}}
    assert keys == expected.get(NORM_ARMS[arm].layer, expected["layernorm"])
