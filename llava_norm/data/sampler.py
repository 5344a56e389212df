"""Modality-length grouped sampling (LLaVA's ``group_by_modality_length``, made robust).

Owns the order in which samples are drawn. Image and text-only samples are shuffled
separately, cut into megabatches of ``batch_size * world_size`` sorted by length (so each
rank's batch has similar lengths and one modality), and the megabatches are shuffled
together. Deterministic given seed and epoch, so HF Trainer's mid-epoch resume (which skips
the batches already seen) lands on exactly the same samples. Works with a single modality
(LLaVA #715, #609) and always yields every index once per epoch.
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


def _megabatches(indices: list[int], lengths: list[int], size: int, generator: torch.Generator) -> list[list[int]]:
    order = [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]
    chunks = [order[i:i + size] for i in range(0, len(order), size)]
    return [sorted(chunk, key=lambda i: abs(lengths[i]), reverse=True) for chunk in chunks]


def grouped_order(lengths: list[int], megabatch_size: int, seed: int, epoch: int) -> list[int]:
    """lengths > 0: image samples, < 0: text-only (magnitude = approximate length)."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    image = [i for i, length in enumerate(lengths) if length > 0]
    text = [i for i, length in enumerate(lengths) if length <= 0]
    full, tails = [], []
    for group in (image, text):
        if not group:
            continue
        batches = _megabatches(group, lengths, megabatch_size, generator)
        if len(batches[-1]) < megabatch_size:
            tails.extend(batches.pop())  # the two partial megabatches go last, together
        full.extend(batches)
    order = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()]
    if tails:
        order.append(sorted(tails, key=lambda i: abs(lengths[i]), reverse=True))
    return [i for batch in order for i in batch]


class ModalityLengthGroupedSampler(Sampler[int]):
    def __init__(self, lengths: list[int], batch_size: int, world_size: int = 1, seed: int = 42):
        self.lengths = list(lengths)
        self.megabatch_size = batch_size * world_size
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        return iter(grouped_order(self.lengths, self.megabatch_size, self.seed, self.epoch))
