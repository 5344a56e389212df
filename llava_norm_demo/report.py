"""The demo's diagnostics step and ``REPORT.md``: what the tiny runs measured, as verdicts.

Owns which checkpoints each diagnostic looks at in the demo (interface norms after stage 1 and
stage 2 of both arms, Table 5 statistics of the GWC arm, layer curves and attention of both
final models, App. F over the GWC arm's stage-1 checkpoints, gradient flow of fresh builds from
the warmed backbones, MMLU's answer texts against its letters for both final models) and the
report's layout: a one-screen summary of what held and what did not, with margins
(``verdicts``), then the figures, the benchmark scores with 95% intervals, the arm deltas with
paired-bootstrap intervals, the machine it ran on, the timings and the diagnostics.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llava_norm.analysis import SuiteInputs, run_suite
from llava_norm.analysis.plots import forest_figure, plt, training_figure
from llava_norm.data.prompts import PromptSettings
from llava_norm.evaluation.runner import run_evaluation
from llava_norm.evaluation.settings import EvalConfig, resolve_benchmarks
from llava_norm.evaluation.table import build_table, headline
from llava_norm.evaluation.units import Units, read_units
from llava_norm.model.builder import ModelSpec, build_model
from llava_norm.pipeline import ArmDirs, Step, recorded_step
from llava_norm.provenance import Record, environment, make_record
from llava_norm.stats import Delta
from llava_norm.train.rundir import SUMMARY as TRAIN_SUMMARY
from llava_norm_demo.synth.build import CORPUS_PATHS, MANIFEST
from llava_norm_demo.verdicts import Claim, Score, delta, load_json, mechanism_claims, score
from llava_norm_demo.warmup.run import REPORT as WARMUP_REPORT

BASELINE, ALIGNED = "none", "ln_textnorm_gwc"  # the demo's arms: no alignment; text-norm + GWC
ARMS = (BASELINE, ALIGNED)
SEED = 0

PROMPT, PHRASE = "What colour is the largest shape in the picture?", "largest shape"
INIT_LABEL = f"{ALIGNED} at initialisation"
CONTINUATION = "mmlu_continuation"
VERDICTS = "verdicts.json"  # beside REPORT.md
IDENTICAL_ITEMS = "identical on every item"  # the two arms' scored units: no delta to read (Benchmarks.verdict)
DIAGNOSTICS_MD = "diagnostics.md"  # in diagnostics/, nested into REPORT.md


def _fresh_aligned_build(paths, out_dir: Path) -> Path:
    """The text-norm + GWC arm as stage 1 starts it (warmed backbones, new projector and norm
    layer, seeded), saved so the interface analysis can read it like any checkpoint."""
    import torch

    torch.manual_seed(SEED)  # rebuilt every time (a second): the warmed backbones may have changed
    build_model(ModelSpec(str(paths.warm / "siglip"), str(paths.warm / "llama"), norm_alignment=ALIGNED)).save(out_dir)
    return out_dir


def _mmlu_continuation(paths, out: Path, limit: int | None) -> None:
    """Each arm's final model on the same MMLU questions in lm-eval's continuation formulation
    (answer texts scored, no letters), in-process: it tells a model that does not know the
    answers from one that cannot map them to a letter."""
    requests = resolve_benchmarks(["mmlu"], str(paths.benchmarks), {}, {"mmlu": {"formulation": "continuation"}})
    for arm in ARMS:
        run_evaluation(EvalConfig(checkpoint=str(paths.model(arm, 2)), out_dir=str(out / CONTINUATION / arm),
                                  benchmarks=requests, run_name=arm, prompt=PromptSettings(), limit=limit))


def diagnostics_step(paths, profile, code_counts: bool = False) -> Step:
    """Reused, like every other step, only when its provenance record matches: the models and
    runs it reads, the world and the warmed backbones by fingerprint, and its settings."""
    out = paths.demo / "diagnostics"
    models = {f"{arm} stage {stage}": paths.model(arm, stage) for arm in ARMS for stage in (1, 2)}

    def expected() -> Record:
        settings = {"analysis_images": profile.analysis_images, "eval_limit": profile.eval_limit,
                    "attention": [PROMPT, PHRASE], "seed": SEED}
        inputs = {**models, "dynamics run": paths.run(ALIGNED, 1), "warm backbones": paths.warm,
                  "world": paths.world / MANIFEST, "benchmarks": paths.benchmarks}
        return make_record("diagnostics", settings, inputs, seed=SEED)

    def run() -> None:
        shutil.rmtree(out, ignore_errors=True)  # its inputs changed: nothing in it (predictions included) holds
        stages = {INIT_LABEL: _fresh_aligned_build(paths, out / f"{ALIGNED}_init"), **models}
        run_suite(SuiteInputs(
            runs={arm: paths.run(arm, 2) for arm in ARMS},
            samples=paths.world, data=paths.world / CORPUS_PATHS["instruct"],
            image_folder=paths.images, dynamics_run=paths.run(ALIGNED, 1), interface_models=stages,
            gain_models={f"{ALIGNED} after stage {stage}": paths.model(ALIGNED, stage) for stage in (1, 2)},
            attention_prompt=PROMPT, attention_phrase=PHRASE, limit=profile.analysis_images,
        ), out, title="Diagnostics", report_path=out / DIAGNOSTICS_MD)
        _mmlu_continuation(paths, out, profile.eval_limit)

    return recorded_step("diagnostics", out, expected, run, code_counts)


def _curves(paths) -> dict[str, dict[str, list[tuple[int, float]]]]:
    curves: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for stage in (1, 2):
        for arm in ARMS:
            summary = load_json(paths.run(arm, stage) / TRAIN_SUMMARY) or {}
            history = summary.get("log_history", [])
            curves.setdefault(f"stage {stage}", {})[arm] = [(e["step"], e["loss"]) for e in history
                                                            if "loss" in e and "step" in e]
    return curves


def _losses(points: list[tuple[int, float]]) -> str:
    return f"{points[0][1]:.3f} → {points[-1][1]:.3f} ({points[-1][0]} steps)" if points else "-"


def machine(fresh: dict, env: dict) -> list[str]:
    """Where the numbers came from, per step as it was computed (a reused step keeps the
    machine that computed it): float kernels differ by CPU and thread count, so the last digits
    of every number do too (the verdicts do not; README). ``env``: this report's ``environment()``."""
    seen: dict[str, list[str]] = {}
    for step in fresh["steps"]:
        facts = step.get("machine")
        if facts:
            key = (f"{facts['cpu']}, {facts['cores']} cores; torch's kernel level {facts['cpu_kernels']}; "
                   f"{facts['threads']} threads per training and evaluation process, {facts['warmup_threads']} "
                   "in the warm-up")
            seen.setdefault(key, []).append(step["step"])
    lines = [f"- {key}." for key in seen] if len(seen) == 1 else \
        [f"- **Mixed machines**: {key}: {', '.join(steps)}." for key, steps in seen.items()]
    libraries = env["libraries"]
    return lines + [f"- Versions (this report): Python {platform.python_version()}, torch {libraries['torch']}, "
                    f"transformers {libraries['transformers']}, deepspeed {libraries['deepspeed']}, numpy "
                    f"{np.__version__}; {platform.platform()}. Each step's own record is its `provenance.json`."]


