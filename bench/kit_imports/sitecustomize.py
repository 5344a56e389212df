"""Records the top-level modules each Python process imports, for tests/test_bench.py's check that
the GPU kit imports nothing the GPU machine lacks (bench/gpu_machine_packages.txt) and the kit does
not carry (bench/gpu_kit_wheels.txt). Active only with KIT_RECORD_IMPORTS=DIR on PYTHONPATH's
first folder; each process writes DIR/<pid>.txt at exit."""

import atexit
import os
import sys


def _write(folder: str) -> None:
    names = sorted({name.split(".")[0] for name in list(sys.modules)})
    with open(os.path.join(folder, f"{os.getpid()}.txt"), "w") as handle:
        handle.write("\n".join(names))


if os.environ.get("KIT_RECORD_IMPORTS"):
    atexit.register(_write, os.environ["KIT_RECORD_IMPORTS"])
