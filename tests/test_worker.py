"""A process's start-up rules (``llava_norm.worker``: frozen imports, one scan of transformers'
model folders); how a launched worker leaves is tested in test_training.py."""

import gc
import json
import os
import weakref
from pathlib import Path

from test_layers import printed_by_fresh_interpreter

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


# A fresh interpreter's view of transformers' lazy import tables after loading transformers.models
# (each table in a canonical order: sets and dicts sorted, recursively), and how many times the
# folder scan ran its body. {start} is what the process does first.
SCAN_PROBE = """
import contextlib, io, json, sys
{start}
import transformers.models
from transformers.utils import import_utils

def canonical(value):
    if isinstance(value, dict):
        return sorted(([canonical(k), canonical(v)] for k, v in value.items()), key=json.dumps)
    if isinstance(value, (set, frozenset, list, tuple)):
        return sorted((canonical(v) for v in value), key=json.dumps)
    return repr(value)

tables = {{module: {{name: canonical(getattr(sys.modules[module], name)) for name in
                    ("_modules", "_class_to_module", "_object_missing_backend", "__all__")}}
          for module in ("transformers", "transformers.models")}}
print(import_utils.create_import_structure_from_path.cache_info().misses)
print(json.dumps(tables))
"""


def test_the_command_line_has_transformers_scan_its_model_folders_once_with_the_same_tables():
    """``llava-norm`` (cli.main) installs ``one_scan_of_transformers_models`` before anything
    loads: transformers' scan then runs once per folder under transformers/models, not twice (the
    top folder runs under each of the two keys it is given: the folder, then its __init__.py), and
    transformers' lazy tables are exactly those of a process without it."""
    import transformers

    env = {**os.environ, "PYTHONHASHSEED": "0"}
    plain = printed_by_fresh_interpreter(SCAN_PROBE.format(start=""), env)
    ours = printed_by_fresh_interpreter(SCAN_PROBE.format(
        start="from llava_norm.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
              "    try:\n        main(['--help'])\n    except SystemExit:\n        pass"), env)
    models = Path(transformers.__file__).parent / "models"
    folders = sum(1 for _, dirs, _ in os.walk(models) for d in dirs if d != "__pycache__")
    tables = json.loads(ours[1])
    assert len(tables["transformers.models"]["_modules"]) > folders and "LlamaForCausalLM" in ours[1]  # read in full
    assert ours[1] == plain[1]
    assert int(ours[0]) == folders + 2, (ours[0], plain[0], folders)
    # transformers' own behaviour, which the rule exists for: should a release scan once by
    # itself, this fails and the rule can go
    assert int(plain[0]) >= 2 * folders, (plain[0], folders)