def merged_timings(demo: Path, timings: dict) -> dict:
    """Each step's last computed time and machine: a step reused now keeps the entry of the run
    that computed it (``timings_fresh.json``)."""
    previous = {s["step"]: s for s in (load_json(demo / "timings_fresh.json") or {"steps": []})["steps"]}
    steps = [s if s["status"] == "done" or s["step"] not in previous else previous[s["step"]]
             for s in timings["steps"]]
    fresh = {"profile": timings["profile"], "total_s": sum(s["seconds"] for s in steps), "steps": steps}
    (demo / "timings_fresh.json").write_text(json.dumps(fresh, indent=1) + "\n")
    return fresh


@dataclass(frozen=True)
class Benchmarks:
    """Per benchmark: each arm's units, scores and the delta of the aligned arm against the baseline."""

    labels: dict[str, str]
    units: dict[str, dict[str, Units]]  # benchmark -> arm -> units
    scores: dict[str, dict[str, Score]]
    deltas: dict[str, Delta]

    def verdict(self, name: str) -> str:
        """The delta's verdict; where both arms scored every item alike, that, not "no detectable
        difference": a delta of 0 by construction is no evidence either way."""
        base, aligned = self.units[name][BASELINE], self.units[name][ALIGNED]
        return IDENTICAL_ITEMS if np.array_equal(base.rows, aligned.rows) else self.deltas[name].verdict


def benchmarks(paths) -> Benchmarks:
    table = build_table([ArmDirs.of(paths.demo, arm).eval for arm in ARMS], baseline=BASELINE)
    units = {name: {arm: read_units(ArmDirs.of(paths.demo, arm).eval / f"{name}.json") for arm in ARMS}
             for name in table.columns}
    return Benchmarks(table.labels, units,
                      {name: {arm: score(u) for arm, u in by.items()} for name, by in units.items()},
                      {name: delta(by[BASELINE], by[ALIGNED]) for name, by in units.items()})


