"""Launching real multi-process training runs from the tests (torchrun, CPU, gloo)."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(config: Path, overrides: list[str], nproc: int = 2) -> list[str]:
    # --standalone: torchrun binds a free port itself; a port picked here could be taken (by another
    # test's connections) before torchrun binds it, under pytest-xdist
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "llava_norm.cli", "train", str(config), *overrides]


# Set in this process by an in-process run that used W&B (wandb's service address; our run's id):
# a launch inheriting them would share that service, where a killed launch's run stays "in use".
WANDB_PROCESS_STATE = ("WANDB_SERVICE", "WANDB_RUN_ID", "WANDB_RESUME")


def env() -> dict:
    """The environment of a launch: a fresh job's, as on a cluster."""
    inherited = {k: v for k, v in os.environ.items() if k not in WANDB_PROCESS_STATE}
    return {**inherited, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def run_train(config: Path, overrides: list[str], nproc: int = 2, timeout: int = 300) -> dict:
    """A torchrun launch of ``llava-norm train``; the run's summary."""
    return run_launches([(torchrun_command(config, overrides, nproc), env())], output_dir(overrides), timeout)


def step_losses(summary: dict) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in summary["log_history"] if "loss" in e}


# What a log entry measures in time: the one part of a run's summary a relaunch cannot repeat.
TIMING = {"tokens_per_second", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def summary_figures(summary: dict) -> dict:
    """A run's summary without what says how it was launched (the launches, their timings): what an
    interrupted run must end with exactly as an uninterrupted one."""
    return {**{k: v for k, v in summary.items() if k not in ("resumed_from", "steps_this_launch", "log_history",
                                                              "data_index_builds", "data_index_built_by")},
            "log_history": [{k: v for k, v in e.items() if k not in TIMING} for e in summary["log_history"]]}


def script_command(script: str, config: Path, overrides: list[str]) -> list[str]:
    """scripts/pretrain.sh or finetune.sh, as a user runs them (GPUS_PER_NODE etc. in the env)."""
    return ["bash", str(REPO / "scripts" / script), str(config), *overrides]


def output_dir(overrides: list[str]) -> Path:
    return Path(next(o.split("=", 1)[1] for o in overrides if o.startswith("train.output_dir=")))


def run_launches(launches: list[tuple[list[str], dict]], out: Path, timeout: int = 300, return_output: bool = False):
    """Run launchers side by side (e.g. two torchrun agents as two nodes); the run's summary
    (or, with ``return_output``, what they printed). Output goes to files, not pipes: a full pipe
    would stall one agent while the other waits for it in a collective."""
    logs = [tempfile.TemporaryFile(mode="w+") for _ in launches]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=e, stdout=log, stderr=subprocess.STDOUT, text=True)
             for (cmd, e), log in zip(launches, logs)]
    for p in procs:
        p.wait(timeout=timeout)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    for p, text in zip(procs, outputs):
        if p.returncode != 0:
            raise AssertionError(f"launch failed ({p.returncode}):\n{text[-6000:]}")
        assert "shm_comm_op built" not in text, "DeepSpeed compiled its CPU inference op (see run.py)"
        assert "all_gather_into_tensor` is deprecated" not in text, "ZeRO's gather warning printed (deepspeed_setup.py)"
        # a fused loss asked to compile its softmax that fell back to the eager blocks
        assert "the softmax is not compiled" not in text, text[-3000:]
    if return_output:
        return "\n".join(outputs)
    summary = json.loads((out / "train_summary.json").read_text())
    # how many processes read a data source through rather than mapping its cached index (data.index)
    summary["data_index_builds"] = sum(len(re.findall(r"\[llava-norm\] data index \(rank (\d+)\)", text)) for text in outputs)
    summary["data_index_built_by"] = sorted({r for text in outputs for r in re.findall(r"data index \(rank (\d+)\)", text)})
    return summary


