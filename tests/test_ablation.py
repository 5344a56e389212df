"""The statistics table (``analysis.ablation``) on real evaluations of models that differ by seed
and by arm: each cell is the statistic of the units the stored predictions give, the delta pairs
seed k of an arm with seed k of the baseline, and missing seeds shrink what is paired."""

import csv
import io

import numpy as np
import pytest
import torch

from llava_norm.analysis.ablation import (
    ablation_cells,
    split_name,
    to_csv,
    to_markdown,
    write_ablation,
)
from llava_norm.evaluation.arguments import parse_eval_args
from llava_norm.evaluation.runner import run_evaluation
from llava_norm.evaluation.units import read_units
from llava_norm.model.builder import ModelSpec, build_model
from llava_norm.stats import mean_over_seeds, seed_paired_bootstrap
from llava_norm_demo.synth import build_world

BENCHMARKS = ("mmlu", "hellaswag")  # scored by log-likelihood: untrained models land near chance, not at 0
ARMS = {"base": 0.0, "noisy": 0.5}  # extra noise the arm puts into the LLM
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("ablation")
    build_world(root / "world", seed=3, n_pretrain=4, n_instruct=4, n_text=10, n_bench=12)
    found = {}
    for arm, extra in ARMS.items():
        for seed in SEEDS:
            bundle = build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama", seed=seed))
            # Each seed and arm its own random LLM (the tiny one is untrained anyway): its own
            # predictions. (One generator per seed for both arms gave the noisy arm base's answers.)
            generator = torch.Generator().manual_seed(seed + (100 if extra else 0))
            with torch.no_grad():
                for weight in bundle.model.model.language_model.parameters():
                    weight.add_(torch.randn(weight.shape, generator=generator) * (1.0 + extra) * weight.std())
            name = f"{arm}@seed{seed}"
            bundle.save(root / name / "model")
            run_evaluation(parse_eval_args([str(root / name / "model"), "--benchmarks", ",".join(BENCHMARKS),
                                            "--data-root", str(root / "world/benchmarks"), "--out",
                                            str(root / name / "eval"), "--name", name]))
            found[name] = root / name / "eval"
    return found


def _units(runs, name, bench):
    return read_units(runs[name] / f"{bench}.json")


def test_scores_are_the_mean_over_seeds_of_each_runs_headline(runs):
    cells = {(c.arm, c.benchmark): c for c in ablation_cells(runs, "base")}
    assert sorted(cells) == sorted((a, b) for a in ARMS for b in BENCHMARKS)
    for (arm, bench), cell in cells.items():
        headlines = [_units(runs, f"{arm}@seed{s}", bench).headline for s in SEEDS]
        t = mean_over_seeds(headlines)
        assert cell.score.estimate == pytest.approx(t.estimate)
        assert cell.score.low <= max(t.low, 0.0) and cell.score.high >= min(t.high, 100.0)  # t inside it
        assert cell.seeds == SEEDS and cell.n_units == len(_units(runs, f"{arm}@seed0", bench).ids)
    assert any(c.score.low < c.score.high for c in cells.values()), "the seeds never disagree: nothing is tested"
    assert any(c.score.estimate > 0 for c in cells.values())


