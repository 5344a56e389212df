"""The norm-alignment layer: forward equals LayerNorm, GWC rescales only the input gradient, T."""

import math

import pytest
import torch
import torch.nn.functional as F

from llava_norm import GlobalWeightCompensatedLayerNorm, text_embedding_norm
from llava_norm.model.norm_align import text_norm_gain


def _layer(d=32, gain=0.05, compensate=True, clamp=1e-6):
    torch.manual_seed(0)
    layer = GlobalWeightCompensatedLayerNorm(d, init_gain=gain, compensate=compensate, clamp=clamp)
    with torch.no_grad():  # a non-uniform gain, so mean|g| is not just the init value, and of both
        # signs (as training can leave it), so mean|g| is not mean(g) either
        layer.weight.mul_((torch.rand(d) + 0.5) * torch.where(torch.arange(d) % 3 == 0, -1.0, 1.0))
        layer.bias.normal_()
    return layer


def test_forward_equals_functional_layer_norm():
    layer = _layer()
    x = torch.randn(4, 7, 32) * 30
    expected = F.layer_norm(x, (32,), layer.weight, layer.bias, layer.eps)
    torch.testing.assert_close(layer(x), expected)
    layer.eval()
    torch.testing.assert_close(layer(x), expected)


@pytest.mark.parametrize("clamp", [1e-6, 0.5])
def test_gwc_backward_scales_input_grad_only(clamp):
    layer = _layer(clamp=clamp)
    x = (torch.randn(3, 5, 32) * 10).requires_grad_()
    upstream = torch.randn(3, 5, 32)
    (layer(x) * upstream).sum().backward()

    w = layer.weight.detach().clone().requires_grad_()
    b = layer.bias.detach().clone().requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    (F.layer_norm(x_ref, (32,), w, b, layer.eps) * upstream).sum().backward()

    scale = max(layer.weight.detach().abs().mean().item(), clamp)
    torch.testing.assert_close(x.grad, x_ref.grad / scale)
    torch.testing.assert_close(layer.weight.grad, w.grad)
    torch.testing.assert_close(layer.bias.grad, b.grad)


def test_gain_statistics_are_table_5s_columns_of_the_gains_magnitudes():
    layer = _layer()
    g, b = layer.weight.detach(), layer.bias.detach()
    assert (g < 0).any() and (g > 0).any()
    stats = layer.gain_statistics()
    expected = {"gain_l2": g.norm(), "gain_abs_mean": g.abs().mean(), "gain_abs_std": g.abs().std(),
                "bias_abs_mean": b.abs().mean()}
    assert stats == pytest.approx({k: float(v) for k, v in expected.items()}, rel=1e-6)


def test_no_compensation_without_flag_or_in_eval():
    for compensate, train in ((False, True), (True, False)):
        layer = _layer(compensate=compensate).train(train)
        x = torch.randn(2, 32, requires_grad=True)
        layer(x).sum().backward()
        x_ref = x.detach().clone().requires_grad_()
        F.layer_norm(x_ref, (32,), layer.weight.detach(), layer.bias.detach(), layer.eps).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)


def test_text_norm_init_output_norm_is_T():
    d = 256
    embeddings = torch.randn(1000, d) * 0.07
    embeddings[900:] = 0  # zero padding rows, as in Qwen2.5
    T = text_embedding_norm(embeddings)
    assert T == pytest.approx(embeddings[:900].norm(dim=-1).mean().item(), rel=1e-6)
    assert T > embeddings.norm(dim=-1).mean().item() * 1.05  # zero rows would have dragged it down
    layer = GlobalWeightCompensatedLayerNorm(d, init_gain=text_norm_gain(T, d))
    x = torch.randn(64, 100, d) * 50 + 3  # high-norm "visual" tokens
    out_norm = layer(x).norm(dim=-1).mean().item()
    assert out_norm == pytest.approx(T, rel=0.05)
    assert layer.weight[0].item() == pytest.approx(T / math.sqrt(d))


def test_text_norm_rejects_all_zero_embeddings():
    with pytest.raises(ValueError, match="no non-zero rows"):
        text_embedding_norm(torch.zeros(4, 8))
