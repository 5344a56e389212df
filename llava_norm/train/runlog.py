"""A run's logged series and summary figures, whole across kills and relaunches.

Owns what transformers' Trainer keeps per launch, which a relaunch would otherwise lose or skew:
- the loss accumulators: each rank's loss sum since the last log, the sum of the logged losses
  and the step last logged. A log window cut by a kill then reports the same mean as the
  uninterrupted run, and ``train_loss`` is the mean over every step of the run (transformers
  divides by the steps of the last launch);
- the throughput window: tokens (every rank's real tokens), the widest micro-batch and the
  seconds since the last log. Its clock starts at each launch's first step, so no log includes
  model loading or start-up, and a window cut by a kill adds the seconds it had trained before;
- the learning rate each parameter group was stepped with, read in the optimizer's step pre-hook:
  by the time a step is logged the scheduler has moved on (under DeepSpeed also before the
  Trainer reads its own ``learning_rate``).
Each rank writes its part into every checkpoint (``log_state_rank<N>.json``) before the checkpoint
is marked complete; a resumed launch puts it back when training begins. ``kept_wandb_run`` makes
every launch of a run log to one W&B run, and ``main_process_messages`` has the package's messages
that every process would print alike printed once.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import string
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from llava_norm.files import write_atomically
from llava_norm.train.rundir import WANDB_RUN_ID
from llava_norm.worker import restored_environment

log = logging.getLogger(__name__)
LOG_STATE = "log_state_rank{rank}.json"


class RunLog(TrainerCallback):
    """The trainer's log window and loss accumulators, saved with each checkpoint and restored on resume."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.resumed_from: Path | None = None  # set by the trainer when it resumes
        self.tokens = 0  # this rank's real tokens since the last log
        self.longest = 0  # this rank's widest micro-batch since the last log
        self.seconds = 0.0  # seconds trained since the last log in earlier launches
        self.clock: float | None = None  # this launch's first step start, then the last log (one RunLog a launch)
        self.learning_rates: dict[str, float] = {}  # per group, as of the last optimizer step
        self.losses_from = 0  # the step the loss sums count from: 0 unless a checkpoint had no log state

    def note_learning_rates(self, optimizer, *_) -> None:
        """The optimizer's step pre-hook: each group's rate as this update uses it. Updated, not
        replaced: DeepSpeed's ZeRO-1/2 steps the optimizer once per group, showing it that group only."""
        self.learning_rates.update({group.get("name", "group"): group["lr"] for group in optimizer.param_groups})

    def count(self, tokens: int, width: int) -> None:
        self.tokens += tokens
        self.longest = max(self.longest, width)

    def on_train_begin(self, args, state, control, **kwargs):
        # After the Trainer reset its accumulators for this launch and before the first step.
        if self.resumed_from is not None:
            self._restore(self.resumed_from)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.clock is None:
            self.clock = time.perf_counter()

    def close_window(self, logs: dict) -> None:
        """Add this window's learning rates, tokens and throughput to a step's logs, and start the next.
        Every rank calls it at the same step (the Trainer logs on all of them)."""
        for name, lr in self.learning_rates.items():
            logs[f"lr/{name}"] = lr
        if self.learning_rates:  # the Trainer's figure is its first group's: the same, read at the update
            logs["learning_rate"] = next(iter(self.learning_rates.values()))
        tokens = torch.tensor(self.tokens, dtype=torch.int64, device=self.trainer.args.device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(tokens)
        now = time.perf_counter()
        seconds = self.seconds + (now - self.clock if self.clock is not None else 0.0)
        logs["tokens"] = int(tokens)
        logs["tokens_per_second"] = int(tokens) / max(seconds, 1e-9)
        logs["longest_row"] = self.longest  # rank 0's, what `llava-norm plan --seq-len` predicts
        self.tokens, self.longest, self.seconds, self.clock = 0, 0, 0.0, now

    def train_loss(self) -> float:
        """The mean loss over every step of the run; at the end of training, after the Trainer added
        the steps since the last log to its logged sum."""
        return self.trainer._total_loss_scalar / max(self.trainer.state.global_step - self.losses_from, 1)

    def write(self, folder: Path) -> None:
        t = self.trainer
        seconds = self.seconds + (time.perf_counter() - self.clock if self.clock is not None else 0.0)
        state = {"loss_since_log": float(t._tr_loss), "logged_loss_sum": t._total_loss_scalar,
                 "last_logged_step": t._globalstep_last_logged, "tokens": self.tokens, "longest": self.longest,
                 "seconds": seconds}
        (folder / LOG_STATE.format(rank=t.args.process_index)).write_text(json.dumps(state, indent=2))

    def _restore(self, checkpoint: Path) -> None:
        t = self.trainer
        world, saved_world = t.args.world_size, t.saved_world_size or t.args.world_size
        # On another number of processes the main process carries the saved ranks' windows and the
        # others start empty: the logged mean over ranks and the summed tokens come out the same.
        ranks = t.carried_ranks()
        paths = [checkpoint / LOG_STATE.format(rank=rank) for rank in ranks or [0]]
        if not all(path.is_file() for path in paths):  # written before the logs were kept
            self.losses_from = t.state.global_step
            log.warning("%s has no %s: the logs' sums start again at step %d, and train_loss covers the steps "
                        "after it only", checkpoint, paths[0].name, t.state.global_step)
            return
        states = [json.loads(path.read_text()) for path in paths]
        window = states if ranks else []
        loss = sum(state["loss_since_log"] for state in window)
        if saved_world != world:
            loss = loss * world / saved_world
        # float32 as the Trainer accumulates it: the resumed sums are bit for bit the uninterrupted run's
        t._tr_loss = torch.tensor(loss, dtype=torch.float32, device=t.args.device)
        t._total_loss_scalar = states[0]["logged_loss_sum"]
        t._globalstep_last_logged = states[0]["last_logged_step"]
        self.tokens = sum(state["tokens"] for state in window)
        self.longest = max((state["longest"] for state in window), default=0)
        self.seconds = states[0]["seconds"]


WANDB_VARIABLES = ("WANDB_RUN_ID", "WANDB_RESUME")  # what keep_wandb_run sets for wandb.init


@contextmanager
def kept_wandb_run(output_dir: Path | None):
    """``keep_wandb_run(output_dir)`` for the body (None: W&B off, or not the main process), with
    the variables it sets restored after: a later run in the same process (a test, a library
    caller) must not log into this one, nor a launch this process starts inherit its id."""
    with restored_environment(*WANDB_VARIABLES):
        if output_dir is not None:
            keep_wandb_run(output_dir)
        yield


def keep_wandb_run(output_dir: Path) -> str:
    """``report_to: [wandb]``: every launch of a run logs to one W&B run. Its id is made at the
    first launch and kept in output_dir; each launch hands it to ``wandb.init`` through the
    variables wandb reads (``WANDB_RUN_ID``, ``WANDB_RESUME=allow``), which transformers'
    WandbCallback leaves to it. An id the user set in ``WANDB_RUN_ID`` wins and is kept.
    Call on the main process before training begins; returns the id."""
    path = output_dir / WANDB_RUN_ID
    run_id = os.environ.get("WANDB_RUN_ID") or (path.read_text().strip() if path.is_file() else "")
    if not run_id:  # W&B's own form: 8 lowercase letters and digits
        run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    if not path.is_file() or path.read_text().strip() != run_id:
        write_atomically(path, run_id + "\n")
    os.environ["WANDB_RUN_ID"] = run_id
    os.environ.setdefault("WANDB_RESUME", "allow")
    return run_id


class _MainProcessOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith("llava_norm") or record.levelno >= logging.ERROR or \
            getattr(record, "every_rank", False)


def main_process_messages() -> None:
    """On every process but the main one (global rank 0), drop the package's info and warning
    messages that all processes would print alike (a resume, the frozen modules, the rows adjusted
    at load); errors, and messages logged with ``extra={"every_rank": True}`` (what differs by
    process: the rows it drew, its node's launch check), stay on every process."""
    if int(os.environ.get("RANK", "0")) == 0:
        return
    for handler in logging.getLogger().handlers:
        handler.addFilter(_MainProcessOnly())
