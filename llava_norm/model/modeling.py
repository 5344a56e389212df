"""LLaVA with a norm-alignment layer, as thin subclasses of transformers' Llava classes.

Owns ``LlavaNormConfig`` (Llava's config plus the arm, T and projector type),
``LlavaNormModel`` (Llava's model with ``NormAlignedProjector``) and
``LlavaNormForConditionalGeneration``. Image-token scattering, generation and KV caching
are transformers' own; this file only adds the projector swap, weight init for the norm
layer, a per-sample image-token check, no KV cache for packed batches, the fused-loss switch
(``loss_kind``, computed by ``model.loss``) and Auto-class registration.
"""


import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForImageTextToText,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaModel,
)
from transformers import initialization as hf_init
from transformers.models.llava.modeling_llava import LlavaCausalLMOutputWithPast, LlavaPreTrainedModel

from llava_norm.model.loss import causal_lm_loss, softmax_backend
from llava_norm.model.norm_align import GlobalWeightCompensatedLayerNorm, VisualScale
from llava_norm.model.projector import NormAlignedProjector
from llava_norm.saved_model import MODEL_TYPE


class LlavaNormConfig(LlavaConfig):
    """Llava config plus the norm-alignment arm.

    norm_alignment: a name in ``config_schema.NORM_ARMS``.
    text_norm: T, measured from the LLM input embeddings when the model is first built.
    scale_value: the scaling arms' factor, a number or "auto" (calibrated at stage 1).
    """

    model_type = MODEL_TYPE

    norm_alignment: str = "none"
    text_norm: float | None = None
    gwc_clamp: float = 1e-6
    norm_eps: float = 1e-5
    projector_type: str = "mlp2x_gelu"
    scale_value: float | str = "auto"


def blank_image(tower) -> torch.Tensor:
    """One all-zero image at the tower's resolution, dtype and device."""
    cfg = tower.config
    return torch.zeros(1, cfg.num_channels, cfg.image_size, cfg.image_size, dtype=tower.dtype, device=tower.device)


def check_image_tokens(input_ids: torch.Tensor, image_token_id: int, n_images: int, tokens_per_image: int) -> None:
    """Raise a ValueError naming the batch row whose image-token count cannot match the features."""
    counts = (input_ids == image_token_id).sum(dim=-1).tolist()
    for row, count in enumerate(counts):
        if count % tokens_per_image:
            raise ValueError(
                f"batch sample {row}: {count} image tokens is not a multiple of {tokens_per_image} "
                "features per image"
            )
    if sum(counts) != n_images * tokens_per_image:
        expected = n_images * tokens_per_image
        rows = [row for row, count in enumerate(counts) if count]
        raise ValueError(
            f"batch has {sum(counts)} image tokens in samples {rows} but {n_images} images give {expected} "
            "features; every image needs exactly one <image> placeholder"
        )


class LlavaNormPreTrainedModel(LlavaPreTrainedModel):
    config_class = LlavaNormConfig

    def _init_weights(self, module):
        # transformers' default init sets anything named "*LayerNorm*" to gain 1, which
        # would silently turn the text-norm arms into the default-init arm.
        if isinstance(module, GlobalWeightCompensatedLayerNorm):
            hf_init.constant_(module.weight, module.init_gain)
            if module.bias is not None:
                hf_init.zeros_(module.bias)
        elif isinstance(module, VisualScale):
            if module.mode != "to_t":
                hf_init.constant_(module.scale, module.init_value)
        else:
            super()._init_weights(module)


