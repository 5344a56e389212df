"""HF Trainer subclass: grouped sampling, per-module LR groups, logging, atomic checkpoints.

Owns everything the stock Trainer does not: the modality-length sampler, the optimizer's
named learning-rate groups, per-step lr-per-group / tokens-per-second / norm-layer (Table 5)
logging (kept whole across launches by ``llava_norm.train.runlog``), the skipped-bad-sample
count, and checkpoints that count as complete only once a marker is written after every rank
has saved, so a kill during a save leaves the previous checkpoint as the one ``resume: auto``
picks. A resume from a checkpoint at the last step trains nothing: the launch only writes the
final model and summary (the stock loop would train one step past ``max_steps`` when the last
step falls inside an epoch). DeepSpeed glue stays the Trainer's.

The position in the data is part of each checkpoint (``data_state.json``): the epoch and the
micro-batches each rank has consumed in it, counted as they are trained on, with a digest of
that epoch's sample order. On resume the sampler is put at that epoch by this class, not by
the Trainer's ``set_epoch`` plumbing: after ``skip_first_batches`` that plumbing no longer
reaches a sampler under accelerate's batch-sampler shards, and a resumed run in epoch >= 1
replayed epoch 0's order (accelerate #4071, #4233; transformers #40691).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Trainer

from llava_norm.data.packing import PackedDataset, PackSampler
from llava_norm.data.sampler import EpochSampler, ModalityLengthGroupedSampler, ShuffledSampler
from llava_norm.files import remove_tree, write_atomically
from llava_norm.train.params import make_optimizer
from llava_norm.train.rundir import (COMPLETE_MARKER, DATA_STATE, NO_DATA_STATE, checkpoint_manifest,
                                     complete_checkpoints, data_state, global_batch_problem, processes,
                                     stale_checkpoints)
from llava_norm.train.runlog import RunLog
from llava_norm.train.universal import remove_universal_copies

log = logging.getLogger(__name__)
SKIPS_SAID = 10  # draw-time skips each training process logs in full; every one is in skipped.jsonl


def _gathered(params):
    """Context that gathers ZeRO-3 partitioned parameters (a no-op otherwise)."""
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params)
    import contextlib

    return contextlib.nullcontext()


class ResumeError(RuntimeError):
    """A checkpoint that cannot be continued exactly."""


class DivergedError(RuntimeError):
    """A step whose gradient norm is not finite: its loss, or the weights, no longer are."""


class LlavaNormTrainer(Trainer):
    def __init__(self, *args, optim_config, group_by_modality_length: bool, norm_stats_steps: int,
                 keep_checkpoints: int, checkpoint_files: dict[str, str] | None = None, loss_kind: str = "plain",
                 loss_kernel: str = "torch", loss_softmax: str = "auto", **kwargs):
        """``checkpoint_files``: name -> text written into every checkpoint before it is marked
        complete (the run's resolved config, so a relaunch can compare against it).
        ``loss_kind``, ``loss_kernel``, ``loss_softmax``: train.loss, train.fused_loss_kernel and
        train.fused_loss_softmax, passed to the model's forward."""
        super().__init__(*args, **kwargs)
        self.loss_kind, self.loss_kernel, self.loss_softmax = loss_kind, loss_kernel, loss_softmax
        self.checkpoint_files = dict(checkpoint_files or {})
        self._sampler: EpochSampler | None = None
        self._epoch = 0
        self._batches_in_epoch = 0  # micro-batches this rank has trained on in self._epoch
        self._batches_per_epoch = 0
        self.optim_config = optim_config
        self.group_by_modality_length = group_by_modality_length
        self.norm_stats_steps = norm_stats_steps
        self.keep_checkpoints = keep_checkpoints
        self.skipped_samples: list[dict] = []  # this rank's draw-time skips (file, row, cause), whole run
        self._skips_said = 0  # of them, met in this launch (_say_skips)
        self.run_log = RunLog(self)
        self.add_callback(self.run_log)
        self._counted_parameters: int | None = None  # for total_flos, see floating_point_ops
        self.saved_world_size: int | None = None  # the resumed checkpoint's number of processes

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if isinstance(dataset, PackedDataset):
            self._sampler = PackSampler(dataset.packs, seed=self.args.seed)
        elif self.group_by_modality_length:
            self._sampler = ModalityLengthGroupedSampler(dataset.modality_lengths, self.args.per_device_train_batch_size,
                                                         self.args.world_size, seed=self.args.seed,
                                                         grad_accum=self.args.gradient_accumulation_steps)
        else:
            self._sampler = ShuffledSampler(len(dataset), seed=self.args.seed)
        return self._sampler

    def _data_position(self) -> dict:
        """Where the next micro-batch comes from, as (epoch, micro-batches already consumed in it)."""
        epoch, batches = self._epoch, self._batches_in_epoch
        if batches >= self._batches_per_epoch:
            epoch, batches = epoch + 1, 0
        return {"epoch": epoch, "batches_consumed": batches, "batches_per_epoch": self._batches_per_epoch,
                "order_fingerprint": self._sampler.fingerprint(epoch), "sampler": self._sampler.state_dict(),
                "global_step": self.state.global_step, "world_size": self.args.world_size,
                "per_device_batch": self.args.per_device_train_batch_size, "global_batch": self._global_batch()}

    def _global_batch(self) -> int:
        a = self.args
        return a.per_device_train_batch_size * a.world_size * a.gradient_accumulation_steps

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint,
                             trial):
        epochs, skip = super()._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs,
                                                    resume_from_checkpoint, trial)
        self.run_log.resumed_from = Path(resume_from_checkpoint) if resume_from_checkpoint is not None else None
        if resume_from_checkpoint is None:
            return epochs, skip
        # this launch's intervals (train.save_steps, train.logging_steps), not the checkpoint's
        # that transformers restores with its state: changing them never blocks a resume, so it applies
        self.state.compute_steps(self.args, max_steps)
        if self.state.global_step > self.state.max_steps:
            raise ResumeError(f"{resume_from_checkpoint}: at step {self.state.global_step}, past this run's last "
                              f"step {self.state.max_steps} (train.max_steps or train.epochs lowered?)")
        saved = self.check_data_order(resume_from_checkpoint)
        # so the run's skipped.jsonl stays whole across kills; on another number of processes the
        # main process carries every saved rank's records
        for rank in self.carried_ranks():
            skips = self._skips_file(Path(resume_from_checkpoint), rank)
            if skips.is_file():
                self.skipped_samples += [json.loads(line) for line in skips.read_text().splitlines() if line]
        if (saved["epoch"], saved["batches_consumed"]) != (epochs, skip):
            raise ResumeError(f"{resume_from_checkpoint}: saved data position epoch {saved['epoch']} + "
                              f"{saved['batches_consumed']} micro-batches, but step {self.state.global_step} "
                              f"implies epoch {epochs} + {skip} (batch size or accumulation changed?)")
        if self.saved_world_size != self.args.world_size and self.is_world_process_zero():
            print(f"[llava-norm] resuming at step {self.state.global_step} on {processes(self.args.world_size)}, "
                  f"saved on {processes(self.saved_world_size)} (global batch {self._global_batch()}: "
                  f"{self.args.gradient_accumulation_steps} accumulation steps)", flush=True)
        if self.state.global_step == self.state.max_steps and self.is_world_process_zero():
            print(f"[llava-norm] {resume_from_checkpoint} is at the last step ({self.state.global_step}): nothing "
                  "left to train; writing the final model and summary from it", flush=True)
        return saved["epoch"], saved["batches_consumed"]

    def check_data_order(self, checkpoint) -> dict:
        """The checkpoint's saved data position, if this data still gives that epoch's sample order;
        else ResumeError. Cheap (the sampler only), so a launch checks it before writing anything."""
        if self._sampler is None:
            self._get_train_sampler()
        saved = data_state(checkpoint)
        if saved is None:
            raise ResumeError(f"{checkpoint}: {NO_DATA_STATE}")
        world, saved_world = self.args.world_size, saved.get("world_size", self.args.world_size)
        problem = global_batch_problem(saved, world, self._global_batch(), self.args.per_device_train_batch_size)
        if problem:
            raise ResumeError(f"{checkpoint}: {problem}")
        # The same samples per step, split another way (other processes, or another micro-batch
        # under train.allow_config_change): the position in micro-batches scales with the rows
        # one micro-batch of all processes holds. (Checkpoints before per_device_batch was kept:
        # this launch's.)
        per_device = self.args.per_device_train_batch_size
        rows_then, rows_now = saved_world * saved.get("per_device_batch", per_device), world * per_device
        if rows_then != rows_now:
            if saved["batches_consumed"] * rows_then % rows_now:
                raise ResumeError(f"{checkpoint}: saved after {saved['batches_consumed']} micro-batches of {rows_then} "
                                  f"rows over all processes, which micro-batches of {rows_now} do not divide")
            saved = {**saved, "batches_consumed": saved["batches_consumed"] * rows_then // rows_now,
                     "batches_per_epoch": saved["batches_per_epoch"] * rows_then // rows_now}
        self.saved_world_size = saved_world
        if saved["order_fingerprint"] != self._sampler.fingerprint(saved["epoch"]):
            raise ResumeError(f"{checkpoint}: the data no longer gives epoch {saved['epoch']}'s sample "
                              "order (rows, their lengths, packing, the seed or the batch layout changed); resuming "
                              "would not continue the same run")
        return saved

    def _run_epoch(self, *args, epoch, epochs_trained, steps_trained_in_current_epoch, resume_from_checkpoint,
                   steps_in_epoch, **kwargs):
        if self.state.global_step >= self.state.max_steps:  # resumed from the last step's checkpoint
            self.control.should_training_stop = True
            return None
        resumed = resume_from_checkpoint is not None and epoch == epochs_trained
        self._epoch, self._batches_per_epoch = epoch, steps_in_epoch
        self._batches_in_epoch = steps_trained_in_current_epoch if resumed else 0
        self._sampler.set_epoch(epoch)  # the one place the epoch is set; see the module docstring
        return super()._run_epoch(*args, epoch=epoch, epochs_trained=epochs_trained,
                                  steps_trained_in_current_epoch=steps_trained_in_current_epoch,
                                  resume_from_checkpoint=resume_from_checkpoint, steps_in_epoch=steps_in_epoch,
                                  **kwargs)

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            self.optimizer = make_optimizer(self.model, self.optim_config, self.args.device)
            self._group_settings = [{k: v for k, v in group.items() if k != "params"}
                                    for group in self.optimizer.param_groups]
            # on the torch optimizer itself: DeepSpeed's ZeRO wrappers step it too
            self.optimizer.register_step_pre_hook(self.run_log.note_learning_rates)
        return self.optimizer

    def _scheduled_rates(self) -> list[float]:
        """Each group's rate for the next update: this launch's schedule at the resumed step. The
        optimizer's saved rates are the saved schedule's, which train.extend lengthened (a cosine
        ends at 0, which would have been the first extended update's rate)."""
        schedule = self.lr_scheduler  # transformers' LambdaLR: the check refuses a DeepSpeed scheduler section
        return [base * rule(schedule.last_epoch) for base, rule in zip(schedule.base_lrs, schedule.lr_lambdas)]

    def _load_optimizer_and_scheduler(self, checkpoint) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        # The schedule's peak rates are this launch's config's, not the checkpoint's: they are equal
        # unless a relaunch under train.allow_config_change changed an optim.lr* key, which the
        # restored scheduler would otherwise have ignored while the run's records named the new rate.
        self.lr_scheduler.base_lrs = [settings["lr"] for settings in self._group_settings]
        rates = self._scheduled_rates()
        if self.saved_world_size in (None, self.args.world_size):
            for group, rate in zip(self.optimizer.param_groups, rates):
                group["lr"] = rate
        else:
            # DeepSpeed's ZeRO-3 universal load copies the first group's settings (name, rate,
            # weight decay) into every group; each group's own come back from how it was built and
            # its rate from the resumed scheduler
            for group, settings, rate, base in zip(self.optimizer.param_groups, self._group_settings, rates,
                                                   self.lr_scheduler.base_lrs):
                group.update({**settings, "lr": rate, "initial_lr": base})
            # ... and gives every partition one shared step counter, which AdamW then advanced once per
            # partition at each step (wrong bias corrections): each gets a counter of its own
            inner = self.optimizer
            while hasattr(inner, "optimizer"):
                inner = inner.optimizer
            for state in inner.state.values():
                if torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].clone()

    def _say_skips(self, records: list[dict]) -> None:
        """The first SKIPS_SAID skips this launch's process met when drawing rows, logged in full;
        the rest only recorded (a folder of missing images would flood every rank's log). Said
        here, in the training process: each data loader worker holds a copy of the dataset."""
        for record in records:
            self._skips_said += 1
            if self._skips_said <= SKIPS_SAID:
                more = "; this process's further skips are recorded in skipped.jsonl only" \
                    if self._skips_said == SKIPS_SAID else ""
                log.warning("skipping bad sample: %s%s", record["message"], more, extra={"every_rank": True})

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self._batches_in_epoch += 1
        skipped = inputs.pop("skipped_samples", [])
        self.skipped_samples.extend(skipped)
        self._say_skips(skipped)
        # packed batches count their real tokens (they have no attention mask)
        tokens = inputs.pop("num_tokens", None)
        self.run_log.count(int(tokens if tokens is not None else inputs["attention_mask"].sum()),
                           inputs["input_ids"].shape[-1])
        if self.loss_kind != "plain":
            inputs["loss_kind"], inputs["loss_kernel"] = self.loss_kind, self.loss_kernel
            inputs["loss_softmax"] = self.loss_softmax
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)

    def floating_point_ops(self, inputs) -> int:
        """transformers' estimate (6 x input tokens x non-embedding parameters), with every
        parameter counted whole: its own count reads ``numel()``, which is 0 for a parameter ZeRO-3
        has partitioned away, so ``total_flos`` depended on which shards happened to be gathered."""
        if self._counted_parameters is None:
            embeddings = {id(m.weight) for m in self.model.modules() if isinstance(m, torch.nn.Embedding)}
            self._counted_parameters = sum(getattr(p, "ds_numel", p.numel()) for p in self.model.parameters()
                                           if id(p) not in embeddings)
        return 6 * inputs["input_ids"].numel() * self._counted_parameters

    def log(self, logs: dict, start_time: float | None = None) -> None:
        if "train_loss" in logs:  # the end of training: the mean over every step, not over this launch's
            logs["train_loss"] = self.run_log.train_loss()
        if "loss" in logs and self.optimizer is not None:
            self.run_log.close_window(logs)
            if torch.cuda.is_available():  # with longest_row: what `llava-norm plan --seq-len` predicts
                logs["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
                # the caching allocator freeing everything and retrying: each one a device-wide sync
                logs["alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0)
            norm = self.model.norm_layer if hasattr(self.model, "norm_layer") else None
            step = self.state.global_step
            if norm is not None and self.norm_stats_steps > 0 and step % self.norm_stats_steps == 0:
                with _gathered(list(norm.parameters())):  # whatever the arm has (scale_to_t: none)
                    logs.update({f"norm/{k}": v for k, v in norm.gain_statistics().items()})
        super().log(logs, start_time)

    def _finalize_training(self, *args, **kwargs):
        # the steps since the last log enter train_loss as the mean over ranks, as every logged
        # window does (transformers adds this rank's own sum)
        if dist.is_available() and dist.is_initialized():
            window = self._tr_loss.detach().clone()
            dist.all_reduce(window)
            self._tr_loss = window / self.args.world_size
        return super()._finalize_training(*args, **kwargs)

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, *args, **kwargs) -> None:
        # Every step, before its log or checkpoint: transformers logs a NaN step's loss as the mean
        # of the others (logging_nan_inf_filter) and trains on, so a diverged run ended "done" with
        # NaN weights. A step DeepSpeed skipped for its non-finite gradients (bf16 overflow
        # handling) changed no weight: the run goes on. Every rank reads the same global norm.
        if grad_norm is not None and not math.isfinite(float(grad_norm)):
            engine = self.model_wrapped
            skipped = hasattr(engine, "was_step_applied") and not engine.was_step_applied()
            if not skipped:
                found = complete_checkpoints(Path(self._get_output_dir(trial=None)))
                raise DivergedError(
                    f"training diverged: the gradient norm at step {self.state.global_step} is {float(grad_norm)}, "
                    f"and the update it made leaves weights that are not finite; nothing was saved at that step "
                    f"(the last complete checkpoint: {found[-1] if found else 'none'}). Lower optim.lr or raise "
                    "optim.warmup_ratio, then relaunch with train.restart=true (or train.allow_config_change=true "
                    "to continue from that checkpoint)")
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)

    def _save_checkpoint(self, model, trial) -> None:
        if self.args.should_save:  # an earlier save's files (another world size's ranks' among them) would
            # stay in the folder this save writes, and be converted with it on the next resume
            for stale in stale_checkpoints(self._get_output_dir(trial=trial), self.state.global_step,
                                           self.run_log.resumed_from):
                remove_tree(stale)
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        super()._save_checkpoint(model, trial)  # args.save_total_limit is None: rotation is ours
        folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        self._write_skips(folder)
        self.run_log.write(folder)
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if self.args.should_save:
            files = {**self.checkpoint_files, DATA_STATE: json.dumps(self._data_position(), indent=2)}
            for name, text in files.items():
                (folder / name).write_text(text)
            # sole writer: no other process writes the marker (a killed save's folder is gone by now)
            write_atomically(folder / COMPLETE_MARKER, checkpoint_manifest(folder, self.state.global_step),
                             sole_writer=True)
            complete = complete_checkpoints(self._get_output_dir(trial=trial))
            for old in complete[: max(len(complete) - self.keep_checkpoints, 0)]:
                remove_tree(old)  # renamed aside first: a kill mid-deletion leaves no half checkpoint
            remove_universal_copies(Path(self._get_output_dir(trial=trial)))

    def carried_ranks(self) -> list[int]:
        """The saved ranks whose per-rank records (skips, log window) this process takes on at a
        resume: its own; on another number of processes, every saved rank's on the main process
        and none on the others."""
        if self.saved_world_size in (None, self.args.world_size):
            return [self.args.process_index]
        return list(range(self.saved_world_size)) if self.args.process_index == 0 else []

    def _skips_file(self, folder: Path, rank: int | None = None) -> Path:
        return folder / f"skipped_rank{self.args.process_index if rank is None else rank}.jsonl"

    def _write_skips(self, folder: Path) -> None:
        self._skips_file(folder).write_text("".join(json.dumps(r) + "\n" for r in self.skipped_samples))

    def all_skips(self, out: Path) -> list[dict]:
        """Every rank's draw-time skip records (through files, no pickles); complete on the main process."""
        self._write_skips(out)
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if not self.args.should_save:
            return []
        records = []
        for rank in range(self.args.world_size):
            part = self._skips_file(out, rank)
            records += [json.loads(line) for line in part.read_text().splitlines() if line]
            part.unlink()
        return records
