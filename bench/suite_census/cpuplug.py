"""A pytest plugin: each test's wall time and CPU time, its own and its reaped launches'.

With this folder on PYTHONPATH, ``-p cpuplug`` and CPUPLUG_LOG set, every test appends one JSON
line (node id, start, wall seconds, the worker's own CPU seconds and those of the child
processes it reaped during the test). Processes a test killed and never reaped are not counted.
"""

import json
import os
import resource
import time

import pytest


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, (own, children) = time.time(), _cpu()
    try:
        return (yield)
    finally:
        own_after, children_after = _cpu()
        with open(os.environ["CPUPLUG_LOG"], "a") as log:
            log.write(json.dumps({"id": item.nodeid, "start": start, "wall": time.time() - start,
                                  "own": own_after - own, "children": children_after - children,
                                  "worker": os.environ.get("PYTEST_XDIST_WORKER")}) + "\n")
