"""A ``llava-norm`` process's life: it starts without the collector walking its imports or
transformers scanning its model folders twice (or at all, where an earlier process stored the
scans and no file changed since), dies with its launcher, stops on SIGTERM as on Ctrl-C and
leaves without interpreter finalisation.

Owns the process-level rules; the command line applies them around each subcommand.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path


@contextlib.contextmanager
def frozen_imports():
    """Import a subcommand's libraries with the cyclic garbage collector off, then freeze them.

    Why: torch, transformers and DeepSpeed build about half a million objects at import, none
    of them garbage, and the collector's full passes over that growing heap took about a
    fifth of a training process's start-up; accelerate's ``gc.collect()`` at the start of
    training walked them all once more. Frozen (``gc.freeze``), they are out of the
    collector's sight for the process's life, and with the collector back on, the garbage
    the work itself makes is collected as before. ``gc.freeze`` takes every object then
    alive, the few cycles the imports left included: it is for a process's start-up, before
    its work (run in-process after other work, as by a test, it keeps that work's leftovers).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


# The module whose scan of transformers/models is cached, and the cached function in it.
SCAN_MODULE, SCAN_FUNCTION = "transformers.utils.import_utils", "create_import_structure_from_path"


class _WholeScanCache:
    """An import finder (``sys.meta_path``; not importlib.abc's class, whose import costs more than
    it does) that finds SCAN_MODULE as importlib would without it, and loads it through a loader
    that then gives SCAN_FUNCTION an unbounded cache. Asked again once that is done, it finds nothing."""

    def __init__(self):
        self.done = False
        self.looking = False

    def find_spec(self, name, path, target=None):
        if name != SCAN_MODULE or self.done or self.looking:
            return None
        import importlib.util

        self.looking = True  # the lookup below asks every finder on sys.meta_path, this one included
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.looking = False
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _WideningLoader(spec.loader, self)
        return spec


class _WideningLoader:
    """Loads as ``loader`` does, then widens SCAN_FUNCTION's cache and hands the module back to
    ``loader`` (its ``__loader__`` and spec name the real one afterwards)."""

    def __init__(self, loader, finder: _WholeScanCache):
        self.loader, self.finder = loader, finder

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.finder.done = True
        scan = getattr(module, SCAN_FUNCTION, None)
        if callable(getattr(scan, "__wrapped__", None)) and getattr(scan, "cache_parameters", dict)().get("maxsize"):
            setattr(module, SCAN_FUNCTION, StoredScan(functools.lru_cache(maxsize=None)(scan.__wrapped__),
                                                      module.__file__, scan_store()))


# Where the scans are kept: a folder, or empty for none (the suite gives each session its own).
SCAN_STORE_VARIABLE = "LLAVA_NORM_SCAN_STORE"


def scan_store() -> Path | None:
    """Where the scans are kept between processes: ``$LLAVA_NORM_SCAN_STORE`` if set (empty: kept
    nowhere), else the user's cache folder (an absolute ``XDG_CACHE_HOME``, else ~/.cache); None
    where there is no such place (no home folder)."""
    try:
        chosen = os.environ.get(SCAN_STORE_VARIABLE)
        if chosen is not None:
            return Path(chosen).absolute() if chosen else None
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
        return base / "llava-norm" / "transformers-scan"
    except (RuntimeError, KeyError, OSError):  # Path.home() without HOME or a passwd entry
        return None


class StoredScan:
    """SCAN_FUNCTION with each folder's whole result kept on disk, for the next process.

    A call from outside the scan (a package's table: transformers/models, one model's folder)
    returns the stored result when the folder's tree is as it was when that result was computed:
    every file under it with the same size and modification time (what Python trusts for its own
    bytecode), and the same transformers source (the scan's module and the package's
    ``__init__``). Anything else (a file changed, added or removed, a store that does not read)
    computes as transformers does, with ``scan``, and stores the result for the next process,
    unless a file changed while it was read. The calls the scan makes for the folders inside one
    go to ``scan`` directly. Nothing here can fail an import that transformers alone completes:
    a store that cannot be read, trusted or written is passed over."""

    def __init__(self, scan, source: str, store: Path | None):
        self.scan, self.store = scan, store
        self.cache_info = scan.cache_info
        package = os.path.join(os.path.dirname(os.path.dirname(source)), "__init__.py")
        self.sources = [(path, _stat_line(path)) for path in (source, package) if os.path.exists(path)]
        self.inside = False
        self.known: dict[str, object] = {}  # folder -> its stored form: files do not change under a running process

    def __call__(self, module_path):
        if self.inside or self.store is None:
            return self.scan(module_path)
        folder = os.path.abspath(os.path.dirname(module_path) if os.path.isfile(module_path) else module_path)
        try:
            kept = self.known[folder] if folder in self.known else self._stored(folder)
            if kept is not None:
                result = _decoded(kept, top=True)
                self.known[folder] = kept
                return result
        except Exception:  # noqa: BLE001 - a store that does not read: scanned and stored again
            pass
        try:
            before = self._signature(folder)
        except Exception:  # noqa: BLE001 - a tree that does not walk: scanned, nothing stored
            before = None
        self.inside = True
        try:
            result = self.scan(module_path)
        finally:
            self.inside = False
        self.known[folder] = self._store(folder, result, before) if before else None
        return result

    def _file(self, folder: str) -> Path:
        return self.store / f"{hashlib.sha256(os.fsencode(folder)).hexdigest()[:20]}.json"

    def _signature(self, folder: str) -> str:
        digest = hashlib.sha256()
        for path, line in self.sources:  # as this process loaded it: an upgrade since is another source
            digest.update(os.fsencode(f"{path} {line}\n"))
        digest.update(os.fsencode(f"{folder} {_stat_line(folder)}\n"))
        for top, dirs, files in os.walk(folder, followlinks=True):  # the scan follows links too
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            digest.update(os.fsencode(f"{top}/\n"))
            for name in sorted(files):
                digest.update(os.fsencode(f"{name} {_stat_line(os.path.join(top, name))}\n"))
        return digest.hexdigest()

    def _stored(self, folder: str):
        path = self._file(folder)
        if not path.is_file() or path.stat().st_uid != os.getuid():  # only this user's own store is trusted
            return None
        kept = json.loads(path.read_text())
        return kept["result"] if kept["folder"] == folder and kept["signature"] == self._signature(folder) else None

    def _store(self, folder: str, result, before: str) -> object | None:
        partial = None
        try:
            if self._signature(folder) != before or any(_stat_line(p) != line for p, line in self.sources):
                return None  # a file changed while the scan read it: the result may hold either version
            kept = {"folder": folder, "signature": before, "result": _encoded(result)}
            self.store.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, partial = tempfile.mkstemp(dir=self.store, suffix=".partial")
            with os.fdopen(fd, "w") as out:
                json.dump(kept, out)
            os.replace(partial, self._file(folder))  # whole or absent: processes start side by side
            partial = None
            return kept["result"]
        except OSError:  # a store that cannot be written: this process stops trying
            self.store = None
            return None
        except Exception:  # noqa: BLE001 - a result this store cannot hold: computed again next time
            return None
        finally:
            if partial:
                with contextlib.suppress(OSError):
                    os.unlink(partial)


def _stat_line(path: str) -> str:
    stat = os.stat(path)
    return f"{stat.st_size} {stat.st_mtime_ns}"


def _encoded(value):
    """A scan result (dicts, sets and frozensets of strings) as JSON can hold it."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return {"dict": [[_encoded(k), _encoded(v)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)) and all(isinstance(v, str) for v in value):
        return {type(value).__name__: sorted(value)}
    raise TypeError(f"not a scan result: {type(value).__name__}")


def _decoded(value, top: bool = False):
    """``_encoded``'s inverse; anything it could not have written raises ValueError."""
    if isinstance(value, str) and not top:
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError("not a stored scan")
    (kind, items), = value.items()
    if not isinstance(items, list) or (top and kind != "dict"):
        raise ValueError("not a stored scan")
    if kind == "dict":
        if not all(isinstance(pair, list) and len(pair) == 2 for pair in items):
            raise ValueError("not a stored scan")
        return {_decoded(k): _decoded(v) for k, v in items}
    if kind not in ("set", "frozenset") or not all(isinstance(v, str) for v in items):
        raise ValueError("not a stored scan")
    return (set if kind == "set" else frozenset)(items)


def one_scan_of_transformers_models() -> None:
    """Have transformers read its model folders once in this process, not twice.

    Why: ``import transformers`` builds its lazy import table by reading every file under
    transformers/models (about 550 folders: a quarter of a CPU-second), and importing
    ``transformers.models``, as any model's code does, builds the folders' table again. The
    per-folder results are kept in a 128-entry LRU cache, which 550 folders overflow, so the
    second build misses every folder. With the same function given an unbounded cache, the
    second build finds each folder's result from the first: same function, same arguments,
    same result (within one process, as transformers' own cache assumes). Across processes the
    results are kept on disk (``StoredScan``, in ``scan_store()``), each used only while every
    file under its folder has the size and modification time it had: the suite's hundreds of
    launches, and a cluster job's ranks, read the scan instead of making it (about a quarter of
    a CPU-second each: bench/startup.py). Installed before transformers loads; where it already
    has, or the function is not there (another version), transformers loads as it would.
    """
    if SCAN_MODULE not in sys.modules and not any(isinstance(f, _WholeScanCache) for f in sys.meta_path):
        sys.meta_path.insert(0, _WholeScanCache())


def die_with_launcher() -> None:
    """Make a launched worker die the moment its launcher does.

    Why: torchrun starts each worker in a session of its own, so when the launcher or its
    process group is killed (preemption, a scheduler's SIGKILL, a test) the workers used to go
    on training and writing checkpoints into a run that was meant to be stopped. Linux's
    parent-death signal ends them with SIGKILL, before they can write anything more.
    """
    if not (os.environ.get("TORCHELASTIC_RUN_ID") or "LOCAL_RANK" in os.environ) or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the launcher died before the line above took effect
        os._exit(1)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt (see ``stop_on_sigterm``)."""

    status = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended


def stop_on_sigterm() -> None:
    """Have SIGTERM end this process as Ctrl-C does: through the subcommand's ``except
    KeyboardInterrupt``, which says where the run stands and how it goes on.

    Why: SIGTERM is what ``scancel`` and a Slurm preemption send first, and what torchrun sends
    its workers when it stops; Python's default for it ends the process without a word, so a
    preempted run's log never said which checkpoint its requeue resumes from. A second SIGTERM
    ends the process at once, as the default does.
    """
    import signal

    def raise_terminated(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated

    signal.signal(signal.SIGTERM, raise_terminated)


def how_stopped(error: KeyboardInterrupt) -> tuple[str, int]:
    """The word an interrupted subcommand's line starts with, and the exit status it leaves:
    130 for Ctrl-C and 143 for SIGTERM, as a shell reports them."""
    return ("terminated by SIGTERM", Terminated.status) if isinstance(error, Terminated) else ("interrupted", 130)


def exit_launched_worker() -> None:
    """End a torchrun worker without interpreter finalisation, once its work is written.

    Why: gloo's worker threads drop the last collectives' tensors a moment after the caller
    has moved on. Freeing a tensor that Python owns takes the GIL; if the interpreter is
    already finalising, that thread is killed inside C++ and the whole process aborts
    ("terminate called without an active exception", SIGABRT), failing the launch after
    every file was saved. It is rare and load-dependent (seen once in CI under ZeRO-3).
    So the atexit handlers run and the streams are flushed while the interpreter is fully
    alive, and the process then leaves with ``os._exit``. Only under torchrun (its agent
    sets TORCHELASTIC_RUN_ID): called in-process, as from the tests, this returns.
    """
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return
    import atexit

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@contextlib.contextmanager
def quiet_transformers():
    """transformers logs errors only while a subcommand runs: set at once where it is loaded, else
    through the variable it reads when it loads (which the processes the subcommand launches
    inherit, as they would set it). The variable is put back afterwards, so an in-process caller
    (a test) keeps its own environment.

    Why: importing transformers only to set its level took a third of a second in every process
    that never loads it (the pipeline, the sweep's tasks, the table).
    """
    with environment_variable("TRANSFORMERS_VERBOSITY", "error"):
        if "transformers" in sys.modules:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
        yield


@contextlib.contextmanager
def environment_variable(name: str, value: str):
    """``name`` set to ``value`` in this process's environment for the block, then as it was."""
    with restored_environment(name):
        os.environ[name] = value
        yield


@contextlib.contextmanager
def restored_environment(*names: str):
    """The variables ``names``, whatever the block sets or removes, put back as they were before it."""
    before = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
