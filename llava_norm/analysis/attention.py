"""Text-to-image attention maps (App. G): where a phrase of the prompt looks in the image.

Owns locating a phrase's tokens in the encoded prompt (character offsets of the user turn,
which the conversation tokenizer tokenises on its own), reading eager attention weights of the
chosen layers/heads, averaging them over the phrase's query tokens, and laying the attention to
the image tokens out on the patch grid. The prompt is the one evaluation would build: the shared
prompt path with the model's training-run settings. Models load with ``attn_implementation="eager"``:
SDPA and flash attention never materialise the weights.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import torch
from PIL import Image
from tqdm import tqdm

from llava_norm.analysis.common import (Labeled, analysis_device, labeled_inputs, load_analysis_bundle,
                                        prompt_settings, write_result)
from llava_norm.analysis.plots import attention_figure
from llava_norm.data.images import open_image
from llava_norm.data.prompts import IMAGE_PREFIX, Prompt, PromptEncoder, PromptSettings


def _find(sequence: list[int], part: list[int]) -> int:
    for start in range(len(sequence) - len(part) + 1):
        if sequence[start:start + len(part)] == part:
            return start
    raise ValueError("the user turn's tokens were not found in the encoded prompt (the 'plain' format drops "
                     "the user's text; attention maps need prompt_format 'chat')")


def phrase_positions(bundle, encoder, prompt_text: str, phrase: str, input_ids: list[int]) -> list[int]:
    """Positions in ``input_ids`` of the tokens that overlap ``phrase`` inside the user turn."""
    char_start = prompt_text.find(phrase)
    if not phrase or char_start < 0:
        raise ValueError(f"phrase {phrase!r} is not a substring of the prompt {prompt_text!r}")
    content = IMAGE_PREFIX + prompt_text  # the user turn as Prompt.messages() writes it
    enc = bundle.tokenizer(content, add_special_tokens=False, return_offsets_mapping=True)
    lo, hi = len(IMAGE_PREFIX) + char_start, len(IMAGE_PREFIX) + char_start + len(phrase)
    image_id, n = encoder.image_token_id, encoder.tokens_per_image
    expanded, where = [], []
    for token, (s, e) in zip(enc["input_ids"], enc["offset_mapping"]):
        if e > lo and s < hi:
            where.append(len(expanded))
        expanded.extend([token] * n if token == image_id else [token])
    offset = _find(input_ids, expanded)
    return [offset + i for i in where]


@torch.no_grad()
def attention_map(bundle, image: Image.Image, prompt_text: str, phrase: str, layers: list[int] | None = None,
                  heads: list[int] | None = None, settings: PromptSettings | None = None) -> dict:
    """Attention from the phrase's tokens to each image token, averaged over queries, heads and layers;
    ``settings``: the model's training-run prompt settings (None: the training defaults)."""
    model = bundle.model.eval()
    if model.config._attn_implementation != "eager":
        raise ValueError("attention maps need a model loaded with attn_implementation='eager'")
    encoder = PromptEncoder.for_bundle(bundle, settings)
    example = encoder.reading_example(Prompt(prompt_text, image))
    queries = phrase_positions(bundle, encoder.tokenizer, prompt_text, phrase, example.input_ids)
    device = next(model.parameters()).device
    ids = torch.tensor([example.input_ids], device=device)
    out = model(input_ids=ids, pixel_values=example.pixel_values.to(device, model.dtype), output_attentions=True,
                use_cache=False)
    n_layers = len(out.attentions)
    layers = list(range(n_layers)) if layers is None else [l % n_layers for l in layers]
    n_heads = out.attentions[0].shape[1]
    heads = list(range(n_heads)) if heads is None else heads
    image_pos = (ids[0] == model.config.image_token_id).nonzero().flatten()
    stacked = torch.stack([out.attentions[l][0].float() for l in layers])  # (L, H, S, S)
    to_image = stacked[:, heads][:, :, queries][..., image_pos]  # (L, H, Q, N)
    per_token = to_image.mean(dim=(0, 1, 2))
    side = math.isqrt(per_token.numel())
    if side * side != per_token.numel():
        raise ValueError(f"{per_token.numel()} image tokens do not form a square patch grid")
    return {"grid": per_token.reshape(side, side).cpu().tolist(), "layers": layers, "heads": heads,
            "query_tokens": [bundle.tokenizer.decode([example.input_ids[q]]) for q in queries],
            "attention_mass_on_image": float(to_image.sum(-1).mean())}


def attention_maps(models: list[Labeled], image_path: str | Path, prompt_text: str, phrase: str,
                   layers: list[int] | None = None, heads: list[int] | None = None, out_dir: str | Path | None = None,
                   prompt_format: str | None = None, device: str | None = None) -> dict:
    """Heatmaps of several checkpoints side by side for one image, prompt and phrase, each prompted
    as its training run prompts (``prompt_format`` overrides the format)."""
    image = open_image(image_path)
    maps = []
    for item in tqdm(models, desc="attention", unit="model"):
        bundle = load_analysis_bundle(item.path, analysis_device(device), attn_implementation="eager")
        settings = prompt_settings(item.path, prompt_format)
        maps.append({"label": item.label, "path": str(item.path), "prompt": asdict(settings),
                     **attention_map(bundle, image, prompt_text, phrase, layers, heads, settings)})
        del bundle
    result = {"analysis": "attention", "image": str(image_path), "prompt": prompt_text, "phrase": phrase,
              "maps": maps}
    return write_result(result, out_dir, attention_figure(image, maps, phrase),
                        {"image": image_path, **labeled_inputs(models)})
