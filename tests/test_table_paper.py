"""``llava-norm table --paper``: the paper's Table 4 numbers beside the arms it reports.

The evaluations are real ``llava-norm eval`` outputs of synthetic benchmarks whose predictions
are written before the evaluation starts (it resumes from them, so no model runs): each run's
score, and so whether the paper's number falls inside its interval, is chosen here. Which
paper row a run gets comes from the config.yaml beside its checkpoint, as for a trained run.
"""

import csv
import io
import json
import shutil
import types

import pytest
import yaml

from llava_norm.analysis.ablation import ablation_cells, write_ablation
from llava_norm.analysis.beside_paper import Comparison, paper_comparisons
from llava_norm.cli import main
from llava_norm.evaluation import runner
from llava_norm.evaluation.arguments import parse_eval_args
from llava_norm.evaluation.benchmarks import get_benchmark
from llava_norm.evaluation.paper import SIGLIP, TABLE_4, paper_row, same_backbone
from llava_norm.evaluation.predictions import PredictionStore
from llava_norm.evaluation.table import headline
from llava_norm.stats import Interval
from llava_norm_demo.synth import build_world

LLAMA = "meta-llama/Llama-3.2-3B-Instruct"
N_OCR = 20
# run name -> (llm, arm trained, OCRBench items answered right); None: no config.yaml at all.
RUNS = {
    "none": (LLAMA, "none", 8),  # 40.00%, a wide interval around it: the paper's 40.70 inside
    "ln_textnorm_gwc": (LLAMA, "ln_textnorm_gwc", N_OCR),  # 100%, interval [100, 100]: 44.10 outside
    "small": ("Qwen/Qwen2.5-0.5B-Instruct", "none", 5),  # a backbone the paper never trained
    "lost": (None, None, 5),  # its checkpoint has no run config: backbone unknown
}
POPE_OPTION = {"pope": {"split": "adversarial"}}  # non-default: the paper's POPE is all three splits


def _evaluate(root, name, llm, arm, right, world):
    """One run: a checkpoint folder (with a run config unless ``llm`` is None), predictions
    written up front, then ``llava-norm eval`` as a user runs it."""
    stage = root / name / "stage2"
    (stage / "model").mkdir(parents=True)
    (stage / "model" / "weights.bin").write_bytes(name.encode())  # what the checkpoint fingerprint reads
    (stage / "model" / "config.json").write_text("{}")  # a saved model's, which eval looks for first
    if llm is not None:
        model = {"llm": llm, "vision_tower": SIGLIP, "norm_alignment": arm}
        (stage / "config.yaml").write_text(yaml.safe_dump({"model": model}))
    out = root / name / "eval"
    ocr = get_benchmark("ocrbench").load(world / "ocrbench", None)
    PredictionStore(out, "ocrbench").append(0, [
        {"item_id": item.item_id, "prediction": item.meta["answers"][0] if i < right else "#"}
        for i, item in enumerate(ocr)])
    pope = get_benchmark("pope", **POPE_OPTION["pope"]).load(world / "pope", None)
    PredictionStore(out, "pope").append(0, [{"item_id": item.item_id, "prediction": "yes"} for item in pope])
    runner.run_evaluation(parse_eval_args([str(stage / "model"), "--benchmarks", "ocrbench,pope", "--data-root",
                                           str(world), "--option", "pope.split=adversarial", "--out", str(out),
                                           "--name", name]))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("paper")
    build_world(root / "world", seed=2, n_pretrain=0, n_instruct=0, n_text=0, n_bench=0,
                bench_sizes={"ocrbench": N_OCR, "pope": 4})
    model = types.SimpleNamespace(model=types.SimpleNamespace(to=lambda device: None))
    with pytest.MonkeyPatch.context() as patch:  # every prediction is on disk: nothing is asked of a model
        patch.setattr(runner, "load_bundle", lambda *args, **kwargs: model)
        patch.setattr(runner, "Predictor", lambda *args, **kwargs: None)
        return {name: _evaluate(root, name, *spec, root / "world" / "benchmarks") for name, spec in RUNS.items()}


def _arms(runs):
    return {name: [d] for name, d in runs.items()}


