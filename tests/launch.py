"""Launching real multi-process training runs from the tests (torchrun, CPU, gloo)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(config: Path, overrides: list[str], nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            f"--master_port={free_port()}", "-m", "llava_norm.cli", "train", str(config), *overrides]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def run_train(config: Path, overrides: list[str], nproc: int = 2, timeout: int = 300) -> dict:
    proc = subprocess.run(torchrun_command(config, overrides, nproc), cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"training failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    assert "shm_comm_op built" not in proc.stdout, "DeepSpeed compiled its CPU inference op (see run.py)"
    out = Path(next(o.split("=", 1)[1] for o in overrides if o.startswith("train.output_dir=")))
    return json.loads((out / "train_summary.json").read_text())


def step_losses(summary: dict) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in summary["log_history"] if "loss" in e}


def kill_after_checkpoint(config: Path, overrides: list[str], step: int, timeout: int = 240) -> None:
    """Start a 2-process run, SIGKILL its whole process group once checkpoint-<step> is complete."""
    out = Path(next(o.split("=", 1)[1] for o in overrides if o.startswith("train.output_dir=")))
    proc = subprocess.Popen(torchrun_command(config, overrides), cwd=REPO, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + timeout
    while not (out / f"checkpoint-{step}" / "checkpoint_complete").exists():
        assert proc.poll() is None and time.time() < deadline, f"run ended before its checkpoint-{step}"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "train_summary.json").exists(), "the run finished before it was killed"