def _yes_share(units: Units) -> str:
    """POPE: how often the model says "yes" (column 1 of its unit rows), without which its F1
    cannot be read: always answering "yes" scores 66.7."""
    return f"; says yes to {100 * units.rows[:, 1].mean():.0f}%" if units.benchmark == "pope" else ""


def _continuation(paths, marks: Benchmarks) -> list[str]:
    """MMLU's answer texts against its letters, for the same questions and models."""
    files = {arm: paths.demo / "diagnostics" / CONTINUATION / arm / "mmlu.json" for arm in ARMS}
    if "mmlu" not in marks.units or not all(f.is_file() for f in files.values()):
        return []
    text = {arm: score(read_units(f, {"formulation": "continuation"})) for arm, f in files.items()}
    return ["", "## MMLU: answer texts against letters", "",
            "The same questions and models, scored as lm-eval's `mmlu_continuation` (the answer texts' "
            "log-likelihoods, no letters). Text above chance with letters not: the LLM knows answers it does "
            "not map to their letter.", "",
            "| arm | answer texts | letters |", "|---|---|---|",
            *[f"| {arm} | {text[arm].interval.format()}: {text[arm].describe()} | "
              f"{marks.scores['mmlu'][arm].interval.format()}: {marks.scores['mmlu'][arm].describe()} |"
              for arm in ARMS]]


def _cells(*cells: str) -> str:
    """A Markdown table row; a "|" inside a cell (mean|g|) is escaped."""
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _by_verdict(verdicts: dict[str, str]) -> str:
    """``"above chance on 2 (AI2D, HellaSwag); ..."`` from label -> verdict."""
    groups: dict[str, list[str]] = {}
    for label, verdict in verdicts.items():
        groups.setdefault(verdict, []).append(label)
    return "; ".join(f"{verdict} on {len(labels)} ({', '.join(labels)})" for verdict, labels in sorted(groups.items()))


def _summary(claims: list[Claim], marks: Benchmarks) -> list[str]:
    held = sum(c.held for c in claims)
    lines = ["## Summary", "",
             f"**The mechanism: {held} of {len(claims)} claims held** ({sum(c.by_construction for c in claims)} of "
             "them hold by how the arms are built and check the code; the others are properties of the trained "
             "models). Each is a number against a threshold far from where the last bits of a float kernel move it.",
             "", "| claim | paper | kind | measured | threshold | verdict |", "|---|---|---|---|---|---|",
             *[_cells(c.text, c.where, "by construction" if c.by_construction else "trained", c.measured,
                      c.threshold, f"{'**held**' if c.held else '**NOT held**'}, {c.margin}") for c in claims], ""]
    for arm in ARMS:
        lines.append(f"- **`{arm}` against guessing** (9 mini benchmarks, one training seed): "
                     + _by_verdict({marks.labels[n]: by[arm].above for n, by in marks.scores.items()}) + ".")
    lines += [f"- **`{ALIGNED}` against `{BASELINE}`** (paired bootstrap over items, one training seed per arm): "
              + _by_verdict({marks.labels[n]: marks.verdict(n) for n in marks.deltas})
              + ". Higher or lower means outside item noise only: one training seed per arm cannot tell an arm "
              "effect from training-run noise, which here is as large (README, \"What the tiny demo shows\").", ""]
    return lines


def _write_verdicts(path: Path, claims: list[Claim], marks: Benchmarks, fresh: dict, env: dict) -> None:
    """Every verdict of the report in one JSON file, so two runs (two machines, two thread
    settings) can be compared verdict by verdict."""
    verdicts = {
        "claims": [dataclasses.asdict(c) for c in claims],
        "against_guessing": {name: {arm: {"verdict": s.above, "score": s.interval.format(), "p": s.chance.p_value,
                                          "margin_points": s.margin} for arm, s in by.items()}
                             for name, by in marks.scores.items()},
        "deltas": {name: {"verdict": marks.verdict(name), "delta": d.format(), "estimate": d.estimate, "low": d.low,
                          "high": d.high, "p": d.p_value} for name, d in marks.deltas.items()},
        "machines": {s["step"]: s.get("machine") for s in fresh["steps"]},  # as each step was computed
        "environment": env,
    }
    path.write_text(json.dumps(verdicts, indent=1) + "\n")


