"""torch.compile of the backbones' repeated layers (``train.compile``).

Owns which modules are compiled and how: each decoder layer of the LLM and each encoder layer of
the vision tower, found as the backbone's own block class (transformers' ``_no_split_modules``,
the unit its sharding wraps) inside a ``ModuleList``, and compiled in place with
``nn.Module.compile``. In place, not ``torch.compile(model)``: parameter names, checkpoints,
DeepSpeed's and DDP's wrapping and activation checkpointing see the same modules as without it.
Layer by layer, not the whole model: the composite forward (image features scattered into the
token embeddings) breaks graphs, while the layers are where the elementwise kernels between the
GEMMs are (norms, activations, rotary), and one graph serves a whole stack.
"""

from __future__ import annotations

import torch
from torch import nn


def repeated_layers(model) -> list[nn.Module]:
    """The LLM's decoder layers, then the vision tower's encoder layers."""
    found = []
    for backbone in (model.model.language_model, model.model.vision_tower):
        base = backbone.get_base_model() if hasattr(backbone, "get_base_model") else backbone  # a peft wrapper
        blocks = set(getattr(base, "_no_split_modules", None) or ())
        layers = [child for module in base.modules() if isinstance(module, nn.ModuleList)
                  for child in module if type(child).__name__ in blocks]
        if not layers:
            raise ValueError(f"train.compile: {type(base).__name__} names no repeated layer class "
                             f"(transformers' _no_split_modules is {sorted(blocks)}); set train.compile=false")
        found += layers
    return found


def compile_layers(model, backend: str = "inductor") -> int:
    """Compiles each repeated layer in place; returns how many. The first step traces and
    compiles (tens of seconds on a GPU); later steps reuse the graphs."""
    layers = repeated_layers(model)
    # dynamo keeps compiled code per layer instance: without room for every layer of both
    # stacks it would run the rest eager, silently
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 4 * len(layers)))
    for layer in layers:
        layer.compile(backend=backend)
    return len(layers)
