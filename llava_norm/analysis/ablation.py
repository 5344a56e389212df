"""Results over arms and training seeds: what tells a real effect from seed and item noise.

Owns grouping evaluated runs into arms and seeds (a run named ``<arm>@seed<k>``, as
``llava-norm sweep`` names them; any other name is an arm evaluated once) and the statistics
table built from them:

- per arm and benchmark, the mean over seeds with a 95% interval (Student's t over the seeds;
  with one seed, a bootstrap over the benchmark's units, labelled so);
- per arm and benchmark, the delta against the baseline arm, paired by unit within each seed
  and then across the seeds both arms have, with a 95% interval and a p-value
  (``stats.seed_paired_bootstrap``); an interval that covers 0 reads "no detectable difference";
- how many seeds and units stand behind every cell.

It writes ``<prefix>_stats.md``, ``<prefix>_stats.csv`` (one row per cell) and
``<prefix>_forest.png`` (the deltas with their intervals). Every number is recomputed from
the evaluations' stored predictions (``evaluation.units``), so an interval is always of the
number the table prints. On request, the paper's published numbers are written beside the
arms it reports (``analysis.beside_paper``), after every statistic is computed.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from llava_norm.analysis.beside_paper import CSV_FIELDS, csv_values, markdown_section, paper_comparisons
from llava_norm.evaluation.benchmarks import BENCHMARKS
from llava_norm.evaluation.table import headline, read_run, write_table
from llava_norm.evaluation.units import Units, read_units
from llava_norm.provenance import read_record
from llava_norm.stats import Delta, Interval, binomial_tail, seed_paired_bootstrap, seeds_interval

SEED_MARK = "@seed"
LEVEL = 0.95
RESAMPLES = 2000


def run_name(arm: str, seed: int | None) -> str:
    """The name of one arm's run with one seed (None: the arm's only run)."""
    return arm if seed is None else f"{arm}{SEED_MARK}{seed}"


def split_name(name: str) -> tuple[str, int | None]:
    """``"ln_textnorm@seed2"`` -> ``("ln_textnorm", 2)``; a name without a seed is its own arm."""
    arm, mark, seed = name.rpartition(SEED_MARK)
    return (arm, int(seed)) if mark and arm and seed.isdigit() else (name, None)


def trained_seed(eval_dir: Path, benchmarks: list[str] | None = None, checkpoint: Path | None = None) -> int | None:
    """The seed the evaluated checkpoint was trained with, from the training record beside it
    (``llava_norm.provenance``): the checkpoint where it is now if given (moved since), else where
    the results say it was; None where they name no one checkpoint or it has no readable record."""
    if checkpoint is None:
        named = {r.get("settings", {}).get("checkpoint") for r in read_run(eval_dir, benchmarks)[1].values()}
        if len(named) != 1 or not next(iter(named)):
            return None
        checkpoint = Path(next(iter(named)))
    try:
        record = read_record(Path(checkpoint).parent)
    except ValueError:  # a record that does not read: the notes are information, not a refusal
        return None
    return record.seed if record else None


def seed_notes(runs: dict[str, Path], benchmarks: list[str] | None = None,
               checkpoints: dict[str, Path] | None = None) -> dict[str, list[str]]:
    """Per run, what its name says about its seed that its training record contradicts or leaves
    out (a mark of its rows). Why: seeds are read from the names (``<arm>@seed<k>``), so a
    hand-named run was paired with nothing, or with the wrong seed, without a word."""
    notes: dict[str, list[str]] = {}
    marked = {name for name in runs if split_name(name)[1] is not None}
    for name, eval_dir in runs.items():
        arm, seed = split_name(name)
        trained = trained_seed(Path(eval_dir), benchmarks, (checkpoints or {}).get(name))
        if seed is not None and trained is not None and seed != trained:
            notes[name] = [f"named seed {seed}, but its training record says seed {trained}: it pairs as seed {seed}"]
        elif seed is None and marked and trained is not None:
            notes[name] = [f"its name carries no seed, so it pairs with no seeded run (its training record says "
                           f"seed {trained}: `llava-norm eval --name {arm}{SEED_MARK}{trained}` names it so)"]
    return notes


@dataclass(frozen=True)
class Cell:
    """One arm on one benchmark: its score, and its delta against the baseline (None for the baseline)."""

    arm: str
    benchmark: str
    seeds: tuple[int | None, ...]  # the seeds behind the score
    n_units: int
    score: Interval  # percent
    score_method: str
    delta: Delta | None = None  # percent
    delta_seeds: tuple[int | None, ...] = ()  # the seeds both arms have: what the delta pairs
    note: str = ""
    identical: bool = False  # both arms scored the same on every paired unit: a delta of 0 by construction


def _seed_label(seeds) -> str:
    return ",".join("-" if s is None else str(s) for s in seeds)


def _aligned(base: Units, other: Units, where: str) -> Units:
    """``other``'s rows in ``base``'s unit order; the two must score the same units."""
    if set(base.ids) != set(other.ids):
        raise ValueError(f"{where}: the runs scored different units ({len(base.ids)} vs {len(other.ids)}); "
                         "evaluate them with the same benchmark files and --limit")
    position = {uid: i for i, uid in enumerate(other.ids)}
    order = [position[uid] for uid in base.ids]
    return Units(other.benchmark, base.ids, other.rows[order], other.statistic, other.correct[order],
                 other.chances[order], other.headline)


def _clipped(found, low: float, high: float):
    """An interval cut to what the quantity can be (a score in [0, 100], a delta in [-100, 100]):
    the cut one holds the truth whenever the uncut one does; t over 3 seeds can reach past both."""
    return replace(found, low=min(max(found.low, low), high), high=max(min(found.high, high), low))


def _score(units: dict[int | None, Units]) -> tuple[Interval, str]:
    statistic = next(iter(units.values())).statistic
    found = seeds_interval([u.rows for u in units.values()], statistic, level=LEVEL, resamples=RESAMPLES)
    method = (f"Student t over {len(units)} seeds joined with a bootstrap over seeds and units" if len(units) > 1
              else "bootstrap over units (one seed)")
    return _clipped(found, 0.0, 100.0), method


def _delta(pairs, statistic) -> Delta:
    """An arm's delta against the baseline over the seeds both have, cut to [-100, 100]."""
    return _clipped(seed_paired_bootstrap(pairs, statistic, level=LEVEL, resamples=RESAMPLES), -100.0, 100.0)


