"""One source for each benchmark fact: every registered benchmark has a complete declaration,
and the runner, the results table, the intervals' units, the synthetic world and eval/README.md
all agree with it (they read it, or, for the README, state the same values)."""

import dataclasses
import json
import random
import re
from pathlib import Path

import pytest

from llava_norm.evaluation.benchmarks import BENCHMARKS, Declaration, GenerationItem, get_benchmark
from llava_norm.evaluation.settings import resolve_benchmarks
from llava_norm.evaluation.table import build_table, to_markdown
from llava_norm.evaluation.units import units_of
from llava_norm_demo.synth import build_world
from llava_norm_demo.synth.benchmarks import FOLDER, TEXT_WRITERS, VISION_WRITERS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("declared") / "tiny" / "world"  # a DemoPaths layout
    build_world(root, seed=1, n_pretrain=4, n_instruct=4, n_text=8, n_bench=6)
    return root


def _replies(items) -> dict:
    """A fixed, partly right set of predictions for any benchmark's items."""
    out = {}
    for i, item in enumerate(items):
        if isinstance(item, GenerationItem):
            answer = item.meta.get("answer")
            out[item.item_id] = answer if isinstance(answer, str) and i % 2 == 0 else "A"
        else:
            out[item.item_id] = [-float(k == item.gold and i % 2 == 0) for k in range(len(item.continuations))]
    return out


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_every_declaration_is_complete_and_true_to_its_benchmark(name, world):
    cls = BENCHMARKS[name]
    declared = cls.declaration
    assert isinstance(declared, Declaration) and declared.name == name == cls.name
    for field in dataclasses.fields(declared):
        value = getattr(declared, field.name)
        assert value or (field.name == "max_new_tokens" and declared.kind == "loglikelihood"), field.name
    assert callable(declared.prompt) and callable(declared.parser) and callable(declared.chance)
    assert declared.headline.column and declared.headline.metric and declared.headline.legend

    bench = get_benchmark(name)
    items = bench.load(world / FOLDER / declared.data_dir)  # the globs find the world's files
    assert items and bench.kind == declared.kind
    if declared.kind == "generate":
        assert {item.max_new_tokens for item in items} == {declared.max_new_tokens}
    metrics = bench.score(items, _replies(items))
    assert 0.0 <= declared.headline.value(metrics) <= 100.0  # the headline path exists in the metrics
    chances = declared.chance(items)
    assert chances and all(0.0 <= c <= 1.0 for c in chances)

    settings = bench.settings()
    assert settings["benchmark"] == name and settings["headline_metric"] == declared.headline.describe()
    assert settings.get("max_new_tokens") == declared.max_new_tokens
    json.dumps(settings)


def test_an_incomplete_declaration_is_refused():
    fields = dict(name="x", kind="generate", files=("*.tsv",), source="s", prompt=str, parser=str,
                  headline=BENCHMARKS["ai2d"].declaration.headline, chance=len, mirrors="m", max_new_tokens=8)
    assert Declaration(**fields).data_dir == "x"  # the data directory defaults to the name
    with pytest.raises(ValueError, match="empty"):
        Declaration(**{**fields, "files": ()})
    with pytest.raises(ValueError, match="max_new_tokens"):
        Declaration(**{**fields, "kind": "loglikelihood"})


def test_runner_and_synth_use_the_declared_data_directories(world):
    assert list(VISION_WRITERS) + list(TEXT_WRITERS) == list(BENCHMARKS)
    manifest = json.loads((world / "manifest.json").read_text())["benchmarks"]
    assert list(manifest) == list(BENCHMARKS)
    requests = resolve_benchmarks(["all"], str(world / FOLDER), {}, {})
    for request in requests:
        data_dir = BENCHMARKS[request.name].declaration.data_dir
        assert Path(request.path) == world / FOLDER / data_dir
        assert manifest[request.name]["path"].startswith(f"{FOLDER}/{data_dir}/")
    assert sorted(p.name for p in (world / FOLDER).iterdir()) == sorted(b.declaration.data_dir for b in BENCHMARKS.values())