def test_the_paper_row_goes_beside_the_run_of_its_backbone_and_arm(runs):
    cells = ablation_cells(runs, "none", options=POPE_OPTION)
    comparisons, notes = paper_comparisons(cells, _arms(runs))
    found = {(c.arm, c.benchmark): c for c in comparisons}
    assert sorted(found) == [("ln_textnorm_gwc", "ocrbench"), ("none", "ocrbench")]  # not "small", not "lost"
    score = {(c.arm, c.benchmark): c.score for c in cells}
    base, gwc = found[("none", "ocrbench")], found[("ln_textnorm_gwc", "ocrbench")]
    assert base.paper.label == "paper: Llama-3.2-3B w/o Norm" and base.paper_value == 40.70
    assert gwc.paper.label == "paper: Llama-3.2-3B w/ Norm (w/ GWC)" and gwc.paper_value == 44.10
    assert base.ours == score[("none", "ocrbench")] and base.ours.estimate == pytest.approx(40.0)
    assert base.difference == pytest.approx(40.0 - 40.70)
    assert gwc.difference == pytest.approx(100.0 - 44.10)
    assert base.ours.low < 40.70 < base.ours.high and base.inside == "yes"
    assert gwc.ours.low == gwc.ours.high == 100.0 and gwc.inside == "no"
    assert any(n.startswith("lost: no config.yaml") for n in notes)
    assert [n for n in notes if "pope" in n and "non-default options" in n]  # POPE: one split, not compared
    assert not [n for n in notes if n.startswith("small")]  # no paper row is no problem


def test_the_paper_never_enters_our_statistics(runs, tmp_path):
    with_paper = write_ablation(runs, tmp_path / "a" / "t", "none", options=POPE_OPTION, paper=True)
    without = write_ablation(runs, tmp_path / "b" / "t", "none", options=POPE_OPTION)
    ours = without.read_text()
    assert with_paper.read_text().startswith(ours)  # the same statistics, the paper's section after them
    assert "paper" not in ours
    rows = list(csv.DictReader(io.StringIO((tmp_path / "a" / "t_stats.csv").read_text())))
    plain = list(csv.DictReader(io.StringIO((tmp_path / "b" / "t_stats.csv").read_text())))
    assert [{k: r[k] for k in plain[0]} for r in rows] == plain
    by_cell = {(r["arm"], r["benchmark"]): r for r in rows}
    assert by_cell[("none", "ocrbench")]["paper_row"] == "paper: Llama-3.2-3B w/o Norm"
    assert float(by_cell[("none", "ocrbench")]["paper_value"]) == 40.70
    assert float(by_cell[("ln_textnorm_gwc", "ocrbench")]["ours_minus_paper"]) == pytest.approx(55.90)
    assert by_cell[("ln_textnorm_gwc", "ocrbench")]["paper_inside_interval"] == "no"
    assert by_cell[("none", "ocrbench")]["paper_inside_interval"] == "yes"
    assert all(not r["paper_row"] for k, r in by_cell.items() if k[0] in ("small", "lost") or k[1] == "pope")


def test_llava_norm_table_paper_prints_the_labelled_rows(runs, tmp_path, capsys):
    main(["table", *(str(d) for d in runs.values()), "--baseline", "none", "--option", "pope.split=adversarial",
          "--out", str(tmp_path / "t"), "--paper"])
    text = (tmp_path / "t_stats.md").read_text()
    assert text in capsys.readouterr().out
    section = text[text.index("### The paper's numbers beside ours"):]
    assert "| paper: Llama-3.2-3B w/o Norm | 40.70 |" in section
    assert "| paper: Llama-3.2-3B w/ Norm (w/ GWC) | 44.10 |" in section
    assert "| ours minus paper | -0.70 |" in section and "| ours minus paper | +55.90 |" in section
    assert "| paper inside our 95% interval | yes |" in section and "| paper inside our 95% interval | no |" in section
    assert "ours: small" not in section and "probably MMBench" in section
    main(["table", *(str(d) for d in runs.values()), "--baseline", "none", "--option", "pope.split=adversarial",
          "--out", str(tmp_path / "u")])
    text = (tmp_path / "u_stats.md").read_text()  # off unless asked for (its runs' folders name "paper")
    assert "The paper's numbers" not in text and "paper: " not in text and "ours minus paper" not in text


def test_a_subset_is_said_and_an_arm_of_mixed_runs_is_not_compared(runs, tmp_path):
    cells = ablation_cells(runs, "none", options=POPE_OPTION)
    limited = tmp_path / "limited"
    shutil.copytree(runs["none"], limited)
    result = json.loads((limited / "ocrbench.json").read_text())
    result["settings"]["limit"] = 10
    (limited / "ocrbench.json").write_text(json.dumps(result))
    comparisons, notes = paper_comparisons(cells, {"none": [limited], "small": [runs["none"], runs["small"]]})
    assert [(c.arm, c.benchmark) for c in comparisons] == [("none", "ocrbench")]
    assert "none, ocrbench: ours is over the first 10 items (--limit), the paper's over the whole benchmark" in notes
    assert "small: its runs were trained as different backbones or arms; not compared" in notes
    # an arm one of whose runs was evaluated with a non-default option: not compared, whatever the others
    optioned = tmp_path / "optioned"
    shutil.copytree(runs["none"], optioned)
    result = json.loads((optioned / "ocrbench.json").read_text())
    result["settings"]["benchmark"]["max_new_tokens"] = 16
    (optioned / "ocrbench.json").write_text(json.dumps(result))
    comparisons, notes = paper_comparisons(cells, {"none": [runs["none"], optioned]})
    assert not [c for c in comparisons if c.benchmark == "ocrbench"]
    assert [n for n in notes if n.startswith("none, ocrbench: evaluated with non-default options")], notes


