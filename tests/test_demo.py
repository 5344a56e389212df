"""The demo path end to end in its smoke profile (a handful of steps): every stage of
`make demo` runs, REPORT.md is written with its summary of verdicts, intervals and figures, and
a second run reuses every finished step."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from launch import REPO, env

from llava_norm_demo.driver import PROFILES, DemoPaths, plan_demo
from llava_norm.evaluation.units import read_units
from llava_norm.pipeline import run_steps

FIGURES = ("interface_norms", "top_norm_rows", "layers", "dynamics", "gain_stats", "gradient_flow", "attention")


def _demo(root):
    proc = subprocess.run([sys.executable, "-m", "llava_norm.cli", "demo", "--root", str(root), "--profile", "smoke"],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads((root / "demo/timings.json").read_text())


def test_smoke_demo_writes_the_report_then_reuses_every_step(tmp_path):
    first = _demo(tmp_path)
    assert all(s["status"] == "done" for s in first["steps"]), first
    report = (tmp_path / "demo/REPORT.md").read_text()
    for heading in ("## Summary", "## Figures", "## Mini benchmarks", "## Arm deltas", "## Machine",
                    "### Norms at the interface", "### Gradient flow"):
        assert heading in report
    summary = report[report.index("## Summary"):report.index("## Figures")]
    # the mechanism's claims, each a verdict with its threshold and margin
    claims = [line for line in summary.splitlines() if line.startswith("| ") and "**" in line]
    assert len(claims) == 7 and all(("**held**" in c) != ("**NOT held**" in c) for c in claims)
    assert "mean\\|g\\|" in summary  # a "|" inside a cell is escaped
    assert "against guessing" in summary and "one training seed" in summary
    for png in ("forest.png", "training.png"):
        assert f"]({png})" in report
        with Image.open(tmp_path / "demo" / png) as image:
            assert image.width > 200 and image.height > 100
    benchmarks = report[report.index("\n## Mini benchmarks"):report.index("\n## Arm deltas")]
    rows = [line for line in benchmarks.splitlines() if line.startswith("| ") and not line.startswith("| benchmark")]
    assert len(rows) == 9 and all(re.search(r"\d+\.\d \[\d+\.\d, \d+\.\d\]", r) for r in rows)
    # free-form answers have no guess to beat: no verdict against guessing is claimed
    assert "not tested against guessing" in next(r for r in rows if r.startswith("| OCRBench"))
    assert next(r for r in rows if r.startswith("| POPE")).count("says yes to") == 2  # F1 is unreadable without it
    # MMStar's headline is a mean over categories, which its count of items right is not
    assert "MMStar's headline is the average over categories (macro over L2 categories)" in benchmarks
    verdicts = json.loads((tmp_path / "demo/verdicts.json").read_text())  # every verdict of the report
    deltas = verdicts["deltas"]
    assert len(deltas) == 9 and all(d["low"] <= d["high"] and 0 < d["p"] <= 1 for d in deltas.values())
    assert [c["held"] for c in verdicts["claims"]] == ["**held**" in c for c in claims]
    guessing = verdicts["against_guessing"]
    assert len(guessing) == 9 and all(set(by) == {"none", "ln_textnorm_gwc"} for by in guessing.values())
    # each benchmark's delta verdict, in the table as in verdicts.json: arms that scored every item
    # alike are said as such (a delta of 0 by construction)
    table = report[report.index("\n## Arm deltas"):]
    for name, said in verdicts["deltas"].items():
        rows = [read_units(tmp_path / f"demo/{arm}/eval/{name}.json").rows for arm in ("none", "ln_textnorm_gwc")]
        assert (said["verdict"] == "identical on every item") == (rows[0].shape == rows[1].shape and
                                                                  (rows[0] == rows[1]).all()), (name, said)
        assert f" | {said['verdict']} |" in table, (name, said)
    machine = report[report.index("\n## Machine"):report.index("\n## Time")]
    assert "kernel level" in machine and "threads per training" in machine and "torch " in machine
    assert "Mixed machines" not in machine
    for name in FIGURES:
        png = tmp_path / "demo/diagnostics" / f"{name}.png"
        assert f"diagnostics/{name}.png" in report
        with Image.open(png) as image:
            assert image.width > 200 and image.height > 100
    for arm in ("none", "ln_textnorm_gwc"):
        results = json.loads((tmp_path / f"demo/{arm}/eval/summary.json").read_text())["benchmarks"]
        assert len(results) == 9
        # the same MMLU questions, answer texts scored instead of letters
        text = json.loads((tmp_path / f"demo/diagnostics/mmlu_continuation/{arm}/mmlu.json").read_text())["metrics"]
        assert text["formulation"] == "continuation" and text["num_items"] == results["mmlu"]["metrics"]["num_items"]
    assert "## MMLU: answer texts against letters" in report

    second = _demo(tmp_path)
    assert [s["status"] for s in second["steps"]] == ["reused"] * len(first["steps"])
    # Diagnostics that rerun start from an empty folder: predictions left from other checkpoints
    # cannot block them. The report keeps each step's time and machine as it was computed.
    diag = tmp_path / "demo/diagnostics"
    result = diag / "mmlu_continuation/none/mmlu.json"
    stale = json.loads(result.read_text())
    stale["settings"]["checkpoint_fingerprint"] = "0" * 20  # as if scored on another checkpoint
    result.write_text(json.dumps(stale))
    store = diag / "mmlu_continuation/none/predictions/mmlu/settings.json"
    store.write_text(json.dumps(stale["settings"]))
    (diag / "provenance.json").unlink()
    third = {s["step"]: s for s in _demo(tmp_path)["steps"]}
    assert [name for name, s in third.items() if s["status"] == "done"] == ["diagnostics"]
    kept = {s["step"]: s for s in json.loads((tmp_path / "demo/timings_fresh.json").read_text())["steps"]}
    assert kept["synthetic world"] == first["steps"][0] and kept["diagnostics"] == third["diagnostics"]
    assert all(s["machine"]["threads"] == 1 for s in kept.values())
    # One reuse rule: the world's record notices a changed file, and nothing downstream of an
    # unchanged input is rerun for it.
    paths = DemoPaths(tmp_path.resolve())
    image = next(p for p in sorted(paths.images.rglob("*")) if p.is_file())
    image.write_bytes(image.read_bytes() + b"\0")
    decisions = {}
    run_steps(plan_demo(paths, PROFILES["smoke"]), dry_run=True, decisions=decisions)
    assert decisions["synthetic world"].reasons == ["its output was changed after it was recorded"]
    assert decisions["tiny backbones"].reuse and decisions["backbone warm-up"].reuse
    assert any(r.startswith("input data.mixture.0.image_folder changed") for r in decisions["none: stage 1"].reasons)

    # The intervals read the evaluation's own files: changed benchmark data is refused.
    result = tmp_path / "demo/none/eval/mmlu.json"
    assert read_units(result).headline == json.loads(result.read_text())["metrics"]["acc"] * 100
    # read with another option than it was evaluated with: the option to give is named
    with pytest.raises(ValueError, match=r"settings \(num_fewshot\); give --option "
                                         r"mmlu.num_fewshot=0, as at evaluation$"):
        read_units(result, options={"num_fewshot": 5})
    kept = result.read_text()  # its scoring described otherwise (an earlier version): evaluate it again
    recorded = json.loads(kept)
    recorded["settings"]["benchmark"]["answer_rule"] = "an earlier rule"
    result.write_text(json.dumps(recorded))
    with pytest.raises(ValueError, match=r"\(answer_rule\); no option differs, .* with --replace-stale$"):
        read_units(result)
    result.write_text(kept)
    data = Path(json.loads(result.read_text())["settings"]["data_path"])
    data = next(p for p in sorted(data.rglob("*")) if p.is_file()) if data.is_dir() else data
    data.write_bytes(data.read_bytes() + b"\n")
    with pytest.raises(ValueError, match="gone or changed"):
        read_units(result)



def test_arms_that_scored_every_item_alike_are_said_identical_not_no_detectable_difference():
    """A delta of 0 by construction (both arms right on the same items) is no evidence of no
    effect: the report's verdict says the items were scored alike, where one item apart reads as
    the paired bootstrap's verdict."""
    import numpy as np

    from llava_norm.evaluation.units import Units
    from llava_norm.stats import MeanOf
    from llava_norm_demo.report import ALIGNED, BASELINE, Benchmarks, _summary
    from llava_norm_demo.verdicts import delta, score

    def units(name, right):
        rows = np.array(right, dtype=float)[:, None]
        return Units(name, tuple(map(str, range(len(right)))), rows, MeanOf(), rows[:, 0], np.full(len(right), 0.5),
                     100 * rows.mean())

    right = [1, 0] * 20
    by = {"same": {BASELINE: units("same", right), ALIGNED: units("same", right)},
          "apart": {BASELINE: units("apart", right), ALIGNED: units("apart", [1 - right[0], *right[1:]])}}
    marks = Benchmarks({"same": "Same", "apart": "Apart"}, by,
                       {n: {arm: score(u) for arm, u in arms.items()} for n, arms in by.items()},
                       {n: delta(arms[BASELINE], arms[ALIGNED]) for n, arms in by.items()})
    assert marks.verdict("same") == "identical on every item"
    assert marks.verdict("apart") == marks.deltas["apart"].verdict == "no detectable difference"
    said = "\n".join(_summary([], marks))
    assert "identical on every item on 1 (Same); no detectable difference on 1 (Apart)" in said, said


