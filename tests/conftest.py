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
