"""The optimisation loop and the atomic, marker-guarded output directories the warm-ups share.

Owns: ``LoopConfig`` (steps, batch, learning rate, schedule), ``train_steps`` (AdamW with a
cosine schedule from ``transformers``, a tqdm bar, per-step losses, seeded batch order) and
``Output`` (write a backbone into a temporary directory, drop a completion marker holding the
settings and the report, then rename it into place, so an interrupted warm-up never leaves a
directory that looks complete and a finished one is skipped on the next call), and the
hold-out split both warm-ups measure on (``holdout_split``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import get_cosine_schedule_with_warmup

MARKER = "warmup_complete.json"
HOLDOUT_EVERY = 20  # every 20th document or image-caption pair is held out for the before/after loss


def holdout_split(items: list) -> tuple[list, list]:
    """(train, held-out): every ``HOLDOUT_EVERY``-th item, from the first, is held out."""
    return ([x for i, x in enumerate(items) if i % HOLDOUT_EVERY],
            [x for i, x in enumerate(items) if i % HOLDOUT_EVERY == 0])


@dataclass(frozen=True)
class LoopConfig:
    """One warm-up's optimisation settings."""

    steps: int
    batch_size: int
    lr: float
    warmup_steps: int = 20
    weight_decay: float = 0.0  # no decay: the norms are free to grow as in real pretraining
    max_grad_norm: float = 1.0
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def train_steps(model: torch.nn.Module, n_examples: int, loss_of: Callable[[torch.Tensor], torch.Tensor],
                config: LoopConfig, desc: str) -> list[float]:
    """Run ``config.steps`` AdamW steps; ``loss_of(indices)`` returns the loss of one batch.

    Batches walk seeded permutations of ``range(n_examples)`` epoch after epoch, so a run is
    reproducible from ``config.seed`` alone. Returns the per-step training losses.
    """
    if n_examples < config.batch_size:
        raise ValueError(f"{desc}: {n_examples} examples cannot fill one batch of {config.batch_size}")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    schedule = get_cosine_schedule_with_warmup(optimizer, min(config.warmup_steps, config.steps), config.steps)
    generator = torch.Generator().manual_seed(config.seed)
    order, cursor, losses = torch.randperm(n_examples, generator=generator), 0, []
    model.train()
    bar = tqdm(range(config.steps), desc=desc, unit="step", leave=False)
    for _ in bar:
        if cursor + config.batch_size > n_examples:  # drop the ragged tail: every batch has the same size
            order, cursor = torch.randperm(n_examples, generator=generator), 0
        indices = order[cursor:cursor + config.batch_size]
        cursor += config.batch_size
        loss = loss_of(indices)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file (the fingerprint of a source checkpoint or data file)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Output:
    """A warm-up's output directory, complete only once its marker matches ``settings``."""

    def __init__(self, path: str | Path, settings: dict):
        self.path = Path(path)
        self.settings = settings
        self.staging = self.path.with_name(self.path.name + ".partial")

    def completed_report(self) -> dict | None:
        """The stored report if this exact warm-up already finished here, else None."""
        marker = self.path / MARKER
        if not marker.is_file():
            return None
        try:
            stored = json.loads(marker.read_text())
        except (OSError, ValueError):
            return None
        return stored.get("report") if stored.get("settings") == self.settings else None

    def begin(self) -> Path:
        """A clean staging directory to save into."""
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        return self.staging

    def commit(self, report: dict) -> None:
        """Mark the staging directory complete and move it into place (replacing a stale one)."""
        marker = {"settings": self.settings, "report": report}
        (self.staging / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        if self.path.exists():
            shutil.rmtree(self.path)
        os.replace(self.staging, self.path)
