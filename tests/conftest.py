"""Shared fixtures: the tiny backbones are built once per test session.

The session's data indexes (``llava_norm.data.index``) go to a ``datasets`` cache of its own,
so no test reuses an index a developer's earlier runs left behind; launched runs inherit it.
"""

import atexit
import os
import shutil
import tempfile

import pytest

os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="llava-norm-datasets-")
# One intra-op thread per test process and per launched run (tests/launch.py sets it too):
# several pytest-xdist workers share two cores, and OpenMP threads that outnumber the cores
# spin while they wait for each other.
os.environ.setdefault("OMP_NUM_THREADS", "1")
atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], ignore_errors=True)

from llava_norm_demo.tiny import make_tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    make_tiny(out, seed=0)
    return out


# The suite runs under pytest-xdist (`make test`: `-n 3 --dist loadgroup`). A module's tests go
# to one worker together, so its module-scoped fixtures (a shared pipeline run, a sweep) are
# built once; the modules below hold independent launch-bound cases and are split across
# workers (test_resume groups the cases that share an uninterrupted reference run). The
# modules that launch training runs are sent first, longest first, so the run does not end
# with one worker still busy on a long module after the others have finished.
SPLIT = {"test_resume.py", "test_training.py", "test_config.py", "test_stats.py"}
FIRST = ["test_sweep.py", "test_resume.py", "test_pipeline.py", "test_demo.py", "test_training.py",
         "test_packed_training.py", "test_bench.py", "test_lora.py", "test_eval_runner.py", "test_plan.py"]


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        if name not in SPLIT and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(name))
    items.sort(key=lambda item: FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST))
