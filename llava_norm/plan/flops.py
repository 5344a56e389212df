"""Model FLOPs of a training step, from the backbones' configs alone.

Owns the FLOP model behind every MFU figure and time estimate in the repo (``bench/gpu_step.py``,
``bench/recipe_time.py``, ``llava-norm plan``). PaLM's convention: 2 FLOPs per matmul weight
and token forward, 2 more for the activation gradient, 2 more for the weight gradient;
attention adds 4 x layers x width x sequence per token forward and twice that backward.
Recomputation under activation checkpointing is not counted (it is not model work).

What runs backward depends on what trains: the LLM always passes gradients back (the projector
before it trains in both stages); a frozen LLM skips only its weight gradients. A frozen
vision tower runs forward only. The embedding lookup is no matmul; lm_head is one.
"""

from __future__ import annotations

from dataclasses import dataclass


def vision_matmul_params(vision, vision_feature_layer: int = -2) -> tuple[int, int]:
    """(layers that feed the projector, their matmul weights + the patch embedding)."""
    layers = vision.num_hidden_layers + 1 + vision_feature_layer if vision_feature_layer < 0 else vision_feature_layer
    per_layer = 4 * vision.hidden_size ** 2 + 2 * vision.hidden_size * vision.intermediate_size
    return layers, layers * per_layer + vision.num_channels * vision.patch_size ** 2 * vision.hidden_size


def head_dim(text) -> int:
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def llm_matmul_params(text) -> int:
    """q, k, v, o, the gated MLP of every layer, and lm_head (the embedding lookup is no matmul)."""
    d, heads, kv = text.hidden_size, text.num_attention_heads, text.num_key_value_heads
    per_layer = 2 * d * heads * head_dim(text) + 2 * d * kv * head_dim(text) + 3 * d * text.intermediate_size
    return text.num_hidden_layers * per_layer + d * text.vocab_size


def patch_tokens(vision) -> int:
    return (vision.image_size // vision.patch_size) ** 2


@dataclass(frozen=True)
class StepFlops:
    vision: float
    projector: float
    llm: float

    @property
    def total(self) -> float:
        return self.vision + self.projector + self.llm


def train_flops(vision, text, seq: int, batch: int, vision_feature_layer: int = -2, images: int | None = None,
                llm_trained: bool = True, vision_trained: bool = True) -> StepFlops:
    """Model FLOPs of one forward + backward over ``batch`` sequences of ``seq`` tokens holding
    ``images`` images in all (default: one per sequence)."""
    images = batch if images is None else images
    v_layers, v_params = vision_matmul_params(vision, vision_feature_layer)
    v_tokens = patch_tokens(vision)
    v_matmul, v_attn = (6, 12) if vision_trained else (2, 4)
    vision_f = images * (v_matmul * v_params * v_tokens + v_attn * v_layers * vision.hidden_size * v_tokens ** 2)
    projector_f = images * 6 * v_tokens * (vision.hidden_size * text.hidden_size + text.hidden_size ** 2)
    attn_width = text.num_attention_heads * head_dim(text)
    llm_matmul = 6 if llm_trained else 4
    llm_f = batch * (llm_matmul * llm_matmul_params(text) * seq + 12 * text.num_hidden_layers * attn_width * seq ** 2)
    return StepFlops(vision_f, projector_f, llm_f)