def missing_benchmarks(runs: dict[str, Path], benchmarks: list[str] | None = None) -> dict[str, list[str]]:
    """Benchmarks some runs have and others lack: ``{benchmark: [runs without it]}``. The table
    leaves them out (a column must compare every run) and says so."""
    found = {name: set(read_run(d, benchmarks)[1]) for name, d in runs.items()}
    every = set().union(*found.values()) if found else set()
    return {b: [n for n, names in found.items() if b not in names] for b in BENCHMARKS
            if b in every and not all(b in names for names in found.values())}


class IncompleteGrid(ValueError):
    """Runs the statistics cannot be made of (no baseline run, no benchmark every run has): the
    per-run table is still written, then this is said."""


def ablation_cells(runs: dict[str, Path], baseline: str, benchmarks: list[str] | None = None,
                   options: dict[str, dict] | None = None, data: dict[str, Path] | None = None) -> list[Cell]:
    """The cells of the statistics table for evaluated runs ``{run name: eval dir}``.

    ``baseline`` is an arm name; ``options`` the benchmark options the runs were evaluated
    with; ``data`` where each benchmark's files are now, if they moved since."""
    grouped: dict[str, dict[int | None, Path]] = {}
    for name, eval_dir in runs.items():
        arm, seed = split_name(name)
        grouped.setdefault(arm, {})[seed] = Path(eval_dir)
    if baseline not in grouped:
        raise IncompleteGrid(f"baseline arm {baseline!r} not among the runs' arms {sorted(grouped)}: the statistics "
                             "compare every arm with it, so they wait for its evaluations (the per-run table is written)")
    found = {name: set(read_run(d, benchmarks)[1]) for name, d in runs.items()}
    columns = [b for b in BENCHMARKS if all(b in names for names in found.values())]
    if not columns:
        raise IncompleteGrid("no benchmark was evaluated for every run")
    arms = [baseline] + [a for a in grouped if a != baseline]
    cells = []
    for benchmark in columns:
        units = {arm: {seed: read_units(d / f"{benchmark}.json", (options or {}).get(benchmark),
                                        (data or {}).get(benchmark))
                       for seed, d in sorted(grouped[arm].items(), key=lambda kv: -1 if kv[0] is None else kv[0])}
                 for arm in arms}
        # Every run's units in one order (the baseline's first run's), so rows pair by position.
        reference = next(iter(units[baseline].values()))
        units = {arm: {seed: _aligned(reference, u, f"{benchmark}: {arm}") for seed, u in found.items()}
                 for arm, found in units.items()}
        base = units[baseline]
        for arm in arms:
            mine = units[arm]
            score, method = _score(mine)
            cell = Cell(arm, benchmark, tuple(mine), len(reference.ids), score, method)
            if arm != baseline:
                shared = [s for s in mine if s in base]
                if shared:
                    pairs = [(base[s].rows, mine[s].rows) for s in shared]
                    cell = replace(cell, delta=_delta(pairs, reference.statistic), delta_seeds=tuple(shared))
                    if all(np.array_equal(a, b) for a, b in pairs):  # all "no" on POPE, all 0 on MMBench, say
                        cell = replace(cell, identical=True, note=IDENTICAL)
                else:
                    cell = replace(cell, note=f"no seed in common with {baseline}: no delta")
            cells.append(cell)
    return cells


