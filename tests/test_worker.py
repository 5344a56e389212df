"""A process's start-up rule (``llava_norm.worker.frozen_imports``); how a launched worker leaves
is tested in test_training.py."""

import gc
import weakref

from llava_norm.worker import frozen_imports


class Node:
    def __init__(self):
        self.other = self


def test_imports_are_frozen_and_the_garbage_made_after_them_is_still_collected():
    frozen_before = gc.get_freeze_count()
    try:
        with frozen_imports():
            assert not gc.isenabled()  # no collector pass while the libraries import
            built = Node()  # what an import builds
        assert gc.isenabled()
        assert gc.get_freeze_count() > frozen_before
        assert not any(o is built for o in gc.get_objects())  # out of the collector's sight

        later = Node()  # a reference cycle the work makes: only the collector can free it
        freed = []
        weakref.finalize(later, freed.append, True)
        del later
        gc.collect()
        assert freed == [True]
    finally:
        if not frozen_before:  # this test process goes on as before (the suite's conftest freezes too)
            gc.unfreeze()


def test_the_collector_stays_off_if_it_was_off():
    frozen_before = gc.get_freeze_count()
    gc.disable()
    try:
        with frozen_imports():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        if not frozen_before:
            gc.unfreeze()
