"""The demo's diagnostics step and ``REPORT.md``: what the tiny runs measured, stated as measured.

Owns which checkpoints each diagnostic looks at in the demo (interface norms after stage 1 and
stage 2 of both arms, Table 5 statistics of the GWC arm after stage 1, layer curves and
attention of both final models, App. F over the GWC arm's stage-1 checkpoints, gradient flow
of fresh builds from the warmed backbones, MMLU's answer texts against its letters for both
final models), the chance levels next to the results table (each benchmark's declared chance
rule over the items its evaluation scored), and sentences that compare numbers (e.g.
visual-token norm against T). Every sentence is computed from the JSON files; where the
numbers disagree with the paper, the sentence says so.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from transformers.utils import SAFE_WEIGHTS_NAME

from llava_norm.analysis import SuiteInputs, run_suite
from llava_norm.evaluation.benchmarks import get_benchmark
from llava_norm.evaluation.runner import EvalConfig, PromptSettings, resolve_benchmarks, run_evaluation
from llava_norm.evaluation.table import build_table, to_markdown
from llava_norm.model.builder import ModelSpec, build_model
from llava_norm.pipeline import ArmDirs, Step
from llava_norm_demo.synth.build import CORPUS_PATHS
from llava_norm.train.rundir import SUMMARY as TRAIN_SUMMARY
from llava_norm_demo.warmup.run import REPORT as WARMUP_REPORT

BASELINE, ALIGNED = "none", "ln_textnorm_gwc"  # the demo's arms: no alignment; text-norm + GWC
ARMS = (BASELINE, ALIGNED)
SEED = 0

PROMPT, PHRASE = "What colour is the largest shape in the picture?", "largest shape"
INIT_LABEL = f"{ALIGNED} at initialisation"
CONTINUATION = "mmlu_continuation"


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


def diagnostics_step(paths, profile) -> Step:
    out = paths.demo / "diagnostics"
    marker = out / "complete"

    def run() -> None:
        stages = {f"{arm} stage {stage}": paths.model(arm, stage) for arm in ARMS for stage in (1, 2)}
        stages = {INIT_LABEL: _fresh_aligned_build(paths, out / f"{ALIGNED}_init"), **stages}
        run_suite(SuiteInputs(
            runs={arm: paths.run(arm, 2) for arm in ARMS},
            samples=paths.world, data=paths.world / CORPUS_PATHS["instruct"],
            image_folder=paths.images, dynamics_run=paths.run(ALIGNED, 1), interface_models=stages,
            gain_models={f"{ALIGNED} after stage {stage}": paths.model(ALIGNED, stage) for stage in (1, 2)},
            attention_prompt=PROMPT, attention_phrase=PHRASE, limit=profile.analysis_images,
        ), out, title="Diagnostics", report_path=paths.demo / "diagnostics.md")
        _mmlu_continuation(paths, out, profile.eval_limit)
        marker.write_text(datetime.datetime.now().isoformat())

    def done() -> bool:
        finals = [paths.model(arm, 2) / SAFE_WEIGHTS_NAME for arm in ARMS]
        return marker.exists() and all(f.stat().st_mtime < marker.stat().st_mtime for f in finals)

    return Step("diagnostics", done, run)


@dataclass(frozen=True)
class Chance:
    """Uniform guessing on one benchmark, over the items its evaluation scored."""

    level: float  # expected headline, a fraction
    units: int  # scored units (items; MMBench: questions)
    fewest: int  # 1 / the largest and the smallest chance of a unit (the choices, for an MCQ)
    most: int
    macro: bool  # the headline averages group accuracies: a test over items approximates it


def chance_levels(paths, names: list[str], limit: int | None) -> dict[str, Chance]:
    """Each benchmark's declared chance rule over the items ``llava-norm eval`` scored: the
    same data directory (the runner's resolution) and the same limit."""
    levels = {}
    for request in resolve_benchmarks(names, str(paths.benchmarks), {}, {}) if names else []:
        bench = get_benchmark(request.name, **request.options)
        per_unit = bench.declaration.chance(bench.load(request.path, limit))
        odds = [round(1 / c) for c in per_unit if c > 0] or [0]
        levels[request.name] = Chance(sum(per_unit) / len(per_unit) if per_unit else 0.0, len(per_unit),
                                      min(odds), max(odds), bench.declaration.headline.macro)
    return levels


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): the chance that uniform guessing scores at least k of n."""
    if k <= 0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
                 + (n - i) * math.log1p(-p) for i in range(k, n + 1)]
    top = max(log_terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in log_terms))


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _losses(run: Path) -> str:
    summary = _load(run / TRAIN_SUMMARY)
    losses = [e["loss"] for e in (summary or {}).get("log_history", []) if "loss" in e]
    return f"{losses[0]:.3f} → {losses[-1]:.3f} ({len(losses)} steps)" if losses else "-"


# "Clearly above chance": uniform guessing would score this high less than 1% of the time.
CLEAR_P = 0.01


def _guessing_p(score: float, n: int, chance: float) -> float:
    """P(uniform guessing gets at least the items a score in percent of ``n`` items stands for)."""
    return binomial_tail(round(score / 100 * n), n, chance)


def _benchmark_verdict(column: str, table, chance: Chance) -> str:
    """How each arm's score on one mini benchmark stands against guessing (computed, not asserted)."""
    scores = {run: table.values[run][column] for run in table.runs}
    if column == "pope":  # F1 is no count of items right, and it rewards always answering "yes"
        shares = ", ".join(f"{run} {100 * table.metrics[run]['pope']['mean_over_splits']['predicted_yes_share']:.0f}%"
                           for run in table.runs)
        beats = all(score > 100 * 2 / 3 for score in scores.values())
        return (f"{'above' if beats else 'NOT above'} the F1 of always answering 'yes' (66.7) for every arm;"
                f" predicted 'yes' share: {shares}")
    n = chance.units
    if chance.level <= 0:  # free-form answers (OCRBench): count the hits instead
        return "free-form answers, which guessing never gets right: " + ", ".join(
            f"{run} {round(score / 100 * n)} of {n} right" for run, score in scores.items())
    p_values = {run: _guessing_p(score, n, chance.level) for run, score in scores.items()}
    clear = all(p < CLEAR_P for p in p_values.values())
    return (f"{'clearly above chance for every arm' if clear else 'NOT clearly above chance for every arm'}"
            f": one-sided binomial test of {n} items against uniform guessing, "
            + ", ".join(f"{run} p = {p:.1g}" for run, p in p_values.items())
            + (", approximate for a macro average" if chance.macro else "")
            + (f", with the mean of chances from 1/{chance.most} to 1/{chance.fewest}" if chance.fewest != chance.most else ""))


