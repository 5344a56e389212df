"""The results table (Table 4 layout): one row per run, one named column per benchmark.

Owns the table's layout and the deltas against the baseline run; which metric heads each
benchmark's column (and its legend, written under the table, since e.g. POPE has several
candidates) is the ``headline`` of the benchmark's declaration.
Reads the ``<benchmark>.json`` files ``llava-norm eval`` writes; writes Markdown and CSV.
All values are percentages.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from llava_norm.evaluation.benchmarks import BENCHMARKS, Headline
from llava_norm.evaluation.predictions import read_json_output
from llava_norm.evaluation.sources import RowSource, csv_fields, markdown_section, row_source
from llava_norm.layout import MODEL_DIR
from llava_norm.provenance import fingerprint, make_record, write_record


def headline(benchmark: str) -> Headline:
    """The metric that heads a benchmark's column, from its declaration."""
    return BENCHMARKS[benchmark].declaration.headline


EVAL_SUMMARY = "summary.json"  # in an evaluation's --out: the run name and every benchmark's result

# Settings that must agree across runs for their numbers to share a column (the data by its
# fingerprint: the same files anywhere, not whatever sits at one path).
COMPARABLE = ("benchmark", "data_fingerprint", "limit", "max_new_tokens_cap", "dtype")


@dataclass
class Table:
    runs: list[str]
    columns: list[str]  # benchmark names, in registry order, present in every run
    labels: dict[str, str]
    values: dict[str, dict[str, float]]  # run -> benchmark -> percent
    baseline: str
    metrics: dict[str, dict[str, dict]] = field(default_factory=dict)  # run -> benchmark -> full metrics
    average: bool = True
    sources: dict[str, RowSource] = field(default_factory=dict)  # run -> where its numbers come from

    def row_average(self, run: str) -> float:
        return sum(self.values[run][c] for c in self.columns) / len(self.columns)

    def delta(self, run: str, column: str) -> float:
        return self.values[run][column] - self.values[self.baseline][column]


def read_results(out_dir: str | Path, unread: Iterable[str] = ()) -> dict[str, dict]:
    """Every finished ``<benchmark>.json`` in an evaluation directory, in registry order, but
    those of the benchmarks named in ``unread`` (not read at all: they are being recomputed)."""
    results, unread = {}, set(unread)
    for path in sorted(Path(out_dir).glob("*.json")):
        if path.stem in unread:
            continue
        data = read_json_output(path)
        if isinstance(data, dict) and data.get("benchmark") in BENCHMARKS and "metrics" in data:
            results[data["benchmark"]] = data
    return {name: results[name] for name in BENCHMARKS if name in results}


