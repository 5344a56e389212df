"""The GPU kit: every GPU figure the repo targets, in two commands, into one results file.

Owns which measurements run in which half, their time limits under one overall deadline, the
package check before anything runs, and the results file (``gpu_kit.json`` and ``gpu_kit.md``),
rewritten as each result arrives so a command killed at its limit keeps what it measured.

- PART=1: ``step_llama`` (bench/gpu_step.py at SigLIP-SO400M + Llama-3.2-3B: the layers compiled
  as ``train.compile`` does, then eager; sdpa, FlexAttention and flash-attention 2 where it
  imports; micro-batch 8 with 4 accumulation steps; unpacked against packed over NeXT-like
  lengths with the packed logits checked against bf16's own error; time shares), ``liger_llama``
  (the same step with Liger's RMSNorm, SwiGLU, RoPE and fused linear cross-entropy) and
  ``fused_loss`` (plain against the torch, Liger and Cut Cross-Entropy kernels, bf16, both
  vocabularies).
- PART=2: ``train`` (20 stage-2
  steps under ``llava-norm train``: DeepSpeed ZeRO-2 at a real-width pair whose activations exceed
  its model states, ZeRO-2 at SigLIP-SO400M + Llama-3.2-3B, ZeRO-3 at Qwen2.5-7B where the plan
  says it fits; the plan's peak beside the measured one, a planned number without a measured one
  is a failure), ``step_qwen`` and ``liger_qwen`` (the step variants at Qwen2.5-7B, checkpointing on).

    make bench-gpu PART=1; make bench-gpu PART=2        # = bash bench/gpu_kit.sh --part N
    .venv/bin/python bench/gpu_kit.py --toy              # CPU, tiny shapes: the suite's run of every part

Reports go to ``$OUT`` when set (the device tool's folder), else ``runs/gpu_kit``; work files
(backbones, data, runs) to ``--work``. Every child runs in its own process group, killed at its
limit or the deadline, so no process outlives the kit.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from _repo import REPO_ROOT
from _kit_train import TRAIN_RUNS, figures_after, train_setup

BENCH = Path(__file__).resolve().parent
# The cheaper, decisive measurement of each half first: a half cut short keeps it.
# Liger's layer kernels run in a process of their own: on the H100 they once left an illegal
# memory access that ended the process they ran in (bench/RESULTS.md).
PARTS = {1: ("step_llama", "liger_llama", "fused_loss"), 2: ("train", "step_qwen", "liger_qwen")}
LIMITS_S = {"fused_loss": 150, "step_llama": 280, "liger_llama": 80, "train": 420, "step_qwen": 90, "liger_qwen": 60}
DEADLINE_S = 460  # each half, the kit's start-up included
# What the kit's parts import on the GPU machine beyond what the CPU toy run does (the toy run's
# imports are recorded by the suite): Python module -> distribution.
GPU_IMPORTS = {"triton": "triton", "liger_kernel": "liger-kernel", "cut_cross_entropy": "cut-cross-entropy"}
# Modules the parts need; checked before anything runs so a missing wheel stops the kit at once.
NEEDED = ("torch", "transformers", "tokenizers", "huggingface_hub", "safetensors", "accelerate", "omegaconf", "peft",
          "PIL", "pyarrow", "numpy")
NEEDED_BY = {"train": ("datasets", "dill", "multiprocess", "deepspeed", "pydantic", "pandas")}


def step_command(part: str, toy: bool) -> list[str]:
    script = [sys.executable, str(BENCH / "gpu_step.py")]
    if toy:  # the same code at tiny shapes; Liger's kernels need CUDA
        return script + {"step_llama": ["--toy", "--attn", "sdpa", "--pool", "--profile", "--checkpointing", "off", "on",
                                        "--accum", "2", "--compile", "off", "on", "--compile-backend", "aot_eager"],
                         "step_qwen": ["--toy", "--attn", "sdpa", "--checkpointing", "on"]}.get(part, ["--toy", "--liger", "on"])
    # micro-batch 8 with 4 accumulation steps: the one-GPU recipe's rows (configs/recipe-1gpu), its
    # optimizer step spread as a recipe spreads it (micro-batch 4 against 8: bench/RESULTS.md)
    llm = ["--llms", "llama-3.2-3b", "--batches", "8", "--accum", "4"] if part.endswith("llama") else \
        ["--llms", "qwen2.5-7b", "--batches", "4", "--checkpointing", "on"]
    if part.startswith("liger"):
        return script + llm + ["--attn", "sdpa", "--liger", "on", "--profile"]
    return script + llm + ["--attn", "sdpa", "flex_attention", "flash_attention_2", "--profile"] + \
        (["--pool", "--compile", "on", "off"] if part == "step_llama" else [])


def loss_command(toy: bool) -> list[str]:
    script = [sys.executable, str(BENCH / "fused_loss.py")]
    if toy:
        return script + ["--tokens", "64", "--hidden", "32", "--vocabs", "512", "--repeats", "1"]
    return script + ["--device", "cuda", "--dtype", "bf16", "--repeats", "10", "--kinds", "torch", "liger", "cce",
                     "--chunk-mib", "256", "512", "1024"]


class Report:
    """gpu_kit.json and gpu_kit.md, rewritten whole after every change."""

    def __init__(self, out: Path, header: dict):
        self.out, self.data = out, {**header, "parts": {}}
        out.mkdir(parents=True, exist_ok=True)
        self.write()

    def part(self, name: str, **fields) -> dict:
        entry = self.data["parts"].setdefault(name, {"status": "running", "results": []})
        entry.update(fields)
        self.write()
        return entry

    def write(self) -> None:
        (self.out / "gpu_kit.json").write_text(json.dumps(self.data, indent=1))
        from _kit_tables import markdown

        (self.out / "gpu_kit.md").write_text(markdown(self.data))


def run_part(name: str, command: list[str], limit_s: float, report: Report, log: Path) -> int:
    """Runs ``command`` in its own process group, each ``KIT-RESULT`` line into the report as it
    comes; the whole group is killed at ``limit_s``. Returns the exit code (124: stopped)."""
    entry = report.part(name, command=" ".join(Path(c).name if i < 2 else c for i, c in enumerate(command)),
                        limit_s=round(limit_s))
    start = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("w") as sink:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
                                 env=env, start_new_session=True)
        timer = _killer(child, limit_s)
        tail: deque[str] = deque(maxlen=30)
        for line in child.stdout:
            sink.write(line)
            sink.flush()
            if line.startswith("KIT-RESULT "):
                entry["results"].append(json.loads(line[len("KIT-RESULT "):]))
                report.write()
            elif "USDT:" not in line and "it/s]" not in line and "s/it]" not in line:  # profiler notes, bars
                tail.append(line.rstrip())
                print(f"[{name}] {line.rstrip()}", flush=True)
        code = child.wait()
        timer.cancel()
    code = 124 if getattr(child, "killed", False) else code
    _kill_group(child)  # a grandchild that kept running after its parent exited
    report.part(name, status="ok" if code == 0 else ("stopped at its limit" if code == 124 else f"failed ({code})"),
                seconds=round(time.monotonic() - start, 1), tail=list(tail))
    return code


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _killer(child: subprocess.Popen, limit_s: float):
    import threading

    def stop():
        child.killed = True
        try:
            os.killpg(child.pid, signal.SIGTERM)
            time.sleep(5)
        except ProcessLookupError:
            return
        _kill_group(child)

    timer = threading.Timer(max(limit_s, 1), stop)
    timer.daemon = True
    timer.start()
    return timer


def check_packages(toy: bool, parts: list[str]) -> list[str]:
    """Modules the parts need that do not import here, each with its error."""
    missing = []
    extra = tuple(m for part in parts for m in NEEDED_BY.get(part, ()))
    for module in NEEDED + extra + (() if toy else tuple(GPU_IMPORTS)):
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - a broken install is as missing as an absent one
            missing.append(f"{module} ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
    return missing


def environment() -> dict:
    import torch

    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": platform.python_version(),
           "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.machine()})"}
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("torch", "triton", "transformers", "deepspeed", "liger-kernel", "cut-cross-entropy", "flash-attn",
                 "numpy", "pyarrow", "pandas", "datasets", "accelerate", "peft"):
        try:  # the installed distribution's version (a module need not say its own)
            env[dist] = version(dist)
        except PackageNotFoundError:
            env[dist] = "not installed"
    if torch.cuda.is_available():
        env["cuda"] = torch.version.cuda
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2 ** 30, 1)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", type=int, choices=sorted(PARTS), help="one half (default: both)")
    parser.add_argument("--only", nargs="+", choices=[p for parts in PARTS.values() for p in parts])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO_ROOT / "runs" / "gpu_kit"))
    parser.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "llava-norm-gpu-kit"))
    parser.add_argument("--deadline-s", type=float, default=None, help=f"overall (default {DEADLINE_S} s a half)")
    parser.add_argument("--train-runs", nargs="+", choices=[run.name for run in TRAIN_RUNS],
                        help="the train part's runs (default: all but the compiled and the fused-loss 3B runs)")
    parser.add_argument("--train-overrides", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config overrides for every trainer run (as llava-norm train takes them)")
    parser.add_argument("--toy", action="store_true", help="tiny shapes on CPU: a smoke run of every part")
    args = parser.parse_args()
    start = time.monotonic()
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(name, "1")  # backbones are written locally; a hub call would only wait
    parts = args.only or [p for n in ([args.part] if args.part else sorted(PARTS)) for p in PARTS[n]]
    missing = check_packages(args.toy, parts)
    if missing:
        sys.exit("gpu_kit: missing packages, nothing run: " + "; ".join(missing) +
                 " (carry them as wheels: bash bench/gpu_kit_wheels.sh, then name .whl in the device call's carry)")
    import torch

    if not args.toy and not torch.cuda.is_available():
        parser.error("no CUDA device (use --toy for the CPU smoke run)")
    deadline = start + (args.deadline_s or DEADLINE_S * (1 if args.part or args.only else len(PARTS)))
    out, work = Path(args.out), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    report = Report(out, {"kit": "bench/gpu_kit.py" + (" --toy" if args.toy else ""), "parts_asked": parts,
                          "environment": environment()})
    failed = []
    for name in parts:
        left = deadline - time.monotonic()
        if left < 20:
            report.part(name, status="not run: the deadline came first")
            failed.append(name)
            continue
        limit = min(LIMITS_S[name], left)
        if name == "train":
            code = run_train(report, work, out, limit, args.toy, args.train_runs, args.train_overrides)
        else:
            command = loss_command(args.toy) if name == "fused_loss" else step_command(name, args.toy)
            code = run_part(name, command, limit, report, out / f"{name}.log")
        if code:
            failed.append(name)
    print(f"results: {out / 'gpu_kit.md'}" + (f"; not ok: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


def run_train(report: Report, work: Path, out: Path, limit_s: float, toy: bool, names: list[str] | None,
              overrides: list[str]) -> int:
    """Each trainer run of TRAIN_RUNS in turn, inside the part's limit; the plan beside each peak."""
    end, codes = time.monotonic() + limit_s, []
    entry = report.part("train", command="llava-norm train (see runs)")
    runs = [run for run in TRAIN_RUNS if (run.name in names if names else run.default)]
    for run in (runs[:1] if toy else runs):
        left = end - time.monotonic()
        if left < 30:
            entry["results"].append({"run": run.name, "error": "not run: the part's limit came first"})
            codes.append(124)
            continue
        config, skip = train_setup(run, work, toy, tuple(overrides))
        if skip:
            entry["results"].append({"run": run.name, "skipped": skip})
            report.write()
            continue
        left = end - time.monotonic()  # once the backbones are written (minutes at the 7B): no more
        if left < 30:
            entry["results"].append({"run": run.name, "error": "not run: its backbones took the part's time"})
            codes.append(124)
            continue
        sub = f"train_{run.name}"
        # the run's log comes back with the report: a run cut short says where its time went
        launched = time.time()
        code = run_part(sub, [sys.executable, "-m", "llava_norm.cli", "train", str(config), *overrides], left,
                        report, out / f"{sub}.log")
        figures = figures_after(run, config, code, tuple(overrides), launched)
        entry["results"].append({"run": run.name, **figures})
        report.data["parts"].pop(sub, None)
        report.write()
        finished = code == 0 or "note" in figures
        codes.append((1 if figures.get("error") else 0) if finished else code)
    report.part("train", status="ok" if not any(codes) else "failed", seconds=round(limit_s - (end - time.monotonic())))
    return max(codes, default=0)


if __name__ == "__main__":
    main()
