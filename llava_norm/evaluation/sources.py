"""Where each row of a results table comes from, and whether it still holds.

Owns the provenance part of a table: for each run, the checkpoint it evaluated (path and
fingerprint), the hash of the training config behind it (from the ``provenance.json`` the
training run wrote beside ``model/``), a hash of the evaluation settings, when it was
evaluated and by which code version. It re-checks what can be checked now (the checkpoint and
the benchmark files still have the fingerprints the results were computed from; the training
record is complete and names that checkpoint) and turns every failure into a mark on the row,
so a stale or unproven number is never mixed in silently.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from llava_norm.provenance import fingerprint, read_record, version_label

# Settings that name the checkpoint: the rest is "how it was evaluated".
_CHECKPOINT_KEYS = ("checkpoint", "checkpoint_fingerprint", "data_path", "data_fingerprint")


@dataclass
class RowSource:
    run: str
    checkpoint: str = ""
    checkpoint_fingerprint: str = ""
    config_hash: str = ""
    eval_settings: str = ""
    evaluated: str = ""
    code: str = ""
    marks: list[str] = field(default_factory=list)


def _short_hash(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def row_source(run: str, results: dict[str, dict], marks: list[str] | None = None,
               checkpoint: str | Path | None = None, data: dict[str, Path] | None = None) -> RowSource:
    """The provenance of one run's row from its ``<benchmark>.json`` results, re-checked now
    against ``checkpoint`` and ``data`` (where the checkpoint and each benchmark's files are now;
    default: where they were when evaluated)."""
    source = RowSource(run, marks=list(marks or []))
    settings = {name: r.get("settings", {}) for name, r in results.items()}
    fingerprints = {s.get("checkpoint_fingerprint") for s in settings.values()}
    if len(fingerprints) > 1:
        source.marks.append(f"benchmarks evaluated on {len(fingerprints)} different checkpoints")
    latest = max(results, key=lambda name: results[name].get("finished", ""))  # the newest result names the row
    source.checkpoint = str(checkpoint) if checkpoint else settings[latest].get("checkpoint", "")
    source.checkpoint_fingerprint = settings[latest].get("checkpoint_fingerprint", "")
    source.eval_settings = _short_hash({n: {k: v for k, v in s.items() if k not in _CHECKPOINT_KEYS}
                                        for n, s in settings.items()})
    source.evaluated = max((r.get("finished", "") for r in results.values()), default="")
    versions = sorted({version_label(r.get("environment", {})) for r in results.values()})
    source.code = ", ".join(v or "unrecorded" for v in versions)
    if any("data_fingerprint" not in s or "environment" not in results[n] for n, s in settings.items()):
        source.marks.append("results without a provenance record (written by an older version)")
    source.marks += _recheck(source, settings, data or {})
    return source


def _recheck(source: RowSource, settings: dict[str, dict], now: dict[str, Path]) -> list[str]:
    marks = []
    checkpoint = Path(source.checkpoint or "")
    if not source.checkpoint or not checkpoint.exists():
        return [f"checkpoint {source.checkpoint or '(unnamed)'} not found: cannot be verified"]
    if fingerprint(checkpoint) != source.checkpoint_fingerprint:
        marks.append("stale: the checkpoint changed after it was evaluated")
    for name, s in settings.items():
        data = now.get(name) or s.get("data_path")
        if not data or "data_fingerprint" not in s:
            continue
        if not Path(data).exists():
            marks.append(f"{name} data {data} not found: cannot be verified")
        elif fingerprint(data) != s["data_fingerprint"]:
            marks.append(f"stale: {name} data changed after it was evaluated")
    training = read_record(checkpoint.parent)
    if training is None:
        marks.append(f"no training record ({checkpoint.parent / 'provenance.json'})")
        return marks
    source.config_hash = training.config_hash()
    if not training.complete:
        marks.append("the training record is incomplete (an interrupted run)")
    elif training.outputs.get("model") != source.checkpoint_fingerprint:
        marks.append("stale: the training record names another checkpoint")
    return marks


def markdown_section(sources: list[RowSource]) -> str:
    lines = ["", "Where each row comes from (hashes: `llava_norm.provenance`):", "",
             "| run | checkpoint | checkpoint fingerprint | training config | eval settings | evaluated | code |",
             "|---|---|---|---|---|---|---|"]
    for s in sources:
        lines.append(f"| {s.run}{' †' if s.marks else ''} | `{s.checkpoint}` | {s.checkpoint_fingerprint} | "
                     f"{s.config_hash or '-'} | {s.eval_settings} | {s.evaluated} | {s.code} |")
    flagged = [s for s in sources if s.marks]
    if flagged:
        lines += ["", "† Rows to read with care:"]
        lines += [f"- **{s.run}**: {'; '.join(s.marks)}." for s in flagged]
    return "\n".join(lines) + "\n"


def csv_fields(source: RowSource) -> dict[str, str]:
    return {"checkpoint": source.checkpoint, "checkpoint_fingerprint": source.checkpoint_fingerprint,
            "config_hash": source.config_hash, "eval_settings": source.eval_settings,
            "evaluated": source.evaluated, "code": source.code, "marks": "; ".join(source.marks)}