ONE_SEED = "one seed: item noise only, seed-to-seed spread not measured"
IDENTICAL = ("both arms scored the same on every unit of every seed paired: the delta is 0 by construction, "
             "not evidence of no effect, and is left out of the count of deltas above and of the figure")


def _delta_text(delta: Delta) -> str:
    p = "p<0.001" if delta.p_value < 0.001 else f"p={delta.p_value:.3f}"
    core = f"{delta.estimate:+.2f} [{delta.low:+.2f}, {delta.high:+.2f}], {p}"
    core = f"{core}, {delta.verdict}"  # "higher" or "lower" where the interval excludes 0, as the CSV says
    return f"{core} ({ONE_SEED})" if delta.n_seeds == 1 else core


def _marked(arm: str, marks: dict[str, list[str]]) -> list[str]:
    """The marks of an arm's runs (stale steps kept, another code version), as ``run: mark``."""
    return [f"{name}: {mark}" for name, found in marks.items() if split_name(name)[0] == arm for mark in found]


def to_markdown(cells: list[Cell], baseline: str, marks: dict[str, list[str]] | None = None,
                missing: dict[str, list[str]] | None = None) -> str:
    """The table; ``marks`` (per run) put a † on an arm's rows, with the reasons under the table;
    ``missing`` names the benchmarks left out because some runs lack them."""
    marks = marks or {}
    columns = list(dict.fromkeys(c.benchmark for c in cells))
    arms = list(dict.fromkeys(c.arm for c in cells))
    at = {(c.arm, c.benchmark): c for c in cells}
    label = {b: f"{b} (units: {at[(baseline, b)].n_units})" for b in columns}
    methods = sorted({c.score_method for c in cells})
    lines = [
        "## Arms over training seeds", "",
        f"Percentages. **Scores**: the mean over training seeds [{LEVEL:.0%} interval, cut to 0-100]: "
        + "; ".join(methods) + ". **Deltas** against `" + baseline + "`: paired by unit within each seed, then "
        "across the seeds both arms have; a bootstrap interval widened to hold Student's t over the per-seed "
        "deltas where there are several seeds, and its p-value (`llava_norm.stats.seed_paired_bootstrap`). "
        "An interval that covers 0 reads *no detectable difference*; one that excludes it, *higher* or *lower*. "
        "The p-value counts a resampled delta of exactly 0 half to each side (mid-p) and the interval counts it "
        "whole, so where few units differ an interval that ends at 0 can stand beside p just under 0.05: the "
        "verdict follows the interval.", "",
        "### Scores", "",
        "| arm | seeds | " + " | ".join(label[b] for b in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    def name(arm: str) -> str:
        return f"{arm} †" if _marked(arm, marks) else arm

    for arm in arms:
        seeds = _seed_label(at[(arm, columns[0])].seeds)
        lines.append(f"| {name(arm)} | {seeds} | " + " | ".join(at[(arm, b)].score.format(digits=2) for b in columns) + " |")
    lines += ["", f"### Deltas against `{baseline}`", "",
              "| arm | seeds paired | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    notes = []
    for arm in arms[1:]:
        row = [at[(arm, b)] for b in columns]
        seeds = _seed_label(row[0].delta_seeds) if row[0].delta else "none"
        lines.append(f"| {name(arm)} | {seeds} | " + " | ".join(
            "identical on every unit" if c.identical else _delta_text(c.delta) if c.delta else "no delta"
            for c in row) + " |")
        notes += [f"- {arm}, {c.benchmark}: {c.note}" for c in row if c.note]
    held = [c for c in cells if c.delta and not c.identical and not c.delta.covers_zero]
    tested = sum(1 for c in cells if c.delta and not c.identical)
    if tested:
        chance = binomial_tail(len(held), tested, 1 - LEVEL)
        lines += ["", f"{len(held)} of {tested} deltas have an interval that excludes 0. Each interval is at "
                  f"{LEVEL:.0%}: with no effect anywhere, about {tested * (1 - LEVEL):.1f} of {tested} would exclude "
                  "0 by chance alone, so one such delta among many is not evidence of an effect." + (
                  " " f"{len(held)} or more would happen by chance with probability {chance:.2g} if the deltas were "
                  "independent (they are not quite: the arms share a baseline)." if held else "")]
    elif any(c.identical for c in cells):
        lines += ["", "Every delta is 0 by construction: the arms scored the same on every unit."]
    else:
        lines += ["", f"No delta: no arm but `{baseline}`, or none sharing a training seed with it."]
    daggers = [f"- † {arm}: {m}" for arm in arms for m in _marked(arm, marks)]
    left_out = [f"- not in the table: {b}, which {', '.join(names)} lack(s)" for b, names in (missing or {}).items()]
    legend = [f"- **{b}**: {headline(b).legend}." for b in columns]
    return "\n".join(lines + notes + daggers + left_out + ["", *legend]) + "\n"


def to_csv(cells: list[Cell], marks: dict[str, list[str]] | None = None,
           paper: dict[tuple[str, str], dict[str, object]] | None = None) -> str:
    """One row per cell; ``paper`` (``beside_paper.csv_values``) adds the paper's columns."""
    fields = ["arm", "benchmark", "seeds", "n_seeds", "n_units", "score", "score_low", "score_high", "score_method",
              "delta", "delta_low", "delta_high", "p_value", "delta_seeds", "verdict", "note"]
    fields += list(CSV_FIELDS) if paper is not None else []
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for c in cells:
        row = {"arm": c.arm, "benchmark": c.benchmark, "seeds": _seed_label(c.seeds), "n_seeds": len(c.seeds),
               "n_units": c.n_units, "score": round(c.score.estimate, 4), "score_low": round(c.score.low, 4),
               "score_high": round(c.score.high, 4), "score_method": c.score_method,
               "note": "; ".join(filter(None, [c.note, *_marked(c.arm, marks or {})]))}
        if c.delta:
            row.update(delta=round(c.delta.estimate, 4), delta_low=round(c.delta.low, 4),
                       delta_high=round(c.delta.high, 4), p_value=round(c.delta.p_value, 6),
                       delta_seeds=_seed_label(c.delta_seeds),
                       verdict="identical on every unit" if c.identical else
                       c.delta.verdict + (f" ({ONE_SEED})" if c.delta.n_seeds == 1 else ""))
        row.update((paper or {}).get((c.arm, c.benchmark), {}))
        writer.writerow(row)
    return buffer.getvalue()


def write_ablation(runs: dict[str, Path], prefix: str | Path, baseline: str, benchmarks: list[str] | None = None,
                   options: dict[str, dict] | None = None, data: dict[str, Path] | None = None,
                   marks: dict[str, list[str]] | None = None, paper: bool = False,
                   cells: list[Cell] | None = None) -> Path:
    """Write ``<prefix>_stats.md``, ``<prefix>_stats.csv`` and ``<prefix>_forest.png``; returns the Markdown path.
    ``paper`` adds the paper's published numbers beside the arms it reports (not to the figure).
    ``cells``: ``ablation_cells`` of the same arguments, computed already (a caller that reads and
    checks every run's predictions before it writes any table)."""
    # lazy: matplotlib loads only where a figure is drawn
    from llava_norm.analysis.plots import forest_grid

    cells = ablation_cells(runs, baseline, benchmarks, options, data) if cells is None else cells
    md, csv_path, png = (Path(f"{prefix}_stats.md"), Path(f"{prefix}_stats.csv"), Path(f"{prefix}_forest.png"))
    md.parent.mkdir(parents=True, exist_ok=True)
    text = to_markdown(cells, baseline, marks, missing_benchmarks(runs, benchmarks))
    published = None
    if paper:
        arms = {arm: [Path(d) for n, d in runs.items() if split_name(n)[0] == arm]
                for arm in dict.fromkeys(split_name(n)[0] for n in runs)}
        comparisons, notes = paper_comparisons(cells, arms, benchmarks)
        text += markdown_section(comparisons, notes)
        published = csv_values(comparisons)
    md.write_text(text)
    csv_path.write_text(to_csv(cells, marks, published))
    panels: dict[str, list[tuple[str, float, float, float]]] = {}
    for c in cells:
        if c.delta and not c.identical:
            panels.setdefault(c.benchmark, []).append((c.arm, c.delta.estimate, c.delta.low, c.delta.high))
    if panels:
        fig = forest_grid(panels, f"arm minus {baseline}, points (95% interval); grey: covers 0")
        fig.savefig(png, dpi=110)
    else:  # an earlier table's figure would stand beside deltas it does not show
        png.unlink(missing_ok=True)
    return md


def write_tables(runs: dict[str, Path], prefix: str | Path, baseline: str, first_run: str,
                 benchmarks: list[str] | None = None, options: dict[str, dict] | None = None,
                 data: dict[str, Path] | None = None, marks: dict[str, list[str]] | None = None,
                 checkpoints: dict[str, Path] | None = None, paper: bool = False) -> tuple[Path, Path, Path]:
    """The per-run table (``write_table``, its deltas against ``first_run``) and the statistics
    (``write_ablation``, against the arm ``baseline``) of evaluated runs ``{run name: eval dir}``.
    Returns the per-run Markdown, its CSV and the statistics' Markdown.

    Every run's predictions are read and checked against its results before any table is
    written, so a refused result leaves no table showing it. A grid the statistics cannot be
    made of (``IncompleteGrid``: no baseline run yet) still gets its per-run table, then raises."""
    seeds = seed_notes(runs, benchmarks, checkpoints)
    marks = {name: [*(marks or {}).get(name, []), *seeds.get(name, [])] for name in {*runs, *(marks or {})}}
    try:
        cells = ablation_cells(runs, baseline, benchmarks, options, data)
    except IncompleteGrid:
        cells = None  # write_ablation meets it again, after the per-run table
    md, csv_path, rechecked = write_table(list(runs.values()), prefix, baseline=first_run, marks=marks,
                                          benchmarks=benchmarks, checkpoints=checkpoints, data=data)
    # the statistics' rows carry the per-run table's marks too (a checkpoint changed since, say)
    marked = {name: found for name, found in rechecked.items() if name in runs and found}
    stats = write_ablation(runs, prefix, baseline, benchmarks, options, data, marked, paper, cells)
    return md, csv_path, stats
