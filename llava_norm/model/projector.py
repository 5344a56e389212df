"""The vision-to-language projector, with the norm-alignment layer as its last sub-module.

Owns the projector's layout. Parameter names match transformers' ``LlavaMultiModalProjector``
(``linear_1``, ``act``, ``linear_2``) so arm ``none`` is weight-compatible with stock Llava.
The norm layer lives *inside* this module so that per-module learning rates, stage-1
freezing and stage-1 saving all catch it with the projector (ANCHORS pain point 4).
"""

from __future__ import annotations

from torch import nn
from transformers.activations import ACT2FN

from llava_norm.config_schema import PROJECTOR_TYPES
from llava_norm.model.norm_align import build_alignment, get_arm


class NormAlignedProjector(nn.Module):
    def __init__(self, config):
        super().__init__()
        vision_dim = config.vision_config.hidden_size
        if not isinstance(config.vision_feature_layer, int):
            vision_dim *= len(config.vision_feature_layer)
        text_dim = config.text_config.hidden_size
        bias = config.multimodal_projector_bias
        if config.projector_type not in PROJECTOR_TYPES:
            raise ValueError(f"projector_type must be one of {PROJECTOR_TYPES}, got {config.projector_type!r}")

        self.linear_1 = nn.Linear(vision_dim, text_dim, bias=bias)
        if config.projector_type == "mlp2x_gelu":
            self.act = ACT2FN[config.projector_hidden_act]
            self.linear_2 = nn.Linear(text_dim, text_dim, bias=bias)
        else:
            self.act = self.linear_2 = None

        self.norm = build_alignment(get_arm(config.norm_alignment), text_dim, config.text_norm, config.gwc_clamp,
                                    config.norm_eps, getattr(config, "scale_value", "auto"))

    def forward(self, image_features):
        hidden = self.linear_1(image_features)
        if self.linear_2 is not None:
            hidden = self.linear_2(self.act(hidden))
        if self.norm is not None:
            hidden = self.norm(hidden)
        return hidden
