"""A census of the suite's Python processes: put this folder on PYTHONPATH and set CENSUS_LOG.

Every Python process then appends one JSON line to CENSUS_LOG as it starts (its command and the
test it ran under, from PYTEST_CURRENT_TEST, which launches inherit) and one as it exits, with
its CPU time. A process killed by SIGKILL writes only the first. Summarise with summary.py.
It replaces any other sitecustomize (Debian's among them) for those processes; bench/README.md
has the command. A test that sets its own PYTHONPATH first (test_bench's kit run) hides it.
"""

import atexit
import json
import os
import resource
import sys

_LOG = os.environ.get("CENSUS_LOG")


def _write(kind: str) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = {"kind": kind, "pid": os.getpid(), "command": sys.orig_argv[:8],
            "test": os.environ.get("PYTEST_CURRENT_TEST", ""), "cpu": usage.ru_utime + usage.ru_stime}
    try:
        with open(_LOG, "a") as log:
            log.write(json.dumps(line) + "\n")
    except OSError:  # a census must never fail the process it counts
        pass


if _LOG:
    _write("start")
    atexit.register(_write, "exit")
