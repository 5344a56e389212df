"""The norm-alignment layer (paper Sec. 5, App. D) and the text-norm target T.

Owns: ``GlobalWeightCompensatedLayerNorm`` (LayerNorm whose backward pass into its input is
rescaled by 1/max(mean|g|, clamp)) and ``text_embedding_norm`` (T). What each arm means is one
table, ``config_schema.NORM_ARMS``, which the config validates against and this module builds from.
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
    """LayerNorm over the last dim, y = g * x_hat + b, with Global Weight Compensation.

    With ``compensate=True`` and in training mode, the gradient flowing back through x_hat
    (into the projector and the vision tower) is divided by s = max(mean|g|, clamp). The
    gradients of ``weight`` (g) and ``bias`` (b) are those of plain LayerNorm. The forward
    pass is plain LayerNorm in every mode.
    """

    def __init__(
        self,
        hidden_size: int,
        init_gain: float = 1.0,
        compensate: bool = True,
        clamp: float = 1e-6,
        eps: float = 1e-5,
    ):
        super().__init__()
        if clamp <= 0:
            raise ValueError(f"GWC clamp must be positive, got {clamp}")
        self.hidden_size = hidden_size
        self.init_gain = float(init_gain)
        self.compensate = compensate
        self.clamp = float(clamp)
        self.eps = eps
        self.weight = nn.Parameter(torch.full((hidden_size,), self.init_gain))
        self.bias = nn.Parameter(torch.zeros(hidden_size))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(self.init_gain)
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
        return F.layer_norm(x, (self.hidden_size,), self.weight, self.bias, self.eps)

    @torch.no_grad()
    def gain_statistics(self) -> dict[str, float]:
        """The paper's Table 5 columns: ||g||, mean|g|, std|g|, mean|b|."""
        g = self.weight.detach().float()
        return {
            "gain_l2": float(g.norm()),
            "gain_abs_mean": float(g.abs().mean()),
            "gain_abs_std": float(g.abs().std()),
            "bias_abs_mean": float(self.bias.detach().float().abs().mean()),
        }

    def extra_repr(self) -> str:
        return (
            f"{self.hidden_size}, init_gain={self.init_gain:.4g}, compensate={self.compensate}, "
            f"clamp={self.clamp:g}, eps={self.eps:g}"
        )


def text_norm_gain(text_norm: float, hidden_size: int) -> float:
    """Per-entry gain g = T / sqrt(d), so that ||g * x_hat|| ~ T (x_hat has norm ~ sqrt(d))."""
    return text_norm / math.sqrt(hidden_size)
