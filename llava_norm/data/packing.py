"""Sequence packing (``data.packing``): several samples share one row, each isolated.

Owns the packing plan (which samples share a row, fixed for the run), the packed dataset
and sampler, and the packed collation. A row is the samples' tokens back to back; each
sample's position ids restart at 0, and that restart is all the model needs: transformers
builds a block-diagonal causal mask from position ids when no attention mask is given
(sdpa, eager), and its flash-attention path runs variable-length kernels from them, but
only for a single row, so flash-attention batches are flattened into one row.

Exactness per sample: the label of each sample's first token is ignored, so the shifted
loss never asks a sample's last token to predict the next sample's first; an unpacked row
never predicts its first token either, so loss and token counts are unchanged.

A bad sample inside a pack is dropped (with its skip record), not replaced: a replacement
could overflow the row budget. Lengths are exact (``ConversationTokenizer.encoded_lengths``),
so a planned row never exceeds ``data.pack_max_tokens``; they are read from the row index, which
keeps them when the run packs (``exact_lengths``), and taken here otherwise.
"""

from __future__ import annotations

import hashlib
import logging
from bisect import bisect_left, insort
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch.utils.data import Dataset

from llava_norm.data.collate import Example
from llava_norm.data.conversation import IGNORE_INDEX
from llava_norm.data.dataset import MAX_REPLACEMENTS, BadSampleError
from llava_norm.data.sampler import ShuffledSampler

log = logging.getLogger(__name__)
LENGTH_CHUNK = 8192  # rows whose exact lengths are taken per batch of tokenizer calls


def plan_packs(lengths: list[int], budget: int, seed: int) -> list[list[int]]:
    """Best-fit decreasing: longest samples first, each into the open row it fills most
    tightly (ties in length in a seeded order). Each returned pack lists sample indices whose
    lengths sum to at most ``budget``; every index appears exactly once."""
    too_long = [i for i, length in enumerate(lengths) if length > budget]
    if too_long:
        raise ValueError(f"samples {too_long[:5]} are longer than the row budget {budget}")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    order.sort(key=lambda i: -lengths[i])  # stable: equal lengths keep the seeded order
    packs: list[list[int]] = []
    spaces: list[int] = []  # the distinct free spaces of open rows, sorted
    rows_with_space: dict[int, list[int]] = {}
    for index in order:
        at = bisect_left(spaces, lengths[index])
        if at < len(spaces):
            space = spaces[at]
            row = rows_with_space[space].pop()
            if not rows_with_space[space]:
                del rows_with_space[space]
                spaces.pop(at)
        else:
            space, row = budget, len(packs)
            packs.append([])
        packs[row].append(index)
        left = space - lengths[index]
        if left not in rows_with_space:
            rows_with_space[left] = []
            insort(spaces, left)
        rows_with_space[left].append(row)
    return packs


@dataclass
class Pack:
    examples: list[Example]
    skipped: list[dict] = field(default_factory=list)  # skip records of the samples dropped from it


