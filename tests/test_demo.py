"""The demo path end to end in its smoke profile (a handful of steps): every stage of
`make demo` runs, REPORT.md is written with the table, findings and figures, and a second
run reuses every finished step."""

import json
import subprocess
import sys

from PIL import Image

from launch import REPO, env

from llava_norm_demo.driver import PROFILES, DemoPaths, plan_demo
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
    for heading in ("## Mini benchmarks", "## Findings", "### Norms at the interface", "### Gradient flow"):
        assert heading in report
    assert "| none |" in report and "| ln_textnorm_gwc |" in report and "| chance (uniform guessing) |" in report
    assert "T/√d" in report or "Table 5" in report
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
    assert "answer text against letter (lm-eval `mmlu_continuation`" in report

    second = _demo(tmp_path)
    assert [s["status"] for s in second["steps"]] == ["reused"] * len(first["steps"])
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
    assert "one-sided binomial test of" in report  # every item-count benchmark is tested against guessing


def test_binomial_tail_against_enumeration():
    """The report's 'clearly above chance' rests on this tail: check it against brute force."""
    import itertools
    import math

    from llava_norm_demo.report import binomial_tail

    assert math.isclose(binomial_tail(3, 3, 0.5), 0.125) and binomial_tail(0, 5, 0.3) == 1.0
    assert math.isclose(binomial_tail(2, 4, 0.25), 1 - 0.75 ** 4 - 4 * 0.25 * 0.75 ** 3)
    for n, p in ((6, 0.25), (7, 1 / 3), (5, 0.9)):
        for k in range(n + 1):
            brute = sum(p ** sum(o) * (1 - p) ** (n - sum(o)) for o in itertools.product((0, 1), repeat=n)
                        if sum(o) >= k)
            assert math.isclose(binomial_tail(k, n, p), brute, rel_tol=1e-9, abs_tol=1e-15)
    # 42% of 150 four-way items is far beyond guessing; 27% is not
    assert binomial_tail(63, 150, 0.25) < 1e-5 < 0.2 < binomial_tail(40, 150, 0.25)