def _findings(diag: Path, table, chances: dict[str, Chance]) -> list[str]:
    lines = []
    interface = _load(diag / "interface_norms.json")
    if interface:
        by = {r["label"]: r for r in interface["rows"]}
        init = by.get(INIT_LABEL)
        if init:
            T, after = init["text_norm_T"], init["norm_output"]["mean"]
            lines.append(f"- At initialisation, text-norm + GWC: the norm layer outputs visual tokens of mean norm "
                         f"{after:.3g} = {after / T:.2f}× T (random projector output before it: "
                         f"{init['projector_output']['mean']:.3g}).")
        for stage in (1, 2):
            base, aligned = by.get(f"{BASELINE} stage {stage}"), by.get(f"{ALIGNED} stage {stage}")
            if not base or not aligned:
                continue
            T = base["text_norm_T"]
            visual, text = base["projector_output"]["mean"], base["text_tokens"]["mean"]
            verdict = "well above" if visual > 2 * T else "above" if visual > T else "NOT above (differs from the paper)"
            lines.append(f"- After stage {stage}, baseline: visual tokens enter the LLM with mean norm {visual:.3g}, "
                         f"{visual / T:.1f}× T = {T:.3g} ({verdict}); text-token embeddings average {text:.3g}.")
            after = aligned["norm_output"]["mean"]
            near = abs(after / T - 1) < 0.25
            lines.append(f"- After stage {stage}, text-norm + GWC: after the norm layer the visual tokens have mean "
                         f"norm {after:.3g} = {after / T:.2f}× T "
                         f"({'about T' if near else 'not close to T'}; projector output before it: "
                         f"{aligned['projector_output']['mean']:.3g}).")
    gains = _load(diag / "gain_stats.json")
    if gains:
        for row in gains["rows"]:
            if row["gain_l2"] is not None:
                lines.append(f"- Table 5, {row['label']}: ‖g‖ = {row['gain_l2']:.4g}, mean|g| = "
                             f"{row['gain_abs_mean']:.4g} ± {row['gain_abs_std']:.3g} (initial T/√d = "
                             f"{row['text_norm_init_abs_mean']:.4g}), mean|b| = {row['bias_abs_mean']:.3g}.")
    flow = _load(diag / "gradient_flow.json")
    if flow and flow.get("gwc_check"):
        check = flow["gwc_check"]
        ratio = check["observed_ratio"].get("projector_linears")
        if ratio is not None:
            lines.append(f"- Gradient flow (fresh builds, one batch): the projector's gradient with text-norm init "
                         f"and no GWC is {ratio:.4g}× the GWC arm's; METHOD.md predicts mean|g| = "
                         f"{check['predicted_ratio_mean_abs_g']:.4g}.")
    if table is not None:
        for column in table.columns:
            values = ", ".join(f"{run} {table.values[run][column]:.1f}" for run in table.runs)
            chance = chances[column]
            lines.append(f"- {table.labels[column]}: {values} (chance {100 * chance.level:.1f}; "
                         f"{_benchmark_verdict(column, table, chance)}).")
        lines += _continuation_finding(diag, table, chances.get("mmlu"))
    return lines


