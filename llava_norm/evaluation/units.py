"""Per-unit outcomes of a finished evaluation: what intervals and paired deltas resample.

Owns turning one ``<benchmark>.json`` (with its stored predictions and the benchmark file it
names) into its scored units: one row of numbers each (``Benchmark.unit_rows``), whether each
was right, guessing's chance of each (the benchmark's declared rule), and the statistic that
recomputes the headline from any resample of units, so every interval is of the number the
table prints. Nothing is recomputed from files that differ from the ones the result records.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

import numpy as np

from llava_norm.evaluation.benchmarks import get_benchmark
from llava_norm.evaluation.benchmarks.base import Benchmark, Item, listed
from llava_norm.evaluation.predictions import PredictionStore, read_json_output
from llava_norm.provenance import fingerprint
from llava_norm.stats import Statistic


@dataclass(frozen=True)
class Units:
    """One run's scored units on one benchmark."""

    benchmark: str
    ids: tuple[str, ...]  # the unit keys: equal for two runs on the same items, which pairs them
    rows: np.ndarray  # (n_units, k), as Benchmark.unit_rows documents
    statistic: Statistic  # rows of a resample -> headline in percent
    correct: np.ndarray  # 1/0 per unit: what a test against guessing counts
    chances: np.ndarray  # uniform guessing's chance of each unit
    headline: float  # percent; statistic(rows)


def units_of(bench: Benchmark, items: list[Item], predictions: dict) -> Units:
    """The units of one scored benchmark. The statistic over all rows must give back the
    headline ``score`` computes, and each unit must be right or wrong: else an error."""
    found = bench.unit_rows(items, predictions)
    recorded = bench.declaration.headline.value(bench.score(items, predictions))
    if not np.isclose(found.statistic(found.rows), recorded, atol=1e-9):
        raise ValueError(f"{bench.name}: its unit rows give {found.statistic(found.rows)}, its score {recorded}")
    if not np.isin(found.rows[:, 0], (0.0, 100.0)).all():
        raise ValueError(f"{bench.name}: unit_rows' column 0 must be 100 (right) or 0 (wrong) per unit")
    chances = np.array([bench.declaration.chance(unit)[0] for unit in found.units.values()])
    return Units(bench.name, tuple(found.units), found.rows, found.statistic, found.rows[:, 0] / 100, chances,
                 recorded)


def _settings_problem(path: Path, bench: Benchmark, recorded: dict) -> str:
    """Which of a result's recorded benchmark settings differ from ``bench``'s, and the way on:
    the option that was given at evaluation (a field of the benchmark), or an evaluation again
    where only the scoring's own description changed (another version)."""
    now = bench.settings()
    differing = [key for key in sorted(set(now) | set(recorded)) if now.get(key) != recorded.get(key)]
    accepted = {field.name for field in fields(bench)} if is_dataclass(bench) else set()
    options = [key for key in differing if key in accepted]

    def gives(key: str) -> bool:  # the recorded value is the option's own (not a description of it)
        try:
            built = get_benchmark(bench.name, **{key: recorded[key]}) if key in recorded else None
            return built is not None and built.settings().get(key) == recorded[key]
        except (ValueError, TypeError):
            return False

    given = [f"--option {bench.name}.{key}={recorded[key]}" for key in options if gives(key)]
    if given:
        way = f"give {' '.join(given)}, as at evaluation"
    elif options:
        way = f"give the option{'s' if len(options) > 1 else ''} it was evaluated with ({', '.join(options)})"
    else:
        way = "no option differs, so its scoring changed since (another version): evaluate it again with " \
            "--replace-stale"
    return f"{path}: recorded with other benchmark settings ({', '.join(differing)}); {way}"


def read_units(result_path: str | Path, options: dict | None = None, data: str | Path | None = None) -> Units:
    """The units behind one ``<benchmark>.json`` written by ``llava-norm eval``.

    The benchmark is rebuilt with ``options`` and must be the variant the result records; its
    data file (the recorded path, or ``data`` where it has moved) must have the recorded
    fingerprint; and the stored predictions must give the recorded headline. Any mismatch is
    an error naming the file."""
    path = Path(result_path)
    result = read_json_output(path)
    settings = result["settings"]
    bench = get_benchmark(result["benchmark"], **(options or {}))
    if bench.settings() != settings["benchmark"]:
        raise ValueError(_settings_problem(path, bench, settings["benchmark"]))
    data = Path(data or settings["data_path"])
    if not data.exists() or fingerprint(data) != settings["data_fingerprint"]:
        raise ValueError(f"{path}: its benchmark data {data} is gone or changed since it was scored (moved: "
                         "llava-norm table's --data-root DIR or --data NAME=PATH says where it is now)")
    store = PredictionStore(path.parent, bench.name)
    predictions = store.read_all().predictions
    items = bench.load(data, settings["limit"])
    missing = [item.item_id for item in items if item.item_id not in predictions]
    if missing:  # named here, whole: each unit's scoring would name its own first
        raise ValueError(f"{path}: {bench.name}: no stored prediction for {len(missing)} of its {len(items)} item(s) "
                         f"({listed(missing)}) in {store.dir}")
    units = units_of(bench, items, predictions)
    recorded = bench.declaration.headline.value(result["metrics"])
    if not np.isclose(units.headline, recorded, atol=1e-9):
        raise ValueError(f"{path}: its stored predictions score {units.headline}, the file says {recorded}")
    return units
