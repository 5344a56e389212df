"""A process's start-up rules (``llava_norm.worker``: frozen imports, one scan of transformers'
model folders); how a launched worker leaves is tested in test_training.py."""

import gc
import json
import os
import weakref
from pathlib import Path
from types import SimpleNamespace

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


def test_the_command_line_has_transformers_scan_its_model_folders_once_with_the_same_tables(tmp_path):
    """``llava-norm`` (cli.main) installs ``one_scan_of_transformers_models`` before anything
    loads: transformers' scan then runs once per folder under transformers/models, not twice (with
    a store of scans, the top folder's second key, its __init__.py, takes the first's result; with
    none, the top folder alone is read twice), the next process with the same store scans none,
    and transformers' lazy tables are exactly those of a process without the rule."""
    import transformers

    env = {**os.environ, "PYTHONHASHSEED": "0", "LLAVA_NORM_SCAN_STORE": str(tmp_path / "store")}
    plain = printed_by_fresh_interpreter(SCAN_PROBE.format(start=""), env)
    ours_start = SCAN_PROBE.format(
        start="from llava_norm.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
              "    try:\n        main(['--help'])\n    except SystemExit:\n        pass")
    ours, again = (printed_by_fresh_interpreter(ours_start, env) for _ in range(2))
    models = Path(transformers.__file__).parent / "models"
    folders = sum(1 for _, dirs, _ in os.walk(models) for d in dirs if d != "__pycache__")
    tables = json.loads(ours[1])
    assert len(tables["transformers.models"]["_modules"]) > folders and "LlamaForCausalLM" in ours[1]  # read in full
    assert ours[1] == again[1] == plain[1]
    assert (int(ours[0]), int(again[0])) == (folders + 1, 0), (ours[0], again[0], folders)
    # with no store (an empty LLAVA_NORM_SCAN_STORE keeps none), the unbounded cache alone: each model
    # folder once, the top one under both its keys (folder and __init__.py; the store maps them to one)
    bare = printed_by_fresh_interpreter(ours_start, {**env, "LLAVA_NORM_SCAN_STORE": ""})
    assert bare[1] == plain[1]
    assert int(bare[0]) == folders + 2, (bare[0], folders)
    # transformers' own behaviour, which the rule exists for: should a release scan once by
    # itself, this fails and the rule can go
    assert int(plain[0]) >= 2 * folders, (plain[0], folders)


def _tree(root: Path) -> Path:
    (root / "pkg" / "inner").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("__all__ = ['A']\n")
    (root / "pkg" / "inner" / "b.py").write_text("__all__ = ['B']\n")
    return root / "pkg"


def _reading_scan(calls: list, module):
    """A stand-in for transformers' scan: each folder's modules and their __all__, nested; it
    reaches the folders inside through ``module.scan``, as transformers' through its module's name."""
    import functools

    @functools.lru_cache(maxsize=None)
    def scan(path):
        calls.append(str(path))
        out = {}
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if entry.is_dir():
                out[entry.name] = module.scan(entry.path)
            else:
                names = Path(entry.path).read_text().split("'")[1::2]
                out.setdefault(frozenset({"torch"} if entry.name.startswith("b") else ()), {})[entry.name] = set(names)
        return out

    return scan


