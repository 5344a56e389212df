"""Shared fixtures: the tiny backbones are built once per test session."""

import pytest

from llava_norm_demo.tiny import make_tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    make_tiny(out, seed=0)
    return out