def test_no_interval_reads_n_a_and_is_never_invented():
    row = paper_row(LLAMA, SIGLIP, "none")
    unbounded = Comparison("none", "ocrbench", row, Interval(41.0, -float("inf"), float("inf"), note="one seed"))
    assert unbounded.inside == "n/a" and unbounded.difference == pytest.approx(0.30)


def test_a_run_matches_the_paper_by_its_llm_vision_tower_and_arm():
    assert paper_row(LLAMA, SIGLIP, "ln_textnorm_gwc").values == TABLE_4[("Llama-3.2-3B", "ln_textnorm_gwc")]
    assert paper_row("Qwen/Qwen2.5-7B-Instruct", SIGLIP, "none").backbone.label == "Qwen2.5-7B"
    assert paper_row(LLAMA, SIGLIP, "ln_textnorm") is None  # an arm the table does not carry
    assert paper_row(LLAMA, "openai/clip-vit-large-patch14-336", "none") is None  # the paper used SigLIP
    assert paper_row("Qwen/Qwen3-8B", SIGLIP, "none") is None
    assert same_backbone("/models/Llama-3.2-3B-Instruct/", LLAMA)  # a local copy named as the hub names it
    assert not same_backbone("someone/Llama-3.2-3B-Instruct", LLAMA)  # another upload of that name
    assert not same_backbone("/models/llama3b", LLAMA)


def test_the_papers_ocrbench_scale_is_our_headline(runs):
    # The paper's 40.70 is OCRBench's final score out of 1,000 divided by 10 (407 items right);
    # our headline is the share of items right in percent: on the full 1,000 items the same
    # number, so the paper's is compared as printed.
    metrics = json.loads((runs["none"] / "ocrbench.json").read_text())["metrics"]
    assert metrics["final_score"] == 8 and metrics["num_items"] == N_OCR
    assert headline("ocrbench").value(metrics) == pytest.approx(100 * metrics["final_score"] / metrics["num_items"])
    full = {"accuracy": 407 / 1000, "final_score_norm": 407 / 10}
    assert headline("ocrbench").value(full) == pytest.approx(full["final_score_norm"]) == pytest.approx(40.70)


def test_only_benchmarks_a_header_names_are_attributed():
    # The first column ("likely MMBench") and the unnamed second half are never attributed.
    assert {b for values in TABLE_4.values() for b in values} == {"mmstar", "pope", "seedbench2_plus", "ocrbench"}
    assert all(get_benchmark(b) for values in TABLE_4.values() for b in values)  # registry names, not labels


def test_the_caveats_arithmetic_on_the_papers_numbers():
    """What CAVEATS infers from the paper's values, redone: a share of items right is a count out
    of the benchmark's size (OCRBench 1,000 items, MMStar 1,500, SEED-Bench-2-Plus 2,277), given
    to two decimals rounded or cut."""
    import math

    from llava_norm.evaluation.paper import CAVEATS

    def counts(value: float, items: int, cut: bool) -> list[int]:
        two = (lambda x: math.floor(x * 100 + 1e-9) / 100) if cut else (lambda x: round(x, 2))
        return [right for right in range(items + 1) if two(100 * right / items) == value]

    rows = list(TABLE_4.values())
    assert all(counts(row["ocrbench"], 1000, cut) for row in rows for cut in (False, True))  # final score / 10
    assert not any(counts(row["mmstar"], 1500, cut) for row in rows for cut in (False, True))
    assert "none of its four values is a count out of MMStar's 1,500 items" in CAVEATS["mmstar"]
    seed = [row["seedbench2_plus"] for row in rows]
    assert [v for v in seed if not counts(v, 2277, False)] == [45.56, 58.27]
    assert [v for v in seed if not counts(v, 2277, True)] == [45.56] and counts(58.27, 2277, True) == [1327]
    assert "45.56 is no count out of its 2,277 items, rounded or cut to two decimals (58.27 is one only cut: 1,327)" \
        in CAVEATS["seedbench2_plus"]