def test_the_demos_code_counts_reaches_its_plan_and_reruns_a_step_another_version_recorded(tmp_path, monkeypatch):
    """`llava-norm demo --code-counts` (README): a step recorded by another code version is noted
    and kept without it, and rerun with it. The command runs as typed, through the demo's own
    plan, down to the first step's decision (a dry run of it), where it is stopped."""
    import llava_norm_demo.driver as driver
    from llava_norm.cli import main
    from llava_norm.provenance import fingerprint, make_record, write_record

    paths = DemoPaths(tmp_path.resolve())
    paths.world.mkdir(parents=True)
    (paths.world / "manifest.json").write_text("{}")
    record = make_record("world", {"build_world": dict(PROFILES["smoke"].world)}, {}, seed=driver.SEED)
    record.complete, record.outputs = True, {"folder": fingerprint(paths.world)}
    record.environment = {**record.environment, "source": "another"}  # as if written by other code
    write_record(paths.world, record)

    class Decided(Exception):
        pass

    def first_step_only(steps, **kwargs):
        decisions = {}
        run_steps(steps[:1], dry_run=True, decisions=decisions)
        raise Decided(decisions["synthetic world"])

    monkeypatch.setattr(driver, "run_steps", first_step_only)
    for counts in (False, True):
        with pytest.raises(Decided) as decided:
            main(["demo", "--root", str(tmp_path), "--profile", "smoke", *(["--code-counts"] if counts else [])])
        world = decided.value.args[0]
        assert world.reuse is not counts, world
        assert any(line.startswith("code: ") for line in (world.reasons if counts else world.notes)), world


