"""The paper's published numbers beside our arms in the statistics table (``llava-norm table --paper``).

Owns matching each arm of the statistics table to a row of the paper's Table 4
(``llava_norm.evaluation.paper``) by what its runs were trained as, read from the run config
beside each evaluated checkpoint (``model.llm``, ``model.vision_tower``,
``model.norm_alignment``), and the comparison written beside ours: the paper's number, ours
minus it, and whether it lies inside our 95% interval. It only reads cells whose statistics are
already computed, so the paper's numbers never enter a score, delta or interval; wherever they
are printed they are labelled as the paper's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llava_norm.evaluation.paper import CAVEATS, NOT_ATTRIBUTED, SOURCE, PaperRow, paper_row
from llava_norm.evaluation.table import read_run
from llava_norm.stats import Interval

IDENTITY = ("model.llm", "model.vision_tower", "model.norm_alignment")
CSV_FIELDS = ("paper_row", "paper_value", "ours_minus_paper", "paper_inside_interval")


@dataclass(frozen=True)
class Comparison:
    """One arm on one benchmark against the paper's number for the same backbone and arm."""

    arm: str
    benchmark: str
    paper: PaperRow
    ours: Interval  # the statistics table's score cell, percent

    @property
    def paper_value(self) -> float:
        return self.paper.values[self.benchmark]

    @property
    def difference(self) -> float:
        """Ours minus the paper's, in points."""
        return self.ours.estimate - self.paper_value

    @property
    def inside(self) -> str:
        """"yes" / "no": the paper's number lies inside our interval; "n/a" where ours has none
        (an unbounded interval would hold every number and say nothing)."""
        if not (math.isfinite(self.ours.low) and math.isfinite(self.ours.high)):
            return "n/a"
        return "yes" if self.ours.covers(self.paper_value) else "no"


def run_identity(eval_dir: str | Path, benchmarks: list[str] | None = None) -> tuple[str, str, str] | str:
    """(llm, vision tower, arm) the evaluated run was trained as, from the ``config.yaml`` beside
    the checkpoint its results name; a string says why that is unknown."""
    # lazy: omegaconf and the prompt module load only where a table asks for the paper
    from omegaconf import OmegaConf

    from llava_norm.data.prompts import run_config  # lazy: with omegaconf, above

    found = set()
    checkpoints = {r["settings"].get("checkpoint") or "" for r in read_run(eval_dir, benchmarks)[1].values()}
    for checkpoint in sorted(checkpoints):
        tree = run_config(checkpoint) if checkpoint else None
        values = tuple(OmegaConf.select(tree, key) for key in IDENTITY) if tree is not None else (None,)
        if None in values:
            return f"no config.yaml naming {', '.join(IDENTITY)} beside its checkpoint {checkpoint or '(unnamed)'}"
        found.add(tuple(str(v) for v in values))
    if len(found) != 1:
        return "its benchmarks were evaluated on checkpoints trained as different backbones or arms"
    return found.pop()


def _default_options(benchmark: str, recorded: dict) -> bool:
    # lazy: the benchmark registry loads only where a table asks for the paper
    from llava_norm.evaluation.benchmarks import get_benchmark

    # Through JSON, as the result file holds it, so a tuple in the settings compares equal.
    return json.loads(json.dumps(get_benchmark(benchmark).settings())) == recorded


def paper_comparisons(cells: Sequence, arms: dict[str, list[Path]],
                      benchmarks: list[str] | None = None) -> tuple[list[Comparison], list[str]]:
    """The comparisons for every arm (``{arm: its runs' eval dirs}``) whose runs share one
    backbone and arm the paper reports, and notes on what was not compared and why. An arm the
    paper does not report gets nothing, silently: that is the common case, not a problem."""
    comparisons, notes = [], []
    for arm, eval_dirs in arms.items():
        identities = {run_identity(d, benchmarks) for d in eval_dirs}
        unknown = sorted(i for i in identities if isinstance(i, str))
        if unknown or len(identities) != 1:
            why = unknown[0] if unknown else "its runs were trained as different backbones or arms"
            notes.append(f"{arm}: {why}; not compared")
            continue
        row = paper_row(*identities.pop())
        if row is None:
            continue
        results = [read_run(d, benchmarks)[1] for d in eval_dirs]
        for cell in cells:
            if cell.arm != arm or cell.benchmark not in row.values:
                continue
            settings = [r[cell.benchmark]["settings"] for r in results]
            if not all(_default_options(cell.benchmark, s.get("benchmark")) for s in settings):
                notes.append(f"{arm}, {cell.benchmark}: evaluated with non-default options (--option); the paper's "
                             "number is set only beside the benchmark as `llava-norm eval` runs it by default: "
                             "not compared")
                continue
            limits = sorted({s.get("limit") for s in settings if s.get("limit")})
            if limits:
                notes.append(f"{arm}, {cell.benchmark}: ours is over the first {limits[-1]} items (--limit), "
                             "the paper's over the whole benchmark")
            comparisons.append(Comparison(arm, cell.benchmark, row, cell.score))
    return comparisons, notes


def markdown_section(comparisons: list[Comparison], notes: list[str]) -> str:
    """One small table per compared arm: the paper's row, ours, the difference, the verdict."""
    lines = ["", f"### The paper's numbers beside ours: {SOURCE}", "",
             "**Published numbers, not from our runs**: they enter no score, delta or interval above. For each arm "
             "whose backbone (LLM and vision tower) and arm the paper reports: its number, ours with the 95% "
             "interval above, ours minus the paper's, and whether the paper's number lies inside our interval "
             "(n/a where ours has none). The paper reports one training run per cell, evaluated with its own "
             "code: a number outside our interval says the two differ by more than our item and seed noise, not "
             "which one is right.", ""]
    arms = list(dict.fromkeys(c.arm for c in comparisons))
    if not arms:
        lines.append("No arm in this table has a backbone and arm the paper reports.")
    for arm in arms:
        row = [c for c in comparisons if c.arm == arm]
        lines += ["| | " + " | ".join(c.benchmark for c in row) + " |", "|---|" + "---|" * len(row),
                  f"| {row[0].paper.label} | " + " | ".join(f"{c.paper_value:.2f}" for c in row) + " |",
                  f"| ours: {arm} | " + " | ".join(c.ours.format(digits=2) for c in row) + " |",
                  "| ours minus paper | " + " | ".join(f"{c.difference:+.2f}" for c in row) + " |",
                  "| paper inside our 95% interval | " + " | ".join(c.inside for c in row) + " |", ""]
    shown = list(dict.fromkeys(c.benchmark for c in comparisons))
    lines += [f"- {note}." for note in notes]
    lines += [f"- **{b}**: {CAVEATS[b]}." for b in shown]
    lines.append(f"- Not compared: {NOT_ATTRIBUTED}.")
    return "\n".join(lines) + "\n"


def csv_values(comparisons: list[Comparison]) -> dict[tuple[str, str], dict[str, object]]:
    """``CSV_FIELDS`` per (arm, benchmark) row of the statistics CSV; rows without a paper number
    leave them empty."""
    return {(c.arm, c.benchmark): {"paper_row": c.paper.label, "paper_value": c.paper_value,
                                   "ours_minus_paper": round(c.difference, 4), "paper_inside_interval": c.inside}
            for c in comparisons}
