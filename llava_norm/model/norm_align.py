"""The norm-alignment layers (paper Sec. 5, App. D, and the arms reviewers asked for) and T.

Owns: ``GlobalWeightCompensatedLayerNorm`` (LayerNorm or RMSNorm whose backward pass into its
input is rescaled by 1/max(mean|g|, clamp)), ``VisualScale`` (the scaling arms: to norm T, by a
frozen factor, by one learned factor), ``build_alignment`` (the layer an arm builds) and
``text_embedding_norm`` (T). What each arm means is one table, ``config_schema.NORM_ARMS``,
which the config validates against and ``build_alignment`` builds from.
"""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F
from torch import nn

from llava_norm.config_schema import NORM_ARMS, NormArm


def get_arm(name: str) -> NormArm:
    try:
        return NORM_ARMS[name]
    except KeyError:
        raise ValueError(f"unknown norm_alignment arm {name!r}; choose one of {sorted(NORM_ARMS)}") from None


@torch.no_grad()
def text_embedding_norm(embedding_weight: torch.Tensor) -> float:
    """T = mean L2 norm over the rows of the input-embedding matrix that are not all zero.

    Qwen2.5 pads its vocabulary with zero rows; counting them would drag T down.
    """
    norms = embedding_weight.detach().float().norm(dim=-1)
    nonzero = norms > 0
    if not bool(nonzero.any()):
        raise ValueError("embedding matrix has no non-zero rows; cannot compute the text norm T")
    return float(norms[nonzero].mean())


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; multiplies the incoming gradient by ``factor`` on the way back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        ctx.factor = factor  # a 0-dim tensor: reading it as a Python float would sync a GPU every step
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