class LlavaNormModel(LlavaNormPreTrainedModel, LlavaModel):
    def __init__(self, config: LlavaNormConfig):
        LlavaNormPreTrainedModel.__init__(self, config)
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.multi_modal_projector = NormAlignedProjector(config)
        self.language_model = AutoModel.from_config(config.text_config)
        self.post_init()

    def forward(self, input_ids=None, pixel_values=None, **kwargs):
        if kwargs.get("position_ids") is not None and kwargs.get("attention_mask") is None \
                and kwargs.get("past_key_values") is None:
            # A packed batch (data.packing): transformers isolates the samples of a row only when
            # it builds no KV cache, which it otherwise does whenever the config's use_cache is on.
            kwargs["use_cache"] = False
        if input_ids is not None and pixel_values is not None and kwargs.get("inputs_embeds") is None:
            check_image_tokens(input_ids, self.config.image_token_id, pixel_values.shape[0], self.config.image_seq_length)
        if pixel_values is None and input_ids is not None and self.training and torch.is_grad_enabled():
            # A text-only batch must still run the vision tower and projector: under DeepSpeed every
            # rank has to reduce (ZeRO-2) and gather (ZeRO-3) the same parameters in every step.
            kwargs["inputs_embeds"] = self.get_input_embeddings()(input_ids) + self._zero_image_term()
            input_ids = None
        return super().forward(input_ids=input_ids, pixel_values=pixel_values, **kwargs)

    def _zero_image_term(self) -> torch.Tensor:
        features = self.get_image_features(pixel_values=blank_image(self.vision_tower)).pooler_output[0]
        return features.sum() * 0.0


class LlavaNormForConditionalGeneration(LlavaNormPreTrainedModel, LlavaForConditionalGeneration):
    def __init__(self, config: LlavaNormConfig):
        LlavaNormPreTrainedModel.__init__(self, config)
        self.model = LlavaNormModel(config)
        self.lm_head = torch.nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, pixel_values=None, attention_mask=None, position_ids=None,
                past_key_values=None, inputs_embeds=None, vision_feature_layer=None,
                vision_feature_select_strategy=None, labels=None, logits_to_keep=0, image_sizes=None,
                mm_encoder_outputs=None, loss_kind: str = "plain", loss_kernel: str = "torch",
                loss_softmax: str = "auto", **kwargs):
        """``loss_kind="fused"`` (``train.loss``): the same loss from the hidden states, never
        materialising the logits (``model.loss``, by ``loss_kernel`` and ``loss_softmax``:
        ``train.fused_loss_kernel`` and ``train.fused_loss_softmax``);
        the output then carries no logits. Every input of the parent's forward is named here:
        generate() passes only what forward names (an unnamed ``logits_to_keep`` would make it
        compute the logits of the whole prompt)."""
        inputs = dict(input_ids=input_ids, pixel_values=pixel_values, attention_mask=attention_mask,
                      position_ids=position_ids, past_key_values=past_key_values, inputs_embeds=inputs_embeds,
                      vision_feature_layer=vision_feature_layer, image_sizes=image_sizes,
                      vision_feature_select_strategy=vision_feature_select_strategy,
                      mm_encoder_outputs=mm_encoder_outputs)
        if labels is None or loss_kind == "plain":
            return super().forward(**inputs, labels=labels, logits_to_keep=logits_to_keep, **kwargs)
        if loss_kind != "fused":
            raise ValueError(f"loss_kind must be 'plain' or 'fused', got {loss_kind!r}")
        num_items = kwargs.pop("num_items_in_batch", None)
        # lm_head.weight is read outside lm_head's forward; under ZeRO-3 DeepSpeed gathers a
        # parameter on such an access (its ZeROOrderedDict), tested in tests/test_resume.py.
        outputs = self.model(**inputs, **kwargs)
        loss = causal_lm_loss(outputs.last_hidden_state, self.lm_head.weight, labels, num_items, kernel=loss_kernel,
                              compile_backend=softmax_backend(loss_softmax))
        return LlavaCausalLMOutputWithPast(loss=loss, past_key_values=outputs.past_key_values,
                                           hidden_states=outputs.hidden_states, attentions=outputs.attentions,
                                           image_hidden_states=outputs.image_hidden_states)

    @property
    def norm_layer(self) -> GlobalWeightCompensatedLayerNorm | VisualScale | None:
        return self.model.multi_modal_projector.norm


AutoConfig.register(LlavaNormConfig.model_type, LlavaNormConfig, exist_ok=True)
AutoModel.register(LlavaNormConfig, LlavaNormModel, exist_ok=True)
AutoModelForImageTextToText.register(LlavaNormConfig, LlavaNormForConditionalGeneration, exist_ok=True)