def test_the_delta_pairs_seed_k_with_seed_k(runs):
    mattered, differs = [], []
    for cell in ablation_cells(runs, "base"):
        if cell.arm == "base":
            assert cell.delta is None
            continue
        pairs = [(_units(runs, f"base@seed{s}", cell.benchmark).rows, _units(runs, f"noisy@seed{s}", cell.benchmark).rows)
                 for s in SEEDS]
        expected = seed_paired_bootstrap(pairs, _units(runs, "base@seed0", cell.benchmark).statistic)
        assert cell.delta == expected and cell.delta_seeds == SEEDS
        per_seed = [_units(runs, f"noisy@seed{s}", cell.benchmark).headline
                    - _units(runs, f"base@seed{s}", cell.benchmark).headline for s in SEEDS]
        assert cell.delta.estimate == pytest.approx(np.mean(per_seed))
        differs.append(cell.delta.estimate != 0)
        # Pairing the wrong seeds gives another delta where seeds differ: the pairing matters.
        shifted = seed_paired_bootstrap([(a, pairs[(i + 1) % 3][1]) for i, (a, _) in enumerate(pairs)],
                                        _units(runs, "base@seed0", cell.benchmark).statistic)
        mattered.append(shifted != expected)
    assert any(mattered), "no benchmark where the seeds' predictions differ: nothing is tested"
    assert any(differs), "no benchmark where the arms' scores differ: the estimate is not tested"


def test_missing_seeds_pair_only_what_both_arms_have(runs, tmp_path, monkeypatch):
    partial = {k: v for k, v in runs.items() if k != "noisy@seed2"}
    cells = {(c.arm, c.benchmark): c for c in ablation_cells(partial, "base")}
    noisy = cells[("noisy", "mmlu")]
    assert noisy.seeds == (0, 1) and noisy.delta_seeds == (0, 1) and noisy.delta.n_seeds == 2
    assert cells[("base", "mmlu")].seeds == SEEDS
    only_one = {k: v for k, v in runs.items() if k in ("base@seed0", "noisy@seed1")}
    lonely = {(c.arm, c.benchmark): c for c in ablation_cells(only_one, "base")}[("noisy", "mmlu")]
    assert lonely.delta is None and "no seed in common" in lonely.note
    assert lonely.score_method == "bootstrap over units (one seed)"
    # a delta of one seed says that the seeds' spread was not measured
    one = [c for c in ablation_cells({k: runs[k] for k in ("base@seed0", "noisy@seed0")}, "base")
           if c.arm == "noisy" and not c.identical]
    assert one, "no benchmark where the two runs differ: nothing is tested"
    verdicts = [row["verdict"] for row in csv.DictReader(io.StringIO(to_csv(one))) if row["arm"] == "noisy"]
    assert verdicts and all(v.endswith("(one seed: item noise only, seed-to-seed spread not measured)") for v in verdicts)
    import llava_norm.analysis.plots as plots

    drawn, draw = {}, plots.forest_grid
    monkeypatch.setattr(plots, "forest_grid", lambda panels, title: drawn.update(panels) or draw(panels, title))
    md = write_ablation(partial, tmp_path / "t", "base")
    assert md.read_text() == to_markdown(list(cells.values()), "base")
    assert (tmp_path / "t_forest.png").stat().st_size > 0 and (tmp_path / "t_stats.csv").is_file()
    # the figure draws each delta with its own interval (greyed where it covers 0: the test below)
    # (a delta of arms identical on every unit is 0 by construction: not drawn)
    shown = [c for c in cells.values() if c.delta and not c.identical]
    assert drawn == {b: [(c.arm, c.delta.estimate, c.delta.low, c.delta.high) for c in shown if c.benchmark == b]
                     for b in BENCHMARKS if any(c.benchmark == b for c in shown)}
    assert any(low < high for rows in drawn.values() for _, _, low, high in rows), drawn  # an interval to lose
    # the same prefix again with the baseline alone: no delta, and the two-arm figure not left beside it
    text = write_ablation({k: v for k, v in runs.items() if k.startswith("base@")}, tmp_path / "t", "base").read_text()
    assert not (tmp_path / "t_forest.png").exists()
    assert "No delta: no arm but `base`" in text and "0 of 0" not in text


