"""Batches for the diagnostics and the masks that split their positions into image and text tokens.

Owns batching prompts (with or without an image) for a diagnostic, through the prompt path that
builds training samples and evaluation prompts (``data.prompts.PromptEncoder``: a diagnostic's
batch is the one evaluation would feed the model), and deriving, per position, whether it holds
an image feature, a text token, or padding. Text-only samples mixed into a batch contribute text
positions only; padding is neither.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from llava_norm.data.prompts import Prompt, PromptEncoder, PromptSettings


@dataclass
class TokenBatch:
    inputs: dict  # input_ids, attention_mask and (if any sample has an image) pixel_values
    image_mask: torch.Tensor  # (B, S) bool
    text_mask: torch.Tensor  # (B, S) bool


def token_masks(input_ids: torch.Tensor, attention_mask: torch.Tensor, image_token_id: int,
                exclude_token_ids: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(image_mask, text_mask): image placeholders; attended non-image tokens minus ``exclude_token_ids``."""
    attended = attention_mask.bool()
    image = (input_ids == image_token_id) & attended
    text = attended & ~image
    for token in exclude_token_ids:
        text &= input_ids != token
    return image, text


def interleave_prompts(images: list, prompts: list[str], n_text_only: int | None = None) -> list[Prompt]:
    """One prompt per image (prompts reused cyclically), with text-only prompts interleaved between them."""
    with_image = [Prompt(prompts[i % len(prompts)], image) for i, image in enumerate(images)]
    text_only = [Prompt(p) for p in prompts[: len(prompts) if n_text_only is None else n_text_only]]
    mixed: list[Prompt] = []
    for i in range(max(len(with_image), len(text_only))):
        mixed.extend(([with_image[i]] if i < len(with_image) else []) + ([text_only[i]] if i < len(text_only) else []))
    return mixed


def prompt_batches(bundle, prompts: list[Prompt], batch_size: int = 8, settings: PromptSettings | None = None,
                   exclude_bos: bool = True, device: torch.device | None = None) -> Iterator[TokenBatch]:
    """Left-padded batches of the prompts with their image/text masks, on the model's device and dtype.

    settings: the model's training-run prompt settings (``analysis.common.prompt_settings``);
    None: the training defaults, for fresh builds. exclude_bos: LLMs park huge activations on
    the first token (an attention sink); counting BOS as a text token would let one position
    dominate the per-layer text norms.
    """
    encoder = PromptEncoder.for_bundle(bundle, settings)
    tokenizer = bundle.tokenizer
    model = bundle.model
    device = device or next(model.parameters()).device
    excluded = (tokenizer.bos_token_id,) if exclude_bos and tokenizer.bos_token_id is not None else ()
    for start in range(0, len(prompts), batch_size):
        batch = encoder.prompt_batch(prompts[start:start + batch_size], reading=True)
        image, text = token_masks(batch["input_ids"], batch["attention_mask"], model.config.image_token_id, excluded)
        inputs = {k: v.to(device, model.dtype) if k == "pixel_values" else v.to(device) for k, v in batch.items()}
        yield TokenBatch(inputs, image.to(device), text.to(device))
