"""HF Trainer subclass: grouped sampling, per-module LR groups, logging, atomic checkpoints.

Owns everything the stock Trainer does not: the modality-length sampler, the optimizer's
named learning-rate groups, per-step lr-per-group / tokens-per-second / norm-layer (Table 5)
logging, the skipped-bad-sample count, and checkpoints that count as complete only once a
marker is written after every rank has saved, so a kill during a save leaves the previous
checkpoint as the one ``resume: auto`` picks. DeepSpeed glue stays the Trainer's.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Trainer

from llava_norm.data.sampler import ModalityLengthGroupedSampler
from llava_norm.train.params import parameter_groups

COMPLETE_MARKER = "checkpoint_complete"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoint dirs whose save finished on every rank, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found) if (p / COMPLETE_MARKER).is_file()]


def _gathered(params):
    """Context that gathers ZeRO-3 partitioned parameters (a no-op otherwise)."""
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params)
    import contextlib

    return contextlib.nullcontext()


class LlavaNormTrainer(Trainer):
    def __init__(self, *args, optim_config, group_by_modality_length: bool, norm_stats_steps: int,
                 keep_checkpoints: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.optim_config = optim_config
        self.group_by_modality_length = group_by_modality_length
        self.norm_stats_steps = norm_stats_steps
        self.keep_checkpoints = keep_checkpoints
        self.skipped_samples: list[str] = []
        self._tokens_since_log = 0
        self._last_log_time = time.perf_counter()

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if not self.group_by_modality_length:
            return super()._get_train_sampler(train_dataset)
        return ModalityLengthGroupedSampler(dataset.modality_lengths, self.args.per_device_train_batch_size,
                                            self.args.world_size, seed=self.args.seed)

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            o = self.optim_config
            self.optimizer = torch.optim.AdamW(parameter_groups(self.model, o), betas=(o.adam_beta1, o.adam_beta2),
                                               eps=1e-8)
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.skipped_samples.extend(inputs.pop("skipped_samples", []))
        self._tokens_since_log += int(inputs["attention_mask"].sum())
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)

    def log(self, logs: dict, start_time: float | None = None) -> None:
        if "loss" in logs and self.optimizer is not None:
            for group in self.optimizer.param_groups:
                logs[f"lr/{group.get('name', 'group')}"] = group["lr"]
            now = time.perf_counter()
            logs["tokens_per_second"] = self._tokens_since_log * self.args.world_size / max(now - self._last_log_time, 1e-9)
            self._tokens_since_log, self._last_log_time = 0, now
            norm = self.model.norm_layer if hasattr(self.model, "norm_layer") else None
            step = self.state.global_step
            if norm is not None and self.norm_stats_steps > 0 and step % self.norm_stats_steps == 0:
                with _gathered([norm.weight, norm.bias]):
                    logs.update({f"norm/{k}": v for k, v in norm.gain_statistics().items()})
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial) -> None:
        super()._save_checkpoint(model, trial)  # args.save_total_limit is None: rotation is ours
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if self.args.should_save:
            folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
            tmp = folder / f".{COMPLETE_MARKER}.tmp"
            tmp.write_text(str(self.state.global_step))
            os.replace(tmp, folder / COMPLETE_MARKER)
            complete = complete_checkpoints(self._get_output_dir(trial=trial))
            for old in complete[: max(len(complete) - self.keep_checkpoints, 0)]:
                shutil.rmtree(old, ignore_errors=True)

    def total_skipped(self) -> int:
        count = torch.tensor(len(self.skipped_samples))
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(count)
        return int(count)