def test_markdown_says_no_detectable_difference_exactly_where_the_interval_covers_zero(runs):
    """The noisy arm's two deltas given an interval that excludes 0 and one that covers it: only
    the second's cell says "no detectable difference"; the first says its direction, as the CSV."""
    from dataclasses import replace

    cells = ablation_cells(runs, "base")
    spans = iter([(1.0, 2.0), (-1.0, 1.0)])
    cells = [replace(c, delta=replace(c.delta, low=low, high=high), identical=False) if c.arm == "noisy" else c
             for c in cells for low, high in ([next(spans)] if c.arm == "noisy" else [(None, None)])]
    noisy = [c for c in cells if c.arm == "noisy"]
    assert [c.delta.covers_zero for c in noisy] == [False, True]
    lines = {line.split(" | ")[0].strip("| "): line for line in to_markdown(cells, "base").splitlines()
             if line.startswith("| noisy | 0,1,2 | ") and "[" in line and "p" in line}
    row = lines["noisy"].split(" | ")[2:]
    for text, cell in zip(row, noisy, strict=True):
        assert ("no detectable difference" in text) == cell.delta.covers_zero, text
        assert cell.delta.covers_zero or f", {'higher' if cell.delta.estimate > 0 else 'lower'}" in text, text


def test_the_count_of_deltas_excluding_zero_is_set_against_chance(runs):
    """Three of four deltas given intervals that exclude 0 (two above it, one below) and one an
    interval that covers it: the line under the table counts three, and with no effect anywhere
    5% of four, 0.2, would exclude 0 by chance."""
    from dataclasses import replace

    noisy = next(c for c in ablation_cells(runs, "base") if c.arm == "noisy")
    spans = [(1.0, 2.0), (-2.0, -1.0), (3.0, 4.0), (-1.0, 1.0)]
    cells = [replace(noisy, benchmark=b, delta=replace(noisy.delta, low=low, high=high))
             for b, (low, high) in zip(("mmlu", "hellaswag", "pope", "ai2d"), spans)]
    md = to_markdown([replace(c, arm="base", delta=None) for c in cells] + cells, "base")
    assert "3 of 4 deltas have an interval that excludes 0." in md
    assert "about 0.2 of 4 would exclude 0 by chance alone" in md
    # how likely that many by chance: P[X >= 3], X ~ Binomial(4, 0.05) = 4 * 0.05**3 * 0.95 + 0.05**4
    chance = 4 * 0.05 ** 3 * 0.95 + 0.05 ** 4
    assert f"3 or more would happen by chance with probability {chance:.2g} if the deltas were independent" in md
    # none excluding 0: the count said, and no "0 or more ... with probability 1"
    covering = [replace(c, delta=replace(c.delta, low=-1.0, high=1.0)) for c in cells]
    md = to_markdown([replace(c, arm="base", delta=None) for c in cells] + covering, "base")
    assert "0 of 4 deltas have an interval that excludes 0." in md and "or more would happen" not in md


def test_an_arm_that_scored_the_same_on_every_unit_is_not_counted_as_no_difference(runs):
    """Copies of the baseline's evaluations as another arm: every paired unit the same, so the
    delta is 0 by construction (all "no" on POPE in the tiny ablation): said so, not "no detectable
    difference", and left out of the count against chance."""
    same = {**runs, **{f"same@seed{s}": runs[f"base@seed{s}"] for s in SEEDS}}
    cells = ablation_cells(same, "base")
    copies = [c for c in cells if c.arm == "same"]
    assert copies and all(c.identical and c.delta.estimate == 0 for c in copies)
    assert any(not c.identical for c in cells if c.arm == "noisy")
    md = to_markdown(cells, "base")
    assert "| same | 0,1,2 | identical on every unit | identical on every unit |" in md, md
    counted = [c for c in cells if c.arm == "noisy" and not c.identical]
    assert f"of {len(counted)} deltas have an interval" in md  # the copies uncounted