class GlobalWeightCompensatedLayerNorm(nn.Module):
    """LayerNorm over the last dim, y = g * x_hat + b, with Global Weight Compensation; with
    ``rms=True``, RMSNorm instead (y = g * x / rms(x), no bias).

    With ``compensate=True`` and in training mode, the gradient flowing back through x_hat
    (into the projector and the vision tower) is divided by s = max(mean|g|, clamp). The
    gradients of ``weight`` (g) and ``bias`` (b) are those of the plain norm. The forward pass
    is the plain norm in every mode.
    """

    def __init__(
        self,
        hidden_size: int,
        init_gain: float = 1.0,
        compensate: bool = True,
        clamp: float = 1e-6,
        eps: float = 1e-5,
        rms: bool = False,
    ):
        super().__init__()
        if clamp <= 0:
            raise ValueError(f"GWC clamp must be positive, got {clamp}")
        self.hidden_size = hidden_size
        self.init_gain = float(init_gain)
        self.compensate = compensate
        self.clamp = float(clamp)
        self.eps = eps
        self.rms = rms
        self.weight = nn.Parameter(torch.full((hidden_size,), self.init_gain))
        self.bias = None if rms else nn.Parameter(torch.zeros(hidden_size))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(self.init_gain)
            if self.bias is not None:
                self.bias.zero_()

    def compensation_scale(self) -> float:
        """s = max(mean|g|, clamp), read from the current gain (for logs; forward uses the tensor form)."""
        return float(self._scale())

    def _scale(self) -> torch.Tensor:
        # Computed in forward, where ZeRO-3 has gathered the gain; a detached 0-dim tensor outlives the gather.
        return self.weight.detach().abs().float().mean().clamp(min=self.clamp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.compensate and self.training and torch.is_grad_enabled():
            # grad(x) = J_LN^T grad(x_hat) is linear in grad(x_hat), so dividing the gradient that leaves
            # the LayerNorm by s is exactly dividing grad(x_hat) by s; g and b get plain LayerNorm
            # gradients (they only see grad(y) and x_hat). This keeps the LayerNorm one fused kernel,
            # instead of layer_norm + mul + add and their backward passes (bench/gwc_overhead.py).
            x = _ScaleGradient.apply(x, 1.0 / self._scale())
        if self.rms:
            return F.rms_norm(x, (self.hidden_size,), self.weight, self.eps)
        return F.layer_norm(x, (self.hidden_size,), self.weight, self.bias, self.eps)

    @torch.no_grad()
    def gain_statistics(self) -> dict[str, float]:
        """The paper's Table 5 columns: ||g||, mean|g|, std|g|, mean|b|."""
        g = self.weight.detach().float()
        return {
            "gain_l2": float(g.norm()),
            "gain_abs_mean": float(g.abs().mean()),
            "gain_abs_std": float(g.abs().std()),
            "bias_abs_mean": 0.0 if self.bias is None else float(self.bias.detach().float().abs().mean()),
        }

    def extra_repr(self) -> str:
        return (
            f"{self.hidden_size}, init_gain={self.init_gain:.4g}, compensate={self.compensate}, "
            f"clamp={self.clamp:g}, eps={self.eps:g}{', rms' if self.rms else ''}"
        )


def text_norm_gain(text_norm: float, hidden_size: int) -> float:
    """Per-entry gain g = T / sqrt(d), so that ||g * x_hat|| ~ T (x_hat has norm ~ sqrt(d))."""
    return text_norm / math.sqrt(hidden_size)


class VisualScale(nn.Module):
    """The scaling arms: visual tokens rescaled, not normalised (is it the norm layer, or any
    rescaling, that matters?).

    ``mode="to_t"``: y = T x / ||x||, every token at norm T, no parameters.
    ``mode="fixed"``: y = c x with c a frozen buffer (saved with the checkpoint).
    ``mode="learned"``: y = s x with s one learned scalar, initialised to ``value``.
    """

    def __init__(self, mode: str, text_norm: float | None, value: float = 1.0, eps: float = 1e-12):
        super().__init__()
        if mode not in ("to_t", "fixed", "learned"):
            raise ValueError(f"VisualScale mode must be to_t, fixed or learned, got {mode!r}")
        if mode == "to_t" and text_norm is None:
            raise ValueError("VisualScale(to_t) needs the text norm T")
        self.mode, self.text_norm, self.eps, self.init_value = mode, text_norm, eps, float(value)
        # Shape (1,), not a 0-dim tensor: DeepSpeed's start-up broadcast views every parameter as
        # bytes, which a 0-dim tensor cannot be.
        if mode == "learned":
            self.scale = nn.Parameter(torch.full((1,), self.init_value))
        elif mode == "fixed":
            self.register_buffer("scale", torch.full((1,), self.init_value))

    def reset_parameters(self) -> None:
        if self.mode != "to_t":
            with torch.no_grad():
                self.scale.fill_(self.init_value)

    def set_value(self, value: float) -> None:
        """Set c (or s's starting value): what stage-1 calibration measured."""
        self.init_value = float(value)
        self.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "to_t":
            return x * (self.text_norm / x.norm(dim=-1, keepdim=True).clamp(min=self.eps))
        return x * self.scale.to(x.dtype)

    @torch.no_grad()
    def gain_statistics(self) -> dict[str, float]:
        """What training logs: the factor (none for to_t)."""
        return {} if self.mode == "to_t" else {"scale": float(self.scale)}

    def extra_repr(self) -> str:
        value = "" if self.mode == "to_t" else f", init={self.init_value:.4g}"
        return f"mode={self.mode}, T={self.text_norm}{value}"


def build_alignment(arm: NormArm, hidden_size: int, text_norm: float | None, clamp: float, eps: float,
                    scale_value) -> nn.Module | None:
    """The layer after the projector for one arm (None for ``none``)."""
    if arm.layer == "none":
        return None
    if arm.normalises:
        if arm.text_norm_init and text_norm is None:
            raise ValueError(f"norm_alignment={arm.name!r} needs config.text_norm (T); build the model with "
                             "llava_norm.model.builder.build_model, which measures it from the LLM embeddings")
        gain = text_norm_gain(text_norm, hidden_size) if arm.text_norm_init else 1.0
        return GlobalWeightCompensatedLayerNorm(hidden_size, init_gain=gain, compensate=arm.gwc, clamp=clamp, eps=eps,
                                                rms=arm.layer == "rmsnorm")
    # "auto" starts at 1 until stage 1 calibrates it (train.calibration); a loaded checkpoint
    # brings its calibrated value with it.
    value = 1.0 if scale_value in (None, "auto") else float(scale_value)
    return VisualScale(arm.layer.removeprefix("scale_"), text_norm, value)