def read_run(run_dir: str | Path, benchmarks: list[str] | None = None) -> tuple[str, dict[str, dict]]:
    """(run name, {benchmark: result json}) from an ``llava-norm eval`` output directory; only
    ``benchmarks`` if given (results left over from an earlier request are not tabulated)."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        raise ValueError(f"{run_dir}: a file; give the evaluation's folder (llava-norm eval's --out)")
    if not run_dir.is_dir():
        raise FileNotFoundError(f"evaluation directory not found: {run_dir}")
    summary = run_dir / EVAL_SUMMARY
    results = {k: v for k, v in read_results(run_dir).items() if benchmarks is None or k in benchmarks}
    # an evaluation killed before its summary: the run name each finished result records
    named = {r.get("run_name") for r in results.values()} - {None}
    name = read_json_output(summary)["run_name"] if summary.exists() else \
        named.pop() if len(named) == 1 else run_dir.name
    if not results:
        # a run's folder or its saved model given for the evaluation beside them (eval's default --out)
        # (only a run's folder, holding its model, or that model folder: a checkpoint's evaluation is another)
        candidates = [run_dir / "eval"] if (run_dir / MODEL_DIR).is_dir() else \
            [run_dir.parent / "eval"] if run_dir.name == MODEL_DIR else []
        beside = next((d for d in candidates if (d / EVAL_SUMMARY).is_file()), None)
        if beside is not None:
            raise ValueError(f"{run_dir}: no benchmark result files here; its evaluation is {beside}: give that folder")
        raise ValueError(f"{run_dir}: no benchmark result files (<benchmark>.json); run `llava-norm eval` first")
    return name, results


def runs_by_name(run_dirs: list[str | Path], benchmarks: list[str] | None = None) -> dict[str, tuple[Path, dict]]:
    """``{run name: (eval dir, its results)}``, each folder read once (``read_run``); two folders
    of one run name are refused (a table row each)."""
    found: dict[str, tuple[Path, dict]] = {}
    for run_dir in run_dirs:
        name, results = read_run(run_dir, benchmarks)
        if name in found:
            raise ValueError(f"two evaluation directories have run name {name!r}: {found[name][0]} and {run_dir}; "
                             "rerun `llava-norm eval` on one of them with another --name")
        found[name] = (Path(run_dir), results)
    return found


def benchmark_files_now(found: dict[str, tuple[Path, dict]], data_root: str | None,
                        paths: dict[str, str]) -> dict[str, Path] | None:
    """Where the benchmark files of ``found`` (``runs_by_name``) are now: ``paths`` by name, the
    rest under ``data_root`` (each benchmark's folder, as eval's --data-root); None where neither
    is given (where each result says they were when evaluated)."""
    from llava_norm.evaluation.settings import resolve_benchmarks  # lazy: it imports torch, which a table needs not

    names = list(dict.fromkeys(b for _, results in found.values() for b in results)) if data_root else list(paths)
    return {r.name: Path(r.path) for r in resolve_benchmarks(names, data_root, paths, {})} if names else None


def build_table(run_dirs: list[str | Path], baseline: str | None = None,
                benchmarks: list[str] | None = None) -> Table:
    runs = {name: results for name, (_, results) in runs_by_name(run_dirs, benchmarks).items()}
    names = list(runs)
    baseline = baseline or names[0]
    if baseline not in runs:
        raise ValueError(f"baseline run {baseline!r} not among {names}")
    # Order: baseline first, the rest as given.
    names = [baseline] + [n for n in names if n != baseline]
    columns = [b for b in BENCHMARKS if all(b in runs[n] for n in names)]
    if not columns:  # nothing to set side by side (the average over no column was a ZeroDivisionError)
        raise ValueError(f"no benchmark was evaluated for every run: {', '.join(f'{n}: {sorted(runs[n])}' for n in names)}")
    labels = {}
    for column in columns:
        for key in COMPARABLE:
            found = {json.dumps(runs[n][column]["settings"].get(key), sort_keys=True) for n in names}
            if len(found) > 1:
                raise ValueError(f"{column}: runs {names} were evaluated with different '{key}' "
                                 f"({' vs '.join(sorted(found))}); a column must compare like with like")
        labels[column] = headline(column).label(runs[names[0]][column]["settings"])
    values = {n: {c: headline(c).value(runs[n][c]["metrics"]) for c in columns} for n in names}
    metrics = {n: {c: runs[n][c]["metrics"] for c in columns} for n in names}
    return Table(names, columns, labels, values, baseline, metrics=metrics)


def _signed(x: float) -> str:
    return f"{x:+.2f}"


def to_markdown(table: Table, extra_rows: dict[str, dict[str, float]] | None = None) -> str:
    """Markdown with deltas in parentheses, as in the paper's Table 4; ``extra_rows`` (e.g.
    chance levels) are appended without deltas and without an average."""
    header = ["run"] + [table.labels[c] for c in table.columns] + (["Average"] if table.average else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    unread = set()
    for run in table.runs:
        marked = run in table.sources and table.sources[run].marks
        cells = [f"{run} †" if marked else run]
        for column in table.columns:
            value = f"{table.values[run][column]:.2f}"
            unreadable = table.metrics.get(run, {}).get(column, {}).get("unparsable_replies", 0)
            if unreadable:  # a score over the replies its rule could read: said in the cell
                value = f"{value} ‡{unreadable}"
                unread.add(column)
            cells.append(value if run == table.baseline else f"{value} ({_signed(table.delta(run, column))})")
        if table.average:
            avg = table.row_average(run)
            base = table.row_average(table.baseline)
            cells.append(f"{avg:.2f}" if run == table.baseline else f"{avg:.2f} ({_signed(avg - base)})")
        lines.append("| " + " | ".join(cells) + " |")
    for name, row in (extra_rows or {}).items():
        cells = [name] + [f"{row[c]:.2f}" if c in row else "" for c in table.columns]
        lines.append("| " + " | ".join(cells + ([""] if table.average else [])) + " |")
    legend = [f"- **{table.labels[c]}**: {headline(c).legend}." for c in table.columns]
    if unread:
        pope = " POPE's F1 under its default rule (`lmms_eval_strict`, as lmms-eval) leaves them out of precision " \
            "and recall, so a high F1 can stand beside many of them (`--option pope.reply_rule=llava_first_sentence` " \
            "reads every reply)." if "pope" in unread else ""
        legend.append(f"- ‡N: N replies its rule could not read, scored wrong.{pope}")
    return "\n".join(lines + ["", f"Percentages; deltas in parentheses are against `{table.baseline}`.", *legend]) + "\n"


def to_csv(table: Table) -> str:
    """Named columns: ``<benchmark>`` and ``<benchmark>_delta`` per benchmark, then the average."""
    buffer = io.StringIO()
    fields = ["run", "is_baseline"]
    for column in table.columns:
        fields += [column, f"{column}_delta"]
    if table.average:
        fields += ["average", "average_delta"]
    if table.sources:
        fields += list(csv_fields(next(iter(table.sources.values()))))
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for run in table.runs:
        row: dict[str, object] = {"run": run, "is_baseline": run == table.baseline}
        for column in table.columns:
            row[column] = round(table.values[run][column], 4)
            row[f"{column}_delta"] = round(table.delta(run, column), 4)
        if table.average:
            row["average"] = round(table.row_average(run), 4)
            row["average_delta"] = round(table.row_average(run) - table.row_average(table.baseline), 4)
        if run in table.sources:
            row.update(csv_fields(table.sources[run]))
        writer.writerow(row)
    return buffer.getvalue()


def write_table(run_dirs: list[str | Path], out_prefix: str | Path, baseline: str | None = None,
                extra_rows: dict[str, dict[str, float]] | None = None,
                marks: dict[str, list[str]] | None = None, benchmarks: list[str] | None = None,
                checkpoints: dict[str, Path] | None = None, data: dict[str, Path] | None = None
                ) -> tuple[Path, Path, dict[str, list[str]]]:
    """Write ``<out_prefix>.md`` and ``<out_prefix>.csv`` with each row's provenance (checkpoint,
    config hash, evaluation settings, date, code), re-checked now. ``marks`` adds, per run, what
    the caller knows (a stale step reused on purpose); ``benchmarks`` limits the columns to those
    asked for; ``checkpoints`` and ``data`` say where each run's checkpoint and each benchmark's
    files are now (the pipeline knows; by default, where they were when evaluated). Returns the
    two paths and each run's marks (the caller's and those the re-check found)."""
    table = build_table(run_dirs, baseline, benchmarks)
    runs = dict(read_run(d, benchmarks) for d in run_dirs)
    table.sources = {name: row_source(name, runs[name], (marks or {}).get(name), (checkpoints or {}).get(name), data)
                     for name in table.runs}
    out_prefix = Path(out_prefix)
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    # Not with_suffix: a prefix such as "llama3.2-3b" would lose its ".2-3b".
    md, csv_path = Path(f"{out_prefix}.md"), Path(f"{out_prefix}.csv")
    md.write_text(to_markdown(table, extra_rows) + markdown_section(list(table.sources.values())))
    csv_path.write_text(to_csv(table))
    record = make_record("table", {"baseline": table.baseline, "runs": table.runs, "columns": table.columns,
                                   "benchmarks": benchmarks, "checkpoints": checkpoints, "data": data,
                                   "marks": {run: s.marks for run, s in table.sources.items()}},
                         dict(zip(runs, run_dirs)))
    record.complete, record.outputs = True, {"md": fingerprint(md), "csv": fingerprint(csv_path)}
    write_record(out_prefix.parent, record, f"{out_prefix.name}.provenance.json")
    return md, csv_path, {run: list(source.marks) for run, source in table.sources.items()}

