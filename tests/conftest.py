"""Shared fixtures: the tiny backbones are built once per test session.

The session's data indexes (``llava_norm.data.index``) go to a ``datasets`` cache of its own,
so no test reuses an index a developer's earlier runs left behind; launched runs inherit it.
"""

import atexit
import gc
import os
import shutil
import tempfile

import pytest

# Collection imports torch, transformers and the test modules with the cyclic collector off: its
# passes over that growing heap took about a third of each worker's collection; the heap is frozen
# and the collector turned back on when collection ends (pytest_collection).
gc.disable()
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="llava-norm-datasets-")
# One intra-op thread per test process and per launched run (tests/launch.py sets it too):
# several pytest-xdist workers share two cores, and OpenMP threads that outnumber the cores
# spin while they wait for each other.
os.environ.setdefault("OMP_NUM_THREADS", "1")
atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], ignore_errors=True)
# transformers' stored scans (llava_norm.worker.StoredScan) in a store of the test run's own,
# made by pytest's first process and inherited by its workers and every launch: no test reads a
# store an earlier run, or the user's own runs, left.
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ["LLAVA_NORM_SCAN_STORE"] = tempfile.mkdtemp(prefix="llava-norm-scans-")
    atexit.register(shutil.rmtree, os.environ["LLAVA_NORM_SCAN_STORE"], ignore_errors=True)

from llava_norm_demo.tiny import make_tiny

# pytest-xdist hands out whole modules (--dist loadfile), in collection order under
# --no-loadscope-reorder (the Makefile's test target). The modules that take longest go first, so
# that none of them starts near the end and runs on alone while the other cores idle; the
# in-process modules then fill in. The demo and the pipeline lead: each is one chain of launches
# that cannot use both cores, however long it waits for them. Then by CPU time, launches included.
LONGEST_FIRST = ("test_demo.py", "test_pipeline.py", "test_resume.py", "test_sweep.py", "test_training.py",
                 "test_resume_ddp_one_process.py", "test_bench.py", "test_world_size.py", "test_slurm.py",
                 "test_packed_training.py", "test_lora.py", "test_run_logs.py", "test_eval_runner.py", "test_plan.py",
                 "test_docs.py", "test_check.py")


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    # What collection imported (torch, transformers, ...) lives as long as this process: frozen, the
    # collector's passes during the tests no longer walk it (llava_norm.worker.frozen_imports). Also
    # in pytest-xdist's controller, which collects nothing itself.
    try:
        return (yield)
    finally:
        gc.freeze()
        gc.enable()


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a module's own order is kept


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    make_tiny(out, seed=0)
    return out


class UnhandledSigterm(Exception):
    """What a SIGTERM raises in a test that expected the code under test to handle it."""


@pytest.fixture
def sigterm_to_self():
    """Send this process SIGTERM from a thread, once ``when()`` is true: the code under test is to
    have installed its own handler by then. Until it does, and after the test, SIGTERM raises
    UnhandledSigterm here, never the default that would end the pytest worker."""
    import signal
    import threading

    def unhandled(signum, frame):
        raise UnhandledSigterm("SIGTERM reached a handler the code under test did not install")

    before = signal.signal(signal.SIGTERM, unhandled)
    over = threading.Event()  # the test ended: a signal not yet sent is not sent
    threads = []

    def send(when=lambda: True):
        def fire():
            while not when():
                if over.wait(0.05):
                    return
            os.kill(os.getpid(), signal.SIGTERM)

        threads.append(threading.Thread(target=fire, daemon=True))
        threads[-1].start()

    yield send
    over.set()
    for thread in threads:
        thread.join()
    signal.signal(signal.SIGTERM, before)
