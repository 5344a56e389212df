"""What made an artefact: fingerprints of files, the code and the libraries, and the record that
holds them.

Owns the ``provenance.json`` every stage writes beside its output (training runs, evaluations,
diagnostics, tables) and the rule that decides whether an artefact can be reused: its record
must match the record of what would be computed now. The record has three parts:

- ``config``: every setting that can change the result (paths to inputs are left out of it);
- ``inputs``: ``name -> {path, fingerprint}`` for each file or folder read (data, images,
  benchmark files, the checkpoint it started from), compared by fingerprint only, so a moved
  but identical input still matches;
- ``environment``: the code version (git commit, dirty flag, a digest of the package's source)
  and the versions of torch, transformers, deepspeed, peft and accelerate. It is recorded and
  reported, but only counts when asked for (``code_counts``): a new commit alone reruns nothing.

Fingerprints are built to be cheap on a 190 GB corpus and exact on the files that decide a run:

- a file of at most ``WHOLE_FILE_BYTES``: SHA-256 of its content;
- a larger file: SHA-256 of its size, its first and last MiB and ``SAMPLED_BLOCKS`` blocks of
  64 KiB spread evenly in between (a retrained weight file changes everywhere; a safetensors
  header, with every tensor's shape and offset, sits in the first MiB);
- a folder: every file's relative path and size, plus the fingerprint of each file if it holds
  at most ``WHOLE_FOLDER_FILES`` files, else of that many files spread evenly over the sorted
  names (an image folder of 558K files costs one directory walk and 64 reads);
- a glob: like a folder holding the files it matches;
- a hub id that is not a local path: ``hub:<id>@<commit>`` of the cached snapshot, or
  ``hub:<id>`` when there is none to resolve.

``FingerprintMemo`` keeps file fingerprints between starts (the data index asks for one per shard
at every start): a file whose size, modification time and inode are those recorded is not read
again; any change of the three fingerprints it anew.
"""

from __future__ import annotations

import datetime
import glob
import hashlib
import json
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from llava_norm.config_schema import is_glob, is_hub_id
from llava_norm.files import write_atomically

RECORD = "provenance.json"
MEMO_NAME = "llava_norm_file_fingerprints.json"
WHOLE_FILE_BYTES = 16 << 20
SAMPLED_BLOCKS = 16
WHOLE_FOLDER_FILES = 64
_EDGE, _BLOCK = 1 << 20, 64 << 10
LIBRARIES = ("torch", "transformers", "deepspeed", "peft", "accelerate")
PACKAGE = Path(__file__).resolve().parent


def flatten(tree: dict, prefix: str = "") -> dict:
    """Nested dicts -> ``{"a.b.c": value}`` (lists stay values): records compare key by key."""
    out = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


def file_fingerprint(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256(f"{size};".encode())
    with open(path, "rb") as handle:
        if size <= WHOLE_FILE_BYTES:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        else:
            step = (size - 2 * _EDGE) // (SAMPLED_BLOCKS + 1)
            offsets = [0] + [_EDGE + step * (i + 1) for i in range(SAMPLED_BLOCKS)] + [size - _EDGE]
            for offset in offsets:
                handle.seek(offset)
                digest.update(handle.read(_EDGE if offset in (0, size - _EDGE) else _BLOCK))
    return digest.hexdigest()[:20]


def folder_fingerprint(path: Path) -> str:
    # A record describes the folder; it is not part of what it describes.
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".") and p.name != RECORD)
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.relative_to(path).as_posix()}:{file.stat().st_size};".encode())
    if len(files) > WHOLE_FOLDER_FILES:
        stride = len(files) / WHOLE_FOLDER_FILES
        files = [files[int(i * stride)] for i in range(WHOLE_FOLDER_FILES)]
    for file in files:
        digest.update(file_fingerprint(file).encode())
    return digest.hexdigest()[:20]


def _hub_fingerprint(name: str) -> str:
    try:  # resolving from the local cache only: no network, no download
        from huggingface_hub import snapshot_download

        return f"hub:{name}@{Path(snapshot_download(name, local_files_only=True)).name}"
    except Exception:
        return f"hub:{name}"