class PackedDataset(Dataset):
    """Item i is pack i of the plan: the samples of ``samples`` (a SupervisedDataset) that share a row."""

    def __init__(self, samples, budget: int, seed: int):
        if samples.max_length > budget:  # the run builds ``samples`` with min(max_length, pack_max_tokens)
            raise ValueError(f"samples are cut at {samples.max_length} tokens, longer than the row budget {budget}")
        self.samples, self.budget, self.seed = samples, budget, seed

    @cached_property
    def lengths(self) -> list[int]:
        kept = self.samples.exact_lengths(self.samples.max_length)
        if kept is not None:  # taken once, when the row index was built
            return kept
        rows, out = self.samples.rows, []
        for start in range(0, len(rows), LENGTH_CHUNK):  # the rows stay in the index: a chunk at a time
            part = [rows[i].messages for i in range(start, min(start + LENGTH_CHUNK, len(rows)))]
            out += self.samples.encoder.encoded_lengths(part, self.samples.max_length)
        return out

    @cached_property
    def packs(self) -> list[list[int]]:
        """The plan. Samples whose first turn does not fit are refused here, once, as the
        bad-sample policy says (error, or a load-time skip record), instead of filling rows."""
        kept, limit, run = [], self.samples.max_length, 0
        for index, length in enumerate(self.lengths):
            if length:
                kept.append(index)
                run = 0
                continue
            error = self.samples.too_long(self.samples.rows[index], f"{limit} tokens (the smaller of "
                                          "data.max_length and data.pack_max_tokens)")
            run += 1
            if run == MAX_REPLACEMENTS:  # as unpacked draws stop: a budget too small for the data, not bad rows
                raise BadSampleError(f"{MAX_REPLACEMENTS} consecutive samples do not fit; last: {error}",
                                     cause="too_many_bad_samples")
            self.samples.reject(error)
        if len(kept) < len(self.lengths):
            log.warning("packing: %d samples whose first turn does not fit %d tokens are skipped",
                        len(self.lengths) - len(kept), limit)
        if not kept:
            raise BadSampleError(f"no sample fits {limit} tokens (data.max_length, data.pack_max_tokens)",
                                 cause="too_many_bad_samples")
        packs = [[kept[i] for i in pack] for pack in plan_packs([self.lengths[i] for i in kept], self.budget,
                                                                 self.seed)]
        log.info("packing: %d samples in %d rows of at most %d tokens (%.1f%% filled)", len(kept), len(packs),
                 self.budget, 100 * sum(self.lengths) / max(len(packs) * self.budget, 1))
        return packs

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, index: int) -> Pack:
        skipped: list[dict] = []
        # A pack whose samples are all bad is replaced by the next pack, as a bad row is by the
        # next row, and as there, a run of bad packs (a wrong image folder) stops the run.
        for attempt in range(MAX_REPLACEMENTS):
            pack = self.packs[(index + attempt) % len(self.packs)]
            drawn = (self.samples.draw(self.samples.rows[i], skipped) for i in pack)
            examples = [example for example in drawn if example is not None]
            if sum(len(e.input_ids) for e in examples) > self.budget:  # the plan's lengths were wrong
                raise RuntimeError(f"packed row of rows {[self.samples.rows[i].row_id for i in pack]} holds more "
                                   f"than {self.budget} tokens")
            if examples:
                return Pack(examples, skipped)
        raise BadSampleError(f"{MAX_REPLACEMENTS} consecutive packs of bad samples from pack {index}; "
                             f"last: {skipped[-1]['message']}", cause="too_many_bad_samples")


class PackSampler(ShuffledSampler):
    """ShuffledSampler's seeded shuffle, of the packs; the fingerprint covers which samples each pack holds."""

    def __init__(self, packs: list[list[int]], seed: int):
        super().__init__(len(packs), seed)
        self.packs = packs

    def fingerprint(self, epoch: int) -> str:
        packs = [self.packs[i] for i in self.order(epoch)]
        return hashlib.sha256(repr(packs).encode()).hexdigest()[:16]


def collate_packed(packs: list[Pack], pad_token_id: int, one_row: bool = False) -> dict:
    """Each pack as one right-padded row (``one_row``: the whole batch as one row, which is the
    only packed layout transformers' flash-attention path recognises). No attention mask: the
    position ids carry the sample boundaries; padding is one more sequence at a row's end, so
    no real token attends to it. ``num_tokens`` counts the real tokens, for throughput logs."""
    rows = [[e for pack in packs for e in pack.examples]] if one_row else [pack.examples for pack in packs]
    width = max(sum(len(e.input_ids) for e in row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for example in row:
            n = len(example.input_ids)
            input_ids[r, at:at + n] = torch.tensor(example.input_ids)
            labels[r, at + 1:at + n] = torch.tensor(example.labels[1:], dtype=torch.long)
            position_ids[r, at:at + n] = torch.arange(n)
            at += n
        position_ids[r, at:] = torch.arange(width - at)
    batch = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids,
             "num_tokens": sum(len(e.input_ids) for row in rows for e in row)}
    skipped = [record for pack in packs for e in pack.examples for record in e.skipped]
    skipped += [record for pack in packs for record in pack.skipped]
    if skipped:
        batch["skipped_samples"] = skipped
    images = [e.pixel_values for row in rows for e in row if e.pixel_values is not None]
    if images:
        batch["pixel_values"] = torch.cat(images, dim=0)
    return batch
