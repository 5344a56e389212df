"""Vision warm-up: SigLIP's sigmoid image-text contrastive pretraining of a tiny SigLIP.

Owns the image-caption pairs (the world's stage-1 captions, every 20th pair held out), their
preprocessing (the tower's own image processor; captions padded to the text tower's full
length without an attention mask and pooled at the last position, as SigLIP is trained),
the held-out loss and retrieval accuracy, and the per-layer norms of the visual tokens. The
loss is ``SiglipModel``'s own (``return_loss=True``), the pairwise sigmoid loss of Zhai et
al. 2023 (arXiv 2303.15343).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer, SiglipModel

from llava_norm_demo.synth.build import read_manifest
from llava_norm_demo.warmup.loop import LoopConfig, holdout_split, train_steps


@dataclass(frozen=True)
class Pairs:
    images: list[Path]
    captions: list[str]


def world_caption_pairs(world: str | Path) -> tuple[Pairs, Pairs]:
    """(train, held-out) image-caption pairs from the world's stage-1 caption file."""
    world = Path(world)
    corpus = read_manifest(world)["corpora"]["pretrain"]
    rows = json.loads((world / corpus["path"]).read_text())
    folder = world / corpus["image_folder"]
    pairs = [(folder / r["image"], next(t["value"] for t in r["conversations"] if t["from"] == "gpt")) for r in rows]
    return tuple(Pairs([p[0] for p in part], [p[1] for p in part]) for part in holdout_split(pairs))


def encode_pairs(pairs: Pairs, processor, tokenizer, text_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    images = []
    for path in pairs.images:
        with Image.open(path) as image:
            images.append(image.convert("RGB"))
    pixels = processor(images=images, return_tensors="pt").pixel_values
    ids = tokenizer(pairs.captions, padding="max_length", truncation=True, max_length=text_length,
                    return_tensors="pt").input_ids
    return pixels, ids


@torch.no_grad()
def heldout_stats(model: SiglipModel, pixels: torch.Tensor, ids: torch.Tensor, batch_size: int,
                  feature_layer: int) -> dict:
    """Sigmoid loss and image->caption top-1 accuracy within held-out batches of the training
    batch size (the loss depends on the batch size), plus visual-token norms per layer."""
    losses, hits, layer_norms, n_batches = [], 0, None, 0
    usable = len(pixels) // batch_size * batch_size
    for start in range(0, usable, batch_size):
        out = model(input_ids=ids[start:start + batch_size], pixel_values=pixels[start:start + batch_size],
                    return_loss=True, output_hidden_states=True)
        losses.append(float(out.loss))
        hits += int((out.logits_per_image.argmax(dim=1) == torch.arange(batch_size)).sum())
        hidden = out.vision_model_output.hidden_states
        norms = torch.stack([h.norm(dim=-1).mean() for h in hidden])
        layer_norms = norms if layer_norms is None else layer_norms + norms
        n_batches += 1
    if n_batches == 0:
        raise ValueError(f"{len(pixels)} held-out pairs cannot fill one batch of {batch_size}")
    per_layer = [round(float(x) / n_batches, 4) for x in layer_norms]
    return {"loss": sum(losses) / n_batches, "retrieval_top1": hits / usable,
            "visual_norm_per_layer": per_layer, "visual_norm_feature_layer": per_layer[feature_layer],
            "feature_layer": feature_layer}


def warm_siglip(source: str | Path, out_dir: str | Path, train: Pairs, heldout: Pairs, config: LoopConfig,
                feature_layer: int = -2) -> dict:
    """Contrastively pretrain the SigLIP dual encoder in ``source``; save it (HF format) to ``out_dir``.

    ``feature_layer`` is the hidden state LLaVA reads (``model.vision_feature_layer``), whose
    norm is reported before and after.
    """
    torch.manual_seed(config.seed)
    model = SiglipModel.from_pretrained(source, dtype=torch.float32)
    processor = AutoImageProcessor.from_pretrained(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:  # make_tiny's text tower pads with eos, like its config says
        tokenizer.pad_token_id = model.config.text_config.pad_token_id
    if model.logit_scale.item() == 0.0 and model.logit_bias.item() == 0.0:
        # Untrained: transformers zero-initialises both; SigLIP starts at t' = log 10, b = -10
        # so the B^2 - B negatives do not swamp the first steps.
        with torch.no_grad():
            model.logit_scale.fill_(math.log(10.0))
            model.logit_bias.fill_(-10.0)
    text_length = model.config.text_config.max_position_embeddings
    train_pixels, train_ids = encode_pairs(train, processor, tokenizer, text_length)
    held_pixels, held_ids = encode_pairs(heldout, processor, tokenizer, text_length)
    before = heldout_stats(model, held_pixels, held_ids, config.batch_size, feature_layer)
    start = time.perf_counter()

    def loss_of(indices: torch.Tensor) -> torch.Tensor:
        return model(input_ids=train_ids[indices], pixel_values=train_pixels[indices], return_loss=True).loss

    losses = train_steps(model, len(train_pixels), loss_of, config, desc=f"vision warm-up {Path(source).name}")
    seconds = time.perf_counter() - start
    after = heldout_stats(model, held_pixels, held_ids, config.batch_size, feature_layer)
    model.save_pretrained(out_dir, safe_serialization=True)
    processor.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"kind": "siglip_sigmoid_contrastive", "source": str(source), "train_pairs": len(train_pixels),
            "heldout_pairs": len(held_pixels), "steps": config.steps, "seconds": round(seconds, 1),
            "train_loss_first": losses[0], "train_loss_last": losses[-1], "before": before, "after": after}