def test_a_stored_scan_is_used_only_while_every_file_under_its_folder_is_as_it_was(tmp_path):
    from llava_norm.worker import StoredScan

    folder, store, calls = _tree(tmp_path), tmp_path / "store", []
    source = tmp_path / "import_utils.py"
    source.write_text("# the scan's own source")

    def process(where=store):  # what a new process builds: its own function, the store on disk
        module = SimpleNamespace()
        module.scan = StoredScan(_reading_scan(calls, module), str(source), where)
        return module.scan

    expected = {frozenset(): {"a.py": {"A"}}, "inner": {frozenset({"torch"}): {"b.py": {"B"}}}}
    assert process()(folder) == expected and calls == [str(folder), str(folder / "inner")]
    assert len(list(store.glob("*.json"))) == 1  # the folder inside went to the scan itself, not to a store of its own
    calls.clear()
    second = process()
    assert second(folder) == expected and second(str(folder / "a.py")) == expected and calls == []  # read back
    assert second(folder) is not second(folder)  # new objects each call, as a computation gives
    (folder / "inner" / "new.py").write_text("__all__ = ['N']\n")  # a file added deep in the tree
    assert process()(folder)["inner"][frozenset()] == {"new.py": {"N"}} and calls
    calls.clear()
    # a file deep in the tree changed to one of the same size: only its modification time tells
    inner = folder / "inner" / "b.py"
    stat = inner.stat()
    inner.write_text("__all__ = ['C']\n")
    os.utime(inner, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert inner.stat().st_size == stat.st_size and process()(folder)["inner"][frozenset({"torch"})] == {"b.py": {"C"}}
    calls.clear()
    changed = {frozenset({"torch"}): {"b.py": {"B", "C"}}}
    inner.write_text("__all__ = ['B', 'C']\n")
    assert process()(folder)["inner"][frozenset({"torch"})] == changed[frozenset({"torch"})] and calls
    calls.clear()
    (folder / "inner" / "new.py").unlink()
    source.write_text("# another release of the scan")
    assert process()(folder)["inner"] == changed and calls == [str(folder), str(folder / "inner")]
    calls.clear()
    for edit in (lambda text: text.replace('"dict"', '"list"'),  # stores edited by hand, the signature kept
                 lambda text: text.replace('"frozenset": []', '"set": "ab"'),
                 lambda text: text.replace('{"set": ["A"]}', '{"set": [1]}'), lambda text: text.replace(
                     '"result": {"dict"', '"result": "x", "unused": {"dict"')):
        calls.clear()
        assert process()(folder)  # stores the scan again
        for kept in store.glob("*.json"):
            kept.write_text(edit(kept.read_text()))
        calls.clear()
        assert process()(folder)["inner"] == changed and calls, edit
    calls.clear()
    for kept in store.glob("*.json"):
        kept.write_text("{not json")
    assert process()(folder)["inner"] == changed and calls
    calls.clear()
    blocked = tmp_path / "a-file"  # a store folder that cannot be made: computed every time, no error
    blocked.write_text("")
    assert process(blocked / "store")(folder)["inner"] == changed and calls


def test_a_scan_during_which_a_file_changed_is_not_stored(tmp_path):
    """The result of a scan that read a file while it was being replaced may hold either version:
    it is returned, not stored, so the next process scans again."""
    from llava_norm.worker import StoredScan

    folder, store, calls = _tree(tmp_path), tmp_path / "store", []
    source = tmp_path / "import_utils.py"
    source.write_text("# the scan's own source")
    module = SimpleNamespace()
    reading = _reading_scan(calls, module)

    def scan_then_upgrade(path):
        result = reading(path)
        (folder / "inner" / "b.py").write_text("__all__ = ['B', 'D']\n")  # an install mid-scan
        return result

    scan_then_upgrade.cache_info = reading.cache_info
    module.scan = StoredScan(scan_then_upgrade, str(source), store)
    assert module.scan(folder)["inner"] == {frozenset({"torch"}): {"b.py": {"B"}}}
    assert not list(store.glob("*.json"))


SECOND_SIGTERM = """
import os, signal, sys, time
from llava_norm.worker import Terminated, stop_on_sigterm
stop_on_sigterm()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
except Terminated:
    print("first: said", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # while the first is still being handled
    time.sleep(30)
    print("second: survived", flush=True)
"""


def test_a_second_sigterm_ends_the_process_at_once():
    """The first SIGTERM is raised where Ctrl-C is (the subcommand says where it stands); a second,
    while that is said, ends the process as Python's default does."""
    import signal
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SECOND_SIGTERM], capture_output=True, text=True, timeout=60)
    assert done.stdout == "first: said\n" and done.returncode == -signal.SIGTERM, (done.stdout, done.stderr)