def _continuation_finding(diag: Path, table, chance: Chance | None) -> list[str]:
    """MMLU's answer texts against its letters, for the same questions and models (four
    continuations each way, so one chance level)."""
    scores = {run: _load(diag / CONTINUATION / run / "mmlu.json") for run in table.runs}
    if chance is None or "mmlu" not in table.columns or not all(scores.values()):
        return []
    n = chance.units
    text = {run: 100 * r["metrics"]["acc"] for run, r in scores.items()}
    p_text = {run: _guessing_p(v, n, chance.level) for run, v in text.items()}
    p_letter = {run: _guessing_p(table.values[run]["mmlu"], n, chance.level) for run in table.runs}
    knows = all(p < CLEAR_P for p in p_text.values())
    binds = all(p < CLEAR_P for p in p_letter.values())
    verdict = ("the LLM knows answers it does not map to their letter" if knows and not binds else
               "both formulations clearly above chance" if knows else
               "the answer texts are not clearly above chance either")
    return [f"- MMLU, answer text against letter (lm-eval `mmlu_continuation`, the same {n} questions and models): "
            + ", ".join(f"{run} {text[run]:.1f} (p = {p_text[run]:.1g})" for run in table.runs)
            + "; with letters " + ", ".join(f"{run} {table.values[run]['mmlu']:.1f}" for run in table.runs)
            + f" (chance {100 * chance.level:.1f}): {verdict}."]


def write_report(paths, profile, timings: dict) -> Path:
    demo, diag = paths.demo, paths.demo / "diagnostics"
    eval_dirs = [ArmDirs.of(demo, arm).eval for arm in ARMS]
    table = build_table(eval_dirs, baseline=BASELINE)
    chances = chance_levels(paths, table.columns, profile.eval_limit)
    fresh = _load(demo / "timings_fresh.json")
    if any(s["status"] == "done" and s["step"] != "diagnostics" for s in timings["steps"]) or fresh is None:
        fresh = timings
        (demo / "timings_fresh.json").write_text(json.dumps(timings, indent=1) + "\n")
    warm = _load(paths.warm / WARMUP_REPORT) or {"backbones": {}}

    lines = [
        "# llava-norm demo report", "",
        f"Profile `{profile.name}`, seed {SEED}, written {datetime.datetime.now():%Y-%m-%d %H:%M}, on "
        f"{platform.machine()} with {os.cpu_count()} CPU cores ({platform.platform()}). Everything below was "
        "measured by this run; nothing is copied from the paper.", "",
        "## Time", "",
        f"Last run that computed anything: {fresh['total_s'] / 60:.1f} min wall.", "",
        "| step | status | seconds |", "|---|---|---|",
        *[f"| {s['step']} | {s['status']} | {s['seconds']} |" for s in fresh["steps"]], "",
        "## Training", "",
        "| backbone warm-up | held-out loss before → after |", "|---|---|",
        *[f"| {name} | {e['before']['loss']:.3f} → {e['after']['loss']:.3f} |" for name, e in warm["backbones"].items()],
        "", "| arm | stage 1 loss | stage 2 loss |", "|---|---|---|",
        *[f"| {arm} | {_losses(paths.run(arm, 1))} | {_losses(paths.run(arm, 2))} |" for arm in ARMS],
        "", "## Mini benchmarks", "",
        to_markdown(table, extra_rows={"chance (uniform guessing)": {name: 100 * c.level for name, c in chances.items()}}),
        "## Findings (computed from the numbers below)", "",
        *_findings(diag, table, chances), "",
    ]
    body = (demo / "diagnostics.md").read_text().splitlines()  # written by the diagnostics step
    lines += ["#" + line if line.startswith("#") else line for line in body]  # nest its headings one level
    report = demo / "REPORT.md"
    report.write_text("\n".join(lines) + "\n")
    return report