def fingerprint(path: str | Path) -> str:
    """The fingerprint of a file, a folder, or a hub id (see the module docstring for the method)."""
    p = Path(path)
    if p.is_file():
        return file_fingerprint(p)
    if p.is_dir():
        return folder_fingerprint(p)
    if is_glob(str(path)):
        matches = sorted(Path(m) for m in glob.glob(str(path), recursive=True) if Path(m).is_file())
        if matches:
            return hashlib.sha256("".join(f"{m.name}:{file_fingerprint(m)};" for m in matches).encode()).hexdigest()[:20]
    if is_hub_id(str(path)):
        return _hub_fingerprint(str(path))
    raise FileNotFoundError(f"cannot fingerprint {path}: no such file or folder")


class FingerprintMemo:
    """File fingerprints by absolute path, with the size, modification time and inode they were
    taken at, in ``folder/MEMO_NAME`` (JSON). Processes share it through the file: the first to
    fingerprint a file records it (written whole and atomically), later ones, on any rank or
    start, stat the file and read nothing of it. A save merges what others saved since this memo
    was read; of two saves at the same instant the later wins, and the other's new entries are
    fingerprinted again at the next start. An edit that keeps size, modification time and inode
    is not seen (as with make or rsync's quick check)."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / MEMO_NAME
        self.entries = self._read()
        self.computed = 0  # fingerprints taken (files read) through this memo

    def _read(self) -> dict:
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or torn by a crash: rebuilt as files are asked for
            return {}
        return entries if isinstance(entries, dict) else {}

    def fingerprint(self, file: Path) -> str:
        stat = file.stat()
        stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        key = str(file.resolve())
        recorded = self.entries.get(key)
        if isinstance(recorded, list) and recorded[:3] == stamp:
            return recorded[3]
        value = file_fingerprint(file)
        self.computed += 1
        self.entries[key] = [*stamp, value]
        return value

    def save(self) -> None:
        if not self.computed:
            return
        merged = {**self._read(), **self.entries}  # keep what other processes recorded meanwhile
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, json.dumps(merged))


def source_packages() -> list[Path]:
    """This project's packages: ``llava_norm`` and any sibling ``llava_norm*`` package installed
    with it (the pattern pyproject.toml packages), so a plugin's code counts like the core's."""
    return sorted(p for p in PACKAGE.parent.glob(f"{PACKAGE.name}*") if (p / "__init__.py").is_file())


def source_digest() -> str:
    """SHA-256 of the project's Python source: the code that ran, git or not."""
    digest = hashlib.sha256()
    for package in source_packages():
        for file in sorted(package.rglob("*.py")):
            digest.update(f"{file.relative_to(PACKAGE.parent).as_posix()}\n".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def environment() -> dict:
    """The code version (commit, dirty flag, source digest), the library versions and the CPU's
    float-kernel level."""
    # Only the checkout this package lives in: an installed copy inside another repository's
    # tree must not report that repository's commit.
    top = _git("rev-parse", "--show-toplevel")
    ours = top is not None and Path(top).resolve() == PACKAGE.parent
    commit = _git("rev-parse", "HEAD") if ours else None
    status = _git("status", "--porcelain", "--", *(p.name for p in source_packages())) if commit else None
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"commit": commit, "dirty": bool(status) if commit else None, "source": source_digest(),
            "libraries": versions, "cpu_kernels": cpu_kernels()}


def cpu_kernels() -> str:
    """The float-kernel level torch dispatches to on this CPU (AVX512, AVX2, ...): CPU results
    differ in their last bits from one level to another, so a run carries it like a version."""
    import torch  # lazy: only the record needs it, and this layer is otherwise torch-free

    return torch.backends.cpu.get_cpu_capability()