def write_report(paths, profile, timings: dict) -> Path:
    demo, diag = paths.demo, paths.demo / "diagnostics"
    fresh, env = merged_timings(demo, timings), environment()
    warm = load_json(paths.warm / WARMUP_REPORT) or {"backbones": {}}
    claims = mechanism_claims(diag, BASELINE, ALIGNED, INIT_LABEL)
    marks = benchmarks(paths)
    names = list(marks.deltas)
    forest = forest_figure([(marks.labels[n], marks.deltas[n].estimate, marks.deltas[n].low, marks.deltas[n].high)
                            for n in names], f"{ALIGNED} − {BASELINE}, paired bootstrap 95% intervals "
                            "(one training seed)", "difference in points")
    forest.savefig(demo / "forest.png", dpi=110)
    curves = _curves(paths)
    training_figure(curves).savefig(demo / "training.png", dpi=110)
    plt.close("all")

    lines = [
        "# llava-norm demo report", "",
        f"Profile `{profile.name}`, seed {SEED}: arms `{BASELINE}` and `{ALIGNED}`, one training run each, written "
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}. Everything below was measured by the steps it lists under "
        "Time, each on the machine listed under Machine.", "",
        *_summary(claims, marks),
        "## Figures", "",
        "### Norms at the interface", "", "![interface norms](diagnostics/interface_norms.png)", "",
        "### Layer-to-layer cosines of image and text tokens", "", "![layer cosines](diagnostics/layers.png)", "",
        "### Arm deltas with 95% intervals", "", "![forest plot](forest.png)", "",
        "### Training curves", "", "![training curves](training.png)", "",
        "## Mini benchmarks", "",
        "Headline in percent, with a 95% bootstrap interval over items (MMBench: over questions); the intervals "
        "leave out training-run variation, which at this scale is as large. Against "
        "guessing: an exact test of the items right (p < 0.01: above chance; p < 0.05: borderline); the margin "
        "is the 95% Wilson low end of the share right minus guessing's. POPE's F1 is no count of items right, so "
        "its test counts its answers right (accuracy, chance 50%). Above chance means beating uniform guessing, "
        "not seeing the image. Free-form answers (OCRBench) have no guess to beat and are not tested.",
        *[f"{marks.labels[n]}'s headline is the {headline(n).legend}, as its scorer reports it, so it is not the "
          "share of items right beside it." for n in names if headline(n).macro], "",
        f"| benchmark | chance | {' | '.join(f'`{arm}`' for arm in ARMS)} |", "|---|---|" + "---|" * len(ARMS),
        *[f"| {marks.labels[n]} | {marks.scores[n][BASELINE].chance_level:.1f} | "
          + " | ".join(f"{marks.scores[n][arm].interval.format()}: {marks.scores[n][arm].describe()}"
                       f"{_yes_share(marks.units[n][arm])}" for arm in ARMS)
          + " |" for n in names],
        "", f"## Arm deltas: `{ALIGNED}` − `{BASELINE}`", "",
        "Paired bootstrap over the same items, one training seed per arm: an interval that covers 0 is no "
        f"detectable difference; arms right and wrong on the same items are said as \"{IDENTICAL_ITEMS}\" (a "
        "delta of 0 by construction, no evidence either way).", "",
        "| benchmark | delta [95% interval], p | verdict |", "|---|---|---|",
        *[f"| {marks.labels[n]} | {marks.deltas[n].format()} | {marks.verdict(n)} |" for n in names],
        *_continuation(paths, marks),
        "", "## Machine", "", *machine(fresh, env), "",
        "## Time", "",
        f"Each step's last computation: {fresh['total_s'] / 60:.1f} min in all.", "",
        "| step | seconds |", "|---|---|",
        *[f"| {s['step']} | {s['seconds']} |" for s in fresh["steps"]], "",
        "## Training", "",
        "| backbone warm-up | held-out loss before → after |", "|---|---|",
        *[f"| {name} | {e['before']['loss']:.3f} → {e['after']['loss']:.3f} |"
          for name, e in warm["backbones"].items()],
        "", "| arm | stage 1 loss | stage 2 loss |", "|---|---|---|",
        *[f"| {arm} | {_losses(curves['stage 1'][arm])} | {_losses(curves['stage 2'][arm])} |" for arm in ARMS], "",
    ]
    _write_verdicts(demo / VERDICTS, claims, marks, fresh, env)
    body = (diag / DIAGNOSTICS_MD).read_text().splitlines()  # written by the diagnostics step
    # nest its headings one level; its links are relative to diagnostics/, REPORT.md's to demo/
    lines += ["#" + line if line.startswith("#") else re.sub(r"\]\((?!https?:)", "](diagnostics/", line)
              for line in body]
    report = demo / "REPORT.md"
    report.write_text("\n".join(lines) + "\n")
    return report
