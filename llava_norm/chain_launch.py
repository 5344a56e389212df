"""One launch of a chain's step (``llava_norm.pipeline``): a launch script run from the
repository root, on every node of a multi-node Slurm allocation, its output to the step's log;
on failure, the part of the log that says why; stopped, the time to say where it stands.

Owns running one launch; what runs, and when, is the pipeline's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path

from llava_norm.layout import CHAIN_LAUNCH
from llava_norm.worker import Terminated

REPO = Path(__file__).resolve().parents[1]
MISSING_PATH = re.compile(r"(?:does not exist|not found): (\S+)")  # how the checks name a missing path


def relative_paths_hint(problems: list[str], where: Path) -> str | None:
    """For problems naming a missing relative path, found by a command run outside the checkout:
    it read them where it runs, while the launch scripts read them from the checkout (the shipped
    configs' paths are the checkout's). None otherwise."""
    missing = [m.group(1) for problem in problems for m in [MISSING_PATH.search(problem)] if m]
    if not any(not Path(path).is_absolute() for path in missing) or where.resolve() == REPO.resolve():
        return None
    return (f"relative paths were read from {where.resolve()}, where this command runs; each launch reads them from "
            f"the checkout, {REPO} (scripts/_launch.sh): run the command from there")


def on_every_node(command: list[str], environment: dict[str, str]) -> list[str]:
    """``command`` as one task on each node of a multi-node Slurm allocation (``srun``, with
    NODE_RANK from Slurm), or as it is: the pipeline itself runs on the first node only, and each
    launch spans the job's nodes."""
    nodes = int(environment.get("NNODES") or environment.get("SLURM_NNODES") or 1)
    if nodes == 1 or "SLURM_JOB_ID" not in environment:
        return command
    return ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash", "-c",
            'NODE_RANK="$SLURM_NODEID" exec "$@"', "_", *command]


def launch(command: list[str], log: Path | None, env: dict | None = None) -> None:
    """Run a launch script from the repo root; on failure, show this launch's part of the log
    (``failure_report``; streamed: the output above) and stop with the step's one-line error."""
    environment_vars = {**os.environ, "PYTHON": sys.executable, CHAIN_LAUNCH: "1", **(env or {})}
    command = on_every_node(command, environment_vars)
    if log is None:
        code = _wait(subprocess.Popen(command, cwd=REPO, env=environment_vars))
        if code != 0:
            raise RuntimeError(f"step failed (exit {code}): {' '.join(command)} (its output is above)")
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:  # binary: tell() is then a byte offset
        handle.write(f"\n$ {' '.join(command)}\n".encode())
        handle.flush()
        start = handle.tell()
        code = _wait(subprocess.Popen(command, cwd=REPO, env=environment_vars, stdout=handle, stderr=subprocess.STDOUT))
    if code != 0:
        raise RuntimeError(f"step failed (exit {code}): {' '.join(command)}\n{failure_report(log, start)}")


STOP_GRACE_S = 60  # torchrun gives its workers 30 s after its SIGTERM before it kills them


def _wait(launched: subprocess.Popen) -> int:
    """The launch's exit status. Stopped while it runs, the chain lets it stop first: SIGTERM
    (sent to the chain alone, say by ``kill``) is passed on, Ctrl-C reached it from the terminal.
    Why: killed at once, as ``subprocess.run`` does, torchrun's workers would die with it before
    saying which checkpoint the rerun resumes from; a second Ctrl-C kills it."""
    try:
        return launched.wait()
    except KeyboardInterrupt as stop:
        if isinstance(stop, Terminated):
            launched.send_signal(signal.SIGTERM)
        try:
            launched.wait(timeout=STOP_GRACE_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            launched.kill()
            launched.wait()
        raise


TAIL_LINES = 40
ERROR_LINES = 10  # the first and the last this many distinct ones: the first are the likeliest cause
NAMES_AN_ERROR = re.compile(r"(?i:\berror\b|\brefused\b)|(Error|Exception)\b")  # "data error:", "ValueError"


def failure_report(log: Path, start: int) -> str:
    """What a failed launch wrote to ``log`` from byte ``start``: its last lines, and before them
    the distinct lines that name an error. Why: under torchrun the workers' one-line errors (a bad
    row, a refused relaunch) come before the agent's report of the failed workers, which can fill
    the tail alone. Earlier launches' lines in the same log are left out; a line a progress bar
    rewrote (carriage returns) is shown as a terminal would show it."""
    tail, named = deque(maxlen=TAIL_LINES), {}
    with open(log, "rb") as handle:
        handle.seek(start if start <= log.stat().st_size else 0)
        for raw in handle:
            line = raw.decode(errors="replace").rstrip("\r\n").rsplit("\r", 1)[-1][:300]
            if len(tail) == TAIL_LINES and NAMES_AN_ERROR.search(tail[0]):
                named.setdefault(tail[0], None)  # it leaves the tail: kept once, in first-seen order
            tail.append(line)
    kept = list(named)
    if len(kept) > 2 * ERROR_LINES:
        kept = [*kept[:ERROR_LINES], f"... ({len(kept) - 2 * ERROR_LINES} more)", *kept[-ERROR_LINES:]]
    header = f"--- lines naming an error, above the last {TAIL_LINES} ---"
    report = "".join(f"{line}\n" for line in [header, *kept]) if kept else ""
    return report + "".join(f"{line}\n" for line in [f"--- last lines of {log} ---", *tail])