def test_a_table_over_a_result_its_predictions_do_not_give_is_refused_before_anything_is_written(runs, tmp_path):
    """A result file whose headline its own stored predictions do not give (edited by hand, or
    mixed up): `llava-norm table` refuses it, and writes no table that shows it."""
    import json
    import shutil

    from llava_norm.cli import main

    edited = tmp_path / "noisy@seed0"
    shutil.copytree(runs["noisy@seed0"], edited)
    result = edited / "mmlu.json"
    stored = json.loads(result.read_text())
    stored["metrics"]["acc"] = 0.99
    result.write_text(json.dumps(stored))
    prefix = tmp_path / "tables" / "t"
    with pytest.raises(SystemExit) as stop:
        main(["table", str(runs["base@seed0"]), str(edited), "--out", str(prefix)])
    assert str(stop.value.code).startswith(f"table: {result}: its stored predictions score"), stop.value.code
    assert not prefix.parent.exists() or not list(prefix.parent.iterdir())


def test_runs_with_no_benchmark_in_common_are_said_in_one_line(runs, tmp_path):
    """Two runs that share no benchmark: one line naming what each has, no table written (the
    per-run table's average over no column was a ZeroDivisionError)."""
    import shutil

    from llava_norm.cli import main

    one, two = tmp_path / "base@seed0", tmp_path / "noisy@seed0"
    shutil.copytree(runs["base@seed0"], one)
    shutil.copytree(runs["noisy@seed0"], two)
    (one / "hellaswag.json").unlink()
    (two / "mmlu.json").unlink()
    prefix = tmp_path / "tables" / "t"
    with pytest.raises(SystemExit) as stop:
        main(["table", str(one), str(two), "--out", str(prefix)])
    assert stop.value.code == \
        "table: no benchmark was evaluated for every run: base@seed0: ['mmlu'], noisy@seed0: ['hellaswag']"
    assert not (tmp_path / "tables").exists()


def test_run_names_split_into_arm_and_seed():
    assert split_name("ln_textnorm@seed12") == ("ln_textnorm", 12)
    assert split_name("ln_textnorm") == ("ln_textnorm", None)
    assert split_name("odd@seedx") == ("odd@seedx", None)
    with pytest.raises(ValueError, match="baseline arm 'missing'"):
        ablation_cells({}, "missing")


def test_runs_that_scored_different_units_are_not_paired():
    """Two arms' rows are paired unit by unit: a run evaluated on other items (another --limit or
    file) is refused, not paired by position."""
    from llava_norm.analysis.ablation import _aligned
    from llava_norm.evaluation.units import Units

    def units(ids, right=None):
        right = np.zeros(len(ids)) if right is None else np.array(right, dtype=float)
        return Units("pope", ids, 100 * right[:, None], None, right, right / 2, 0.0)

    with pytest.raises(ValueError, match=r"pope: the runs scored different units \(2 vs 2\); evaluate them with the "
                                         r"same benchmark files and --limit"):
        _aligned(units(("a", "b")), units(("a", "c")), "pope")
    # the same ids in another order: each unit's row, right/wrong and chance travel with its id
    aligned = _aligned(units(("a", "b")), units(("b", "a"), right=[1, 0]), "pope")
    assert aligned.ids == ("a", "b")
    assert aligned.rows[:, 0].tolist() == [0, 100] and aligned.correct.tolist() == [0, 1]
    assert aligned.chances.tolist() == [0, 0.5]


def test_intervals_are_cut_to_what_a_score_or_a_delta_can_be():
    from llava_norm.analysis.ablation import _delta, _score
    from llava_norm.evaluation.units import Units

    def units(headline):
        return Units("pope", ("a",), np.full((1, 1), headline), lambda rows: float(rows[:, 0].mean()), np.zeros(1),
                     np.zeros(1), headline)

    score, method = _score({0: units(0.0), 1: units(0.0), 2: units(61.9)})  # t over 3 seeds reaches below 0
    uncut = mean_over_seeds([0.0, 0.0, 61.9])
    assert uncut.low < 0 and uncut.high > 100 and (score.low, score.high) == (0.0, 100.0)
    assert score.estimate == uncut.estimate
    assert method.startswith("Student t over 3 seeds")
    # a delta over 3 seeds of 0, 0 and 95 points: t reaches past -100 and 100, the cut one does not
    pairs = [(units(0.0).rows, units(arm).rows) for arm in (0.0, 0.0, 95.0)]
    statistic = units(0.0).statistic
    uncut, delta = seed_paired_bootstrap(pairs, statistic), _delta(pairs, statistic)
    assert uncut.low < -100 and uncut.high > 100 and (delta.low, delta.high) == (-100.0, 100.0)
    assert delta.estimate == uncut.estimate and delta.p_value == uncut.p_value


