"""Exact resume after a SIGKILL with plain DDP under torchrun, and in one process started without
torchrun (DeepSpeed included), with bad rows and parquet shards (the cases: resumecases.py; the
others are in test_resume.py: a module each, so the two run side by side under pytest-xdist)."""

import pytest

from resumecases import DDP_OR_ONE_PROCESS, killed_run_resumes_exactly, reference_store

# the uninterrupted runs, built once per module
references_fixture = pytest.fixture(scope="module", name="references")(reference_store)


@pytest.mark.parametrize("case", DDP_OR_ONE_PROCESS)
def test_killed_run_resumes_exactly(tmp_path, tiny_dir, references, case):
    killed_run_resumes_exactly(tmp_path, tiny_dir, references, case)
