"""``train.profile_steps``: torch.profiler over a window of optimizer steps, on the main process.

Owns the window, its files and its printed summary: ``output_dir/profile/trace.json`` (a Chrome
trace, for Perfetto or chrome://tracing) and ``profile/top_ops.txt`` (operators by their own
time, GPU time where there is a GPU). The window opens at the end of the step before the first
profiled one and closes at the end of the last, so the data loading, the optimizer step and any
host synchronisation between steps fall inside it, as they do in a step's wall time.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from transformers import TrainerCallback

from llava_norm.train.rundir import PROFILE_DIR

TOP_OPS = 30
HOST_OPS = 15


def kernel_seconds(averages) -> float:
    """The GPU kernels' own time in ``key_averages()`` rows, as the table's "Self CUDA time total":
    an operator's row, or an annotation's such as the optimizer step's, repeats its kernels' time."""
    return sum(row.self_device_time_total for row in averages
               if row.device_type == DeviceType.CUDA and not getattr(row, "is_user_annotation", False)) / 1e6


class StepProfiler(TrainerCallback):
    """Profiles global steps ``first`` to ``last`` (inclusive) of the main process."""

    def __init__(self, first: int, last: int, out: Path):
        self.first, self.last, self.out = first, last, Path(out)
        self.profiler: torch.profiler.profile | None = None
        self.started = 0.0

    def _start(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.profiler.start()
        self.started = time.perf_counter()

    def _stop(self, step: int) -> None:
        seconds = time.perf_counter() - self.started  # the steps', not the profiler's own stop
        self.profiler.stop()
        folder = self.out / PROFILE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.profiler.export_chrome_trace(str(folder / "trace.json"))
        cuda = torch.cuda.is_available()
        by = "self_device_time_total" if cuda else "self_cpu_time_total"
        averages = self.profiler.key_averages()
        head = (f"steps {self.first}-{step} of the main process: {seconds:.3f} s wall, "
                f"{seconds / max(step - self.first + 1, 1):.3f} s a step")
        table = averages.table(sort_by=by, row_limit=TOP_OPS)
        if cuda:  # a GPU idle for much of the wall time points at the host: its own table follows
            busy = kernel_seconds(averages)
            head += f"; GPU kernels {busy:.3f} s, summed over streams ({busy / max(seconds, 1e-9):.0%} of the wall)"
            table += ("\noperators by self_cpu_time_total (the host's side)\n"
                      + averages.table(sort_by="self_cpu_time_total", row_limit=HOST_OPS))
        head += f"; operators by {by}\n"
        (folder / "top_ops.txt").write_text(head + table)
        print(f"[llava-norm] profile: {head.strip()}; {folder / 'trace.json'}\n{table}", flush=True)
        self.profiler = None

    def on_train_begin(self, args, state, control, **kwargs):
        # a fresh run profiling from step 1, or a resumed one whose next step is the first profiled
        if args.process_index == 0 and state.global_step + 1 == self.first:
            self._start()

    def on_step_end(self, args, state, control, **kwargs):
        if args.process_index != 0:
            return
        if self.profiler is None and state.global_step + 1 == self.first:
            self._start()
        elif self.profiler is not None and state.global_step >= self.last:
            self._stop(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.profiler is not None:  # the run ended inside the window
            self._stop(state.global_step)