def test_a_benchmark_some_runs_lack_is_left_out_and_named(runs, tmp_path):
    import shutil

    partial = dict(runs)
    copy = tmp_path / "noisy@seed2"
    shutil.copytree(runs["noisy@seed2"], copy)
    (copy / "hellaswag.json").unlink()
    partial["noisy@seed2"] = copy
    text = write_ablation(partial, tmp_path / "t", "base").read_text()
    assert "- not in the table: hellaswag, which noisy@seed2 lack(s)" in text and "| hellaswag" not in text


def test_the_forest_plot_greys_exactly_the_intervals_that_cover_zero():
    from matplotlib.colors import to_hex

    from llava_norm.analysis.plots import forest_figure

    rows = [("covers", 0.5, -1.0, 2.0), ("on zero", 1.0, 0.0, 2.0), ("above", 2.0, 1.0, 3.0), ("below", -2.0, -3.0, -1.0)]
    figure = forest_figure(rows, "deltas", "points")
    marks = [to_hex(bars.lines[0].get_color()) for bars in figure.axes[0].containers]
    assert marks == [to_hex(c) for c in ("tab:gray", "tab:gray", "tab:green", "tab:red")]


def test_a_row_the_provenance_recheck_marks_is_marked_in_the_statistics_too(runs, tmp_path):
    """`llava-norm table` prints the statistics: a run whose checkpoint changed after it was
    evaluated is marked there (its arm's rows, the note under them, the CSV), not only in the
    per-run table beside it."""
    from llava_norm.cli import main

    config = runs["noisy@seed0"].parent / "model" / "config.json"
    kept = config.read_text()
    try:
        config.write_text(kept.replace("{", '{"edited": 1, ', 1))
        main(["table", *map(str, runs.values()), "--out", str(tmp_path / "t")])
    finally:
        config.write_text(kept)
    said = "noisy@seed0: stale: the checkpoint changed after it was evaluated"
    stats = (tmp_path / "t_stats.md").read_text()
    assert f"- † noisy: {said}" in stats and "| noisy †" in stats, stats
    assert stats.count("stale:") == 1  # that run's alone (every run here is marked for its missing training record)
    assert said in (tmp_path / "t_stats.csv").read_text()
    assert "stale: the checkpoint changed after it was evaluated" in (tmp_path / "t.md").read_text()


def test_a_table_made_away_from_the_checkpoints_marks_every_arms_statistics(runs, tmp_path):
    """The README's case of a table made on another machine: no checkpoint where the results say,
    so every arm's statistics rows (and the CSV) carry "cannot be verified", not only the
    per-run table."""
    from llava_norm.cli import main

    moved = [(run.parent / "model", run.parent / "model.away") for run in runs.values()]
    try:
        for here, away in moved:
            here.rename(away)
        main(["table", *map(str, runs.values()), "--out", str(tmp_path / "t")])
    finally:
        for here, away in moved:
            away.rename(here)
    stats = (tmp_path / "t_stats.md").read_text()
    for arm in ARMS:
        assert f"| {arm} †" in stats, stats
        assert f"- † {arm}: {arm}@seed0: checkpoint {runs[f'{arm}@seed0'].parent / 'model'} not found: cannot be " \
               "verified" in stats, stats
    assert "cannot be verified" in (tmp_path / "t_stats.csv").read_text()