def test_the_ablation_runs_every_arm_over_three_seeds_on_half_the_demos_schedule(tmp_path, monkeypatch):
    """`llava-norm ablation` (docs/ablation.md): the demo's shared steps, then 9 arms x 3 seeds,
    the baseline first, each stage at half the demo's steps; planned here, nothing run."""
    import llava_norm_demo.ablation as ablation
    from llava_norm.config import load_config

    planned, configs, plan = [], [], ablation.plan
    monkeypatch.setattr(ablation, "plan", lambda config: configs.append(config) or plan(config))
    monkeypatch.setattr(ablation, "run_steps", lambda steps, **kwargs: planned.extend(steps) or [])
    ablation.run_ablation(tmp_path)
    names = [step.name for step in planned]
    assert names[:3] == ["synthetic world", "tiny backbones", "backbone warm-up"] and names[-1] == "results table"
    arms = list(dict.fromkeys(name.split("@")[0] for name in names[3:-1]))
    assert len(arms) == 9 and arms[0] == "none" and set(arms) == set(ablation.NORM_ARMS)
    chains = {name.split(":")[0] for name in names[3:-1]}
    assert chains == {f"{arm}@seed{seed}" for arm in arms for seed in (0, 1, 2)}
    (config,) = configs
    for stage, given in ((1, config.stage1_overrides), (2, config.stage2_overrides)):
        demo = load_config(REPO / f"configs/tiny/none/stage{stage}.yaml", check_paths=False).train.max_steps
        assert f"train.max_steps={demo // 2}" in given and not PROFILES["full"].__dict__[f"stage{stage}"]