def processes_of(out: Path, among: list[int] | None = None, argument: str | None = None) -> list[int]:
    """Live processes (not zombies) whose command line names this output dir: the run's launchers and
    workers; of ``among`` only, when given (no scan of every process). ``argument``: those with
    that argument instead (an evaluation's ``--out`` folder)."""
    needle = (argument or f"train.output_dir={out}").encode()
    found = []
    for proc in (Path("/proc") / str(pid) for pid in among) if among is not None else Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "cmdline").read_bytes().split(b"\0") and \
                    (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def saved_as_is(checkpoint: Path) -> None:
    """The checkpoint's marker written again for the files it holds now, as if its save had left
    them so: for a test that stands in for another save (another world size's, a crafted file's)
    by editing one, where the resume would otherwise refuse it as changed since its save."""
    from llava_norm.train.rundir import COMPLETE_MARKER, checkpoint_manifest

    marker = checkpoint / COMPLETE_MARKER
    marker.write_text(checkpoint_manifest(checkpoint, json.loads(marker.read_text())["step"]))


def snapshot(out: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(out)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(out.rglob("*"))
            if p.is_file()}


def kill_at_checkpoint(launches: list[tuple[list[str], dict]], out: Path, step: int, timeout: int = 240) -> dict:
    """Start the launchers, each in its own process group, and SIGKILL every group once
    checkpoint-<step> is complete. Proves the kill: no process of the run survives it, no file in
    the output dir changes after it, and the run had not finished. Checkpoints the run wrote
    between the marker and the kill are removed, so the run stands killed right after
    checkpoint-<step>. Returns that checkpoint's data position (data_state.json)."""
    logs = [out.parent / f"{out.name}.launch{i}.log" for i in range(len(launches))]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=e, stdout=log.open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True) for (cmd, e), log in zip(launches, logs)]
    deadline = time.time() + timeout
    marker = out / f"checkpoint-{step}" / "checkpoint_complete"
    # the run's processes, found while it runs (the check after the kill below would pass vacuously
    # otherwise) and looked up before the marker: the kill itself scans nothing, so a test process
    # short of CPU does not give a run one step from its end the time to finish
    known, looked = [], 0.0
    while not marker.exists():
        if not all(p.poll() is None for p in procs) or time.time() >= deadline:
            tails = "\n".join(log.read_text()[-3000:] for log in logs)
            raise AssertionError(f"run ended before checkpoint-{step} (or {timeout} s passed); its output:\n{tails}")
        if time.time() - looked > 0.5:
            known, looked = processes_of(out) or known, time.time()
        time.sleep(0.02)
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)  # the launchers' groups; torchrun's workers sit in sessions of their own
    for pid in processes_of(out, known):  # the workers, at once rather than by their parent's death
        os.kill(pid, signal.SIGKILL)
    assert known, "no process of the run found by its output dir while it ran"
    for p in procs:
        p.wait()
    time.sleep(0.25)  # the parent-death SIGKILL lands at once; a survivor would still be training
    assert not processes_of(out), f"processes outlived the kill: {processes_of(out)}"
    before = snapshot(out)
    time.sleep(1.0)
    assert snapshot(out) == before, "files changed after the kill"
    assert not (out / "train_summary.json").exists(), "the run finished before it was killed"
    for later in out.glob("checkpoint-*"):
        if int(later.name.split("-")[1]) > step:
            shutil.rmtree(later)
    return json.loads((out / f"checkpoint-{step}" / "data_state.json").read_text())


STOPPER = Path(__file__).resolve().parent / "stopper"  # sitecustomize.py: stops a launch inside a checkpoint write


def stopping_env(environment: dict, where: str, flag: Path) -> dict:
    """``environment`` for a launch that stops itself at ``where`` (``checkpoint-N:PHASE``, or
    ``model:early`` for the final model's write; tests/stopper/sitecustomize.py) and says so in ``flag``."""
    path = os.pathsep.join(p for p in (str(STOPPER), environment.get("PYTHONPATH", "")) if p)
    return {**environment, "PYTHONPATH": path, "LLAVA_TEST_STOP_AT": where, "LLAVA_TEST_STOP_FLAG": str(flag)}


