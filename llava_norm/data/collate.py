"""Batching: padding token sequences (right for training, left for generation) and images.

Owns the single collation used by the trainer, the evaluator and the analyses, so every
consumer sees the same attention masks and image ordering (images in batch order, text-only
samples contribute none).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llava_norm.data.conversation import IGNORE_INDEX


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]
    pixel_values: torch.Tensor | None  # (n_images, C, H, W) or None for text-only
    sample_id: str = ""
    # skip records ({"file", "row", "cause", "message"}, see data.dataset) of the bad samples this one replaced
    skipped: list[dict] = field(default_factory=list)


def collate(examples: list[Example], pad_token_id: int, padding_side: str = "right") -> dict:
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        span = slice(width - n, width) if padding_side == "left" else slice(0, n)
        input_ids[row, span] = torch.tensor(example.input_ids, dtype=torch.long)
        labels[row, span] = torch.tensor(example.labels, dtype=torch.long)
        attention_mask[row, span] = 1
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
    if any(e.skipped for e in examples):
        batch["skipped_samples"] = [record for e in examples for record in e.skipped]
    images = [e.pixel_values for e in examples if e.pixel_values is not None]
    if images:
        batch["pixel_values"] = torch.cat(images, dim=0)
    return batch