def environment_differences(recorded: dict, now: dict) -> list[str]:
    """What differs in the code or the libraries: the source digest decides, the commit names it."""
    out = []
    if recorded.get("source") != now.get("source"):
        out.append(f"code: {version_label(recorded)} -> {version_label(now)}")
    old, new = recorded.get("libraries", {}), now.get("libraries", {})
    out += [f"{name}: {old.get(name)} -> {new.get(name)}" for name in sorted(set(old) | set(new))
            if old.get(name) != new.get(name)]
    if recorded.get("cpu_kernels", now.get("cpu_kernels")) != now.get("cpu_kernels"):
        out.append(f"CPU float kernels: {recorded['cpu_kernels']} -> {now.get('cpu_kernels')}")
    return out


def version_label(env: dict) -> str:
    """``<commit>[+dirty] (source <digest>)``: how logs and tables name a code version."""
    if not env:
        return ""
    commit = (env.get("commit") or "no-git")[:10]
    return f"{commit}{'+dirty' if env.get('dirty') else ''} (source {env.get('source', '?')})"


@dataclass
class Record:
    stage: str  # stage1 | stage2 | eval:<benchmark> | analysis:<kind> | table
    config: dict
    inputs: dict[str, dict] = field(default_factory=dict)  # name -> {"path", "fingerprint"}
    seed: int | None = None
    environment: dict = field(default_factory=dict)
    complete: bool = False
    created: str = ""
    outputs: dict[str, str] = field(default_factory=dict)  # name -> fingerprint, once complete

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.config, sort_keys=True, default=str).encode()).hexdigest()[:12]


def make_record(stage: str, config: dict, inputs: dict[str, str | Path], seed: int | None = None) -> Record:
    """A record of what this stage would compute now; every input is fingerprinted. The config
    is taken as JSON stores it (tuples as lists), so a record read back compares equal."""
    config = json.loads(json.dumps(config, default=str))
    return Record(stage, config, {name: {"path": str(path), "fingerprint": fingerprint(path)}
                                  for name, path in inputs.items() if path is not None},
                  seed, environment(), created=now())


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def config_difference(recorded: Record, expected: Record, key: str) -> str | None:
    """``key: recorded -> expected`` where the two configs differ on ``key``, else None."""
    old, new = recorded.config.get(key, "<unset>"), expected.config.get(key, "<unset>")
    return None if old == new else f"{key}: {old!r} -> {new!r}"


def differences(recorded: Record, expected: Record, ignore: tuple[str, ...] = ()) -> list[str]:
    """The result-changing differences: config keys (but ``ignore``), inputs (by fingerprint)
    and the seed."""
    keys = sorted((set(recorded.config) | set(expected.config)) - set(ignore))
    out = [said for key in keys if (said := config_difference(recorded, expected, key))]
    for name in sorted(set(recorded.inputs) | set(expected.inputs)):
        old, new = recorded.inputs.get(name), expected.inputs.get(name)
        if old is None or new is None:
            out.append(f"input {name}: {'added' if old is None else 'removed'}")
        elif old["fingerprint"] != new["fingerprint"]:
            out.append(f"input {name} changed ({new['path']}: {old['fingerprint']} -> {new['fingerprint']})")
    if recorded.seed != expected.seed:
        out.append(f"seed: {recorded.seed} -> {expected.seed}")
    return out


def write_record(directory: str | Path, record: Record, name: str = RECORD) -> Path:
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, json.dumps(asdict(record), indent=2, default=str))  # never half a record


class DamagedRecordError(ValueError):
    """A record file that does not read as one (edited, or cut short by a failing disk: it is
    written whole); the message names the file."""


# What a training launch that met one says to do (llava-norm train and check)
RELAUNCH_PAST_A_DAMAGED_RECORD = ("move it aside and relaunch with llava-norm train, which writes it anew (without the "
                                  "changes earlier launches made); a pipeline or sweep would find the stage without "
                                  "its record and train it again")


def read_record(directory: str | Path, name: str = RECORD) -> Record | None:
    path = Path(directory) / name
    if not path.is_file():
        return None
    try:
        return Record(**json.loads(path.read_text()))
    except (TypeError, ValueError) as error:
        raise DamagedRecordError(f"{path}: not a provenance record ({error})") from error