def test_a_run_whose_stored_predictions_are_gone_is_named_with_how_many(runs, tmp_path):
    """The table re-scores each result from its stored predictions: some or all of them gone was
    said as "no prediction for 1 item(s)" (one unit's), naming neither the run nor the folder."""
    import shutil

    from llava_norm.cli import main

    copy = tmp_path / "noisy@seed0"
    shutil.copytree(runs["noisy@seed0"], copy)
    store = copy / "predictions" / "hellaswag"
    lines = [line for path in sorted(store.glob("rank*.jsonl")) for line in path.read_text().splitlines()]
    for path in store.glob("rank*.jsonl"):
        path.unlink()
    (store / "rank0.jsonl").write_text("".join(line + "\n" for line in lines[2:]))  # two records lost
    others = [str(d) for name, d in runs.items() if name != "noisy@seed0"]
    with pytest.raises(SystemExit) as refused:
        main(["table", *others, str(copy), "--out", str(tmp_path / "t")])
    said = str(refused.value.code)
    assert said.startswith(f"table: {copy / 'hellaswag.json'}: hellaswag: no stored prediction for 2 of its "
                           f"{len(lines)} item(s) (") and said.endswith(f") in {store}"), said


def test_an_evaluation_killed_before_its_summary_is_tabulated_under_its_run_name(runs, tmp_path):
    """Each finished <benchmark>.json records the run's name; the summary comes last. A folder
    named `eval` (eval's default --out) without a summary is still named as its run, where its
    results agree on one name."""
    import shutil

    from llava_norm.evaluation.table import EVAL_SUMMARY, read_run

    killed = tmp_path / "noisy@seed0" / "eval"
    shutil.copytree(runs["noisy@seed0"], killed)
    (killed / EVAL_SUMMARY).unlink()
    assert read_run(killed)[0] == "noisy@seed0"
    # results of two run names (one reused from an earlier --name): no name to take but the folder's
    result = killed / "mmlu.json"
    result.write_text(result.read_text().replace('"noisy@seed0"', '"earlier"'))
    assert read_run(killed)[0] == "eval"


def test_a_table_of_moved_benchmark_files_is_made_where_data_root_says_they_are_now(runs, tmp_path):
    """Results evaluated on files since moved: `table` refuses them naming the way on, and with
    --data-root (or --data NAME=PATH) checks and reads them where they are now, unmarked."""
    import shutil

    from llava_norm.cli import main

    world = next(iter(runs.values())).parents[1] / "world" / "benchmarks"
    moved = tmp_path / "moved"
    shutil.copytree(world, moved)
    evaluated = tmp_path / "evaluated"
    names = ["base@seed0", "noisy@seed0"]
    for name in names:  # evaluations whose recorded data path is gone
        shutil.copytree(runs[name], evaluated / name)
        for bench in BENCHMARKS:
            result = evaluated / name / f"{bench}.json"
            result.write_text(result.read_text().replace(str(world), str(tmp_path / "gone")))
    dirs = [str(evaluated / n) for n in names]
    with pytest.raises(SystemExit) as stop:
        main(["table", *dirs, "--out", str(tmp_path / "t")])
    assert "is gone or changed since it was scored (moved: llava-norm table's --data-root DIR" in str(stop.value.code)
    main(["table", *dirs, "--out", str(tmp_path / "t"), "--data-root", str(moved)])
    for table in ("t.md", "t_stats.md"):  # the files checked where they are now: no data mark
        text = (tmp_path / table).read_text()
        assert "cannot be verified" not in text and "data changed" not in text, text
    main(["table", *dirs, "--out", str(tmp_path / "u"), "--data", f"mmlu={moved / 'mmlu'}",
          "--data", f"hellaswag={moved / 'hellaswag'}"])
    assert (tmp_path / "u_stats.md").is_file()