def test_a_setting_for_a_benchmark_not_evaluated_is_refused_and_an_unknown_name_said_once(world):
    """--option or --data for a benchmark the run does not evaluate would be dropped silently; a
    name given as a benchmark and under --data is one unknown name."""
    root = str(world / FOLDER)
    with pytest.raises(ValueError, match=r"--data or --option for ai2d, which is not among the benchmarks evaluated "
                                         r"\(mmlu\)"):
        resolve_benchmarks(["mmlu"], root, {}, {"ai2d": {"variant": "no_mask"}})
    with pytest.raises(ValueError, match=r"--data or --option for pope"):
        resolve_benchmarks(["mmlu"], root, {"pope": root}, {})
    with pytest.raises(ValueError, match=r"unknown benchmark\(s\) \['mmbench'\]; valid names"):
        resolve_benchmarks(["mmbench"], root, {"mmbench": root}, {})


def _result(out: Path, run: str, name: str, metrics: dict, settings: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"benchmark": name, "run_name": run, "metrics": metrics,
                                                  "settings": {"benchmark": settings, "limit": None}}))


def test_table_columns_and_legend_are_the_declared_headlines(world, tmp_path):
    for run in ("a", "b"):
        for name in BENCHMARKS:
            bench = get_benchmark(name)
            items = bench.load(world / FOLDER / bench.declaration.data_dir)
            _result(tmp_path / run, run, name, bench.score(items, _replies(items)), bench.settings())
    table = build_table([tmp_path / "a", tmp_path / "b"])
    assert table.columns == list(BENCHMARKS)
    markdown = to_markdown(table)
    for name, cls in BENCHMARKS.items():
        headline = cls.declaration.headline
        assert table.labels[name].startswith(headline.column)
        assert f"{headline.legend}." in markdown
        metrics = json.loads((tmp_path / "a" / f"{name}.json").read_text())["metrics"]
        assert table.values["a"][name] == headline.value(metrics)


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_unit_rows_give_back_the_headline_on_any_subset_of_units(name, world):
    """What intervals resample: for random subsets of units, the statistic over their rows is
    the headline the benchmark's own score gives on their items; each unit is right or wrong;
    and guessing's chance per unit is the declared rule."""
    bench = get_benchmark(name)
    items = bench.load(world / FOLDER / bench.declaration.data_dir)
    replies = _replies(items)
    found = bench.unit_rows(items, replies)
    units = units_of(bench, items, replies)
    assert units.ids == tuple(found.units)
    assert sorted(i.item_id for u in found.units.values() for i in u) == sorted(i.item_id for i in items)
    assert set(units.correct) <= {0.0, 1.0} and len(units.correct) == len(units.ids)
    declared = bench.declaration.chance(items)
    assert len(units.chances) == len(declared) and units.chances.sum() == pytest.approx(sum(declared))
    rng = random.Random(name)
    keys = list(found.units)
    for _ in range(6):
        chosen = sorted(rng.sample(range(len(keys)), rng.randint(1, len(keys))))
        subset = [item for i in chosen for item in found.units[keys[i]]]
        expected = bench.declaration.headline.value(bench.score(subset, replies))
        assert found.statistic(found.rows[chosen]) == pytest.approx(expected, abs=1e-9), chosen


def _readme_rows(text: str, header: str) -> dict[str, list[str]]:
    """First-column benchmark name -> the other cells, for the table under ``header``."""
    table = text[text.index(header):].split("\n\n")[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_eval_readme_states_the_declared_directories_and_globs():
    text = (REPO / "eval" / "README.md").read_text()
    dirs = _readme_rows(text, "| benchmark name | sub-directory of `--data-root` |")
    assert {name: cells[0].strip("`") for name, cells in dirs.items()} == {
        name: cls.declaration.data_dir for name, cls in BENCHMARKS.items()}
    globs = _readme_rows(text, "| benchmark name | data to get | directory globs, in order |")
    assert set(globs) == set(BENCHMARKS)
    for name, cls in BENCHMARKS.items():
        listed = re.findall(r"`([^`]+)`", globs[name][1].split("dev:")[0])
        assert tuple(listed) == cls.declaration.files, name