def _kill_when_stopped(launches: list[tuple[list[str], dict]], out: Path, where: str, timeout: int) -> tuple[str, str]:
    """Start the launchers with the stopper set at ``where`` and SIGKILL every process group once
    a process stopped there. Proves the kill as kill_at_checkpoint does. Returns (the file the
    write stopped in, what the launchers printed)."""
    flag = out.parent / f"{out.name}.stopped-{where.replace(':', '-')}"
    flag.unlink(missing_ok=True)
    logs = [tempfile.TemporaryFile(mode="w+") for _ in launches]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=stopping_env(e, where, flag), stdout=log,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for (cmd, e), log in zip(launches, logs)]
    deadline = time.time() + timeout
    while not flag.exists():
        if not all(p.poll() is None for p in procs) or time.time() >= deadline:
            tails = []
            for log in logs:
                log.seek(0)
                tails.append(log.read()[-3000:])
            raise AssertionError(f"the run ended before it stopped at {where} (or {timeout} s passed); its "
                                 "output:\n" + "\n".join(tails))
        time.sleep(0.02)
    assert processes_of(out), "no process of the run found by its output dir"  # as in kill_at_checkpoint
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()
    time.sleep(0.25)
    assert not processes_of(out), f"processes outlived the kill: {processes_of(out)}"
    before = snapshot(out)
    time.sleep(1.0)
    assert snapshot(out) == before, "files changed after the kill"
    assert not (out / "train_summary.json").exists(), \
        "train_summary.json is there: the run finished before it was killed, or put its summary in place unfinished"
    printed = ""
    for log in logs:
        log.seek(0)
        printed += log.read()
        log.close()
    return flag.read_text().split()[2], printed


def kill_during_save(launches: list[tuple[list[str], dict]], out: Path, step: int, phase: str,
                     timeout: int = 240) -> tuple[str, str]:
    """Start the launchers with the stopper set for ``phase`` of checkpoint-<step>'s write and
    SIGKILL every process group once a process stopped there (see _kill_when_stopped); proves
    that checkpoint-<step> was left incomplete."""
    stopped_in, printed = _kill_when_stopped(launches, out, f"checkpoint-{step}:{phase}", timeout)
    assert not (out / f"checkpoint-{step}" / "checkpoint_complete").exists(), \
        f"checkpoint-{step} was marked complete while a process was stopped inside its write"
    return stopped_in, printed


def kill_during_final_save(launches: list[tuple[list[str], dict]], out: Path, timeout: int = 240) -> tuple[str, str]:
    """Start the launchers and SIGKILL every process group once the final model's first weights
    file is half-written (see _kill_when_stopped): after the last checkpoint, before the summary."""
    return _kill_when_stopped(launches, out, "model:early", timeout)


def kill_during_summary_write(launches: list[tuple[list[str], dict]], out: Path, timeout: int = 240) -> tuple[str, str]:
    """Start the launchers and SIGKILL every process group once half the bytes of the run's
    summary are written, wherever the run writes them first (see _kill_when_stopped): its last act."""
    return _kill_when_stopped(launches, out, "summary:early", timeout)


def scheduled_rates(optim, warmup_steps: int, steps: int) -> dict[int, dict[str, float]]:
    """``{step: {"lr/<group>": rate}}``: each parameter group's rate for updates 1..``steps``
    under transformers' cosine schedule stepped on its own, what a run's logged ``lr/<group>``
    must be (``optim``: the run's OptimConfig)."""
    import torch  # lazy: the launch helpers above need neither
    from transformers import get_scheduler

    from llava_norm.train.params import learning_rates

    rates = learning_rates(optim)
    groups = [{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in rates.values()]
    schedule = get_scheduler("cosine", torch.optim.SGD(groups), num_warmup_steps=warmup_steps,
                             num_training_steps=steps)
    expected = {}
    for step in range(1, steps + 1):
        expected[step] = {f"lr/{name}": group["lr"] for name, group in zip(rates, schedule.optimizer.param_groups)}
        schedule.optimizer.step()
        schedule.step()
    return expected
