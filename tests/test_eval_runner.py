"""The evaluation runner end to end: all nine benchmarks on a tiny model, data-parallel merge,
kill-and-resume without double counting, the per-benchmark JSONs and the results table."""

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llava_norm.evaluation.predictions import DamagedFileError, PredictionStore, SettingsMismatchError
from llava_norm.evaluation.table import COMPARABLE, build_table, to_csv, to_markdown, write_table
from llava_norm.model.builder import ModelSpec, build_model
from llava_norm_demo.synth import build_world

from launch import REPO, env, processes_of, snapshot

NINE = ["mmbench_en_dev", "mmstar", "ocrbench", "seedbench2_plus", "scienceqa_img", "ai2d", "pope",
        "hellaswag", "mmlu"]


# ------------------------------------------------------------------ prediction files
def test_torn_line_is_cut_and_duplicates_are_counted_once(tmp_path):
    store = PredictionStore(tmp_path, "pope")
    store.append(0, [{"item_id": "a", "prediction": "yes"}, {"item_id": "b", "prediction": "no"}])
    with open(store.rank_file(0), "a") as f:
        f.write('{"item_id": "c", "predic')  # a writer killed mid-line
    assert set(store.read_all().predictions) == {"a", "b"}
    store.repair(0)
    store.append(0, [{"item_id": "c", "prediction": "yes"}])
    store.append(1, [{"item_id": "a", "prediction": "no"}])  # a stray duplicate from another rank file
    with open(store.rank_file(1), "ab") as f:  # a writer killed inside a character: a rank file not repaired
        f.write('{"item_id": "d", "prediction": "é'.encode()[:-1])
    merged = store.read_all()
    assert merged.predictions == {"a": "yes", "b": "no", "c": "yes"}
    assert merged.duplicates == 1
    store.rank_file(2).write_bytes(b'\xff\xfe\n')  # a whole line that is no UTF-8: damaged, and named
    with pytest.raises(DamagedFileError, match=f"{store.rank_file(2)}:1: not a prediction record"):
        store.read_all()


def test_each_item_is_batched_as_in_a_run_never_stopped_whatever_the_process_count():
    """A row's logits move with its batch's padding, so the batches must not depend on the
    process count or on what a kill left: the union over ranks is the one-process plan's
    batches, those still to do, each whole (a batch the kill cut short included)."""
    from types import SimpleNamespace

    from llava_norm.evaluation.runner import rank_batches

    items = [SimpleNamespace(item_id=str(i)) for i in range(11)]
    ids = lambda batches: sorted(tuple(item.item_id for item in batch) for batch in batches)
    one_go = ids(rank_batches(items, {}, 3, 0, 1))
    assert one_go == sorted([("0", "1", "2"), ("3", "4", "5"), ("6", "7", "8"), ("9", "10")])
    for world in (2, 3, 5):
        assert ids(sum((rank_batches(items, {}, 3, r, world) for r in range(world)), [])) == one_go
    # two ranks killed: rank 0 after its first batch, with one record of its second written (a
    # write the kill cut short), rank 1 after its first
    done = {"0": "x", "1": "x", "2": "x", "6": "x", "3": "x", "4": "x", "5": "x"}
    for world in (1, 2, 4):
        left = ids(sum((rank_batches(items, done, 3, r, world) for r in range(world)), []))
        assert left == sorted([("6", "7", "8"), ("9", "10")]), (world, left)


def test_predictions_from_other_settings_are_refused_and_from_other_paths_to_the_same_files_kept(tmp_path):
    store = PredictionStore(tmp_path, "mmlu")
    recorded = {"checkpoint": "/a", "checkpoint_fingerprint": "f", "data_path": "/d", "data_fingerprint": "g",
                "limit": None}
    store.write_settings(recorded)
    store.verify_settings(recorded)
    # the same checkpoint and data, copied or mounted elsewhere: the same predictions
    store.verify_settings({**recorded, "checkpoint": "/copy/of/a", "data_path": "/mnt/d"})
    for key in ("checkpoint_fingerprint", "data_fingerprint", "limit"):  # what they hold, or how they are read
        with pytest.raises(SettingsMismatchError, match=f"differing keys: \\['{key}'\\]"):
            store.verify_settings({**recorded, key: "other"})
    # a setting recorded only now (a newer version records more, pair_encoding say), or no longer
    with pytest.raises(SettingsMismatchError, match="pair_encoding"):
        store.verify_settings({**recorded, "pair_encoding": "lm-eval"})
    with pytest.raises(SettingsMismatchError, match="checkpoint_fingerprint"):
        store.verify_settings({k: v for k, v in recorded.items() if k != "checkpoint_fingerprint"})


# ------------------------------------------------------------------ table
def _result(tmp, run, bench, metrics, limit=None, variant=None):
    d = tmp / run
    d.mkdir(exist_ok=True)
    settings = {"benchmark": {"benchmark": bench, **({"variant": variant} if variant else {})},
                "data_path": "/d", "limit": limit}
    (d / f"{bench}.json").write_text(json.dumps({"benchmark": bench, "metrics": metrics, "settings": settings}))
    (d / "summary.json").write_text(json.dumps({"run_name": run}))
    return d


def test_table_has_named_columns_and_deltas_against_the_baseline(tmp_path):
    base = _result(tmp_path, "none", "pope", {"mean_over_splits": {"f1": 0.80}})
    _result(tmp_path, "none", "ai2d", {"accuracy": 0.50}, variant="no_mask")
    gwc = _result(tmp_path, "gwc", "pope", {"mean_over_splits": {"f1": 0.86}})
    _result(tmp_path, "gwc", "ai2d", {"accuracy": 0.47}, variant="no_mask")  # averages 65 and 66.5
    table = build_table([gwc, base], baseline="none")
    assert table.runs == ["none", "gwc"]
    md = to_markdown(table)
    assert "| run | AI2D (no_mask) | POPE | Average |" in md
    assert "| gwc | 47.00 (-3.00) | 86.00 (+6.00) | 66.50 (+1.50) |" in md
    rows = [line.split(",") for line in to_csv(table).splitlines()]
    assert rows[0] == ["run", "is_baseline", "ai2d", "ai2d_delta", "pope", "pope_delta", "average", "average_delta"]
    assert rows[2] == ["gwc", "False", "47.0", "-3.0", "86.0", "6.0", "66.5", "1.5"]
    assert "‡" not in md
    # replies the benchmark's rule could not read are said in their cell, with a legend
    _result(tmp_path, "gwc", "pope", {"mean_over_splits": {"f1": 0.86}, "unparsable_replies": 3})
    md = to_markdown(build_table([gwc, base], baseline="none"))
    assert "| gwc | 47.00 (-3.00) | 86.00 ‡3 (+6.00) | 66.50 (+1.50) |" in md and "- ‡N: N replies" in md


# Each setting a column's runs must share (table.COMPARABLE), and two values of it.
DIFFERING = [("benchmark", {"benchmark": "pope"}, {"benchmark": "pope", "variant": "adversarial"}),
             ("data_fingerprint", "3f2a", "9c1e"), ("limit", 10, 20), ("max_new_tokens_cap", None, 4),
             ("dtype", "bfloat16", "float32")]


@pytest.mark.parametrize("key, one, other", DIFFERING, ids=[d[0] for d in DIFFERING])
def test_table_refuses_runs_evaluated_with_a_different_setting(tmp_path, key, one, other):
    """Two runs whose POPE results differ in one setting only (a capped smoke run, other data
    files, another dtype or variant) never share a column; the error names the setting."""
    runs = []
    for name, value in (("a", one), ("b", other)):
        run = _result(tmp_path, name, "pope", {"mean_over_splits": {"f1": 0.8}})
        result = json.loads((run / "pope.json").read_text())
        result["settings"][key] = value
        (run / "pope.json").write_text(json.dumps(result))
        runs.append(run)
    with pytest.raises(ValueError, match=f"different '{key}'"):
        build_table(runs)
    assert {key for key, _, _ in DIFFERING} == set(COMPARABLE)  # every one of them is tried here


def test_table_refuses_two_runs_of_one_name(tmp_path):
    a = _result(tmp_path, "a", "pope", {"mean_over_splits": {"f1": 0.8}}, limit=10)
    (tmp_path / "again").mkdir()
    twin = _result(tmp_path / "again", "a", "pope", {"mean_over_splits": {"f1": 0.7}}, limit=10)
    with pytest.raises(ValueError, match=f"two evaluation directories have run name 'a': {a} and {twin}; "):
        build_table([a, twin])  # the error names both folders
    from llava_norm.cli import main

    for twins in ([a, twin], [a, a]):  # the command too, before any table is written (not one row for both)
        with pytest.raises(SystemExit) as stop:
            main(["table", *map(str, twins), "--out", str(tmp_path / "t")])
        assert str(stop.value.code).startswith(f"table: two evaluation directories have run name 'a': {a} and ")
    assert not list(tmp_path.glob("t*"))


# ------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def setup(tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("evalrun")
    build_world(root / "world", seed=3, n_pretrain=20, n_instruct=20, n_text=40, n_bench=6,
                bench_sizes={"pope": 3, "mmbench_en_dev": 3})
    bundle = build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama", norm_alignment="ln_textnorm_gwc"))
    bundle.save(root / "ckpt")
    return root


def _eval_command(setup, out, nproc, batch_size=4, extra=()):
    args = ["-m", "llava_norm.cli", "eval", str(setup / "ckpt"), "--data-root", str(setup / "world/benchmarks"),
            "--out", str(out), "--name", out.name, "--max-new-tokens-cap", "12", "--batch-size", str(batch_size),
            *extra]
    if nproc == 1:
        return [sys.executable, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]


def _run(cmd) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _records(out):
    """(benchmark, item id) of every complete record: a last line still being written (or cut
    short by a kill) has no newline yet and is not one."""
    ids = []
    for path in sorted(out.glob("predictions/*/rank*.jsonl")):
        complete = path.read_text().rpartition("\n")[0]
        ids += [(path.parent.name, json.loads(line)["item_id"]) for line in complete.splitlines()]
    return ids


def _predictions(out) -> dict:
    found = {}
    for path in sorted(out.glob("predictions/*/rank*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            found[(path.parent.name, record["item_id"])] = record["prediction"]
    return found


def _unfinished(out, totals: collections.Counter) -> list[str]:
    """The benchmarks with some but not all of their records written."""
    done = collections.Counter(bench for bench, _ in _records(out))
    return [bench for bench, n in done.items() if 0 < n < totals[bench]]


def _metrics(out):
    return {b: json.loads((out / f"{b}.json").read_text())["metrics"] for b in NINE}


@pytest.fixture(scope="module")
def whole(setup):
    out = setup / "whole"
    _run(_eval_command(setup, out, nproc=2))  # data-parallel, merged by rank 0
    return out


def test_killed_evaluation_resumes_to_the_same_metrics_without_double_counting(setup, whole):
    assert len({p.name for p in whole.glob("predictions/pope/rank*.jsonl")}) == 2

    cut = setup / "cut"
    totals = collections.Counter(bench for bench, _ in _records(whole))
    proc = subprocess.Popen(_eval_command(setup, cut, nproc=1), cwd=REPO, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 200
    while (len(_records(cut)) < 25 or not _unfinished(cut, totals)) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the evaluation ended before it could be killed"
    assert _unfinished(cut, totals), "200 s passed without a benchmark half done"
    assert processes_of(cut, argument=str(cut)) == [proc.pid]  # found while it runs: the check below is not vacuous
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # the kill ended it
    time.sleep(0.25)  # a survivor would still be predicting
    assert not processes_of(cut, argument=str(cut)), "a process of the evaluation outlived the kill"
    before = snapshot(cut)
    time.sleep(1.0)
    assert snapshot(cut) == before, "files changed after the kill"
    assert not (cut / "summary.json").exists(), "the run finished before it could be killed"
    assert len(_records(cut)) >= 25 and _unfinished(cut, totals), "the kill fell between benchmarks"
    # Each complete record the killed run wrote gets a field the runner never writes (a line the
    # kill cut short is left as it is): a recomputed record would come back without it.
    kept = {}
    for path in cut.glob("predictions/*/rank*.jsonl"):
        lines, _, torn = path.read_text().rpartition("\n")
        kept[path] = "".join(json.dumps({**json.loads(line), "before_the_kill": True}) + "\n"
                             for line in lines.splitlines())
        path.write_text(kept[path] + torn)

    by_bench = collections.Counter(bench for bench, _ in _records(cut))
    resumed = _run(_eval_command(setup, cut, nproc=2))  # resumed with another world size
    assert kept  # resumed, not recomputed: the killed run's records kept, the rest appended after them
    # the log says what was kept, for each benchmark the kill left unfinished (not only on the bar)
    said = dict(re.findall(r"\[llava-norm\] (\w+): (\d+) of \d+ items predicted before are kept", resumed.stdout))
    unfinished = {b for b, n in by_bench.items() if n < totals[b]}
    assert unfinished and {b: int(n) for b, n in said.items()} == {b: by_bench[b] for b in unfinished}, resumed.stdout
    for path, written in kept.items():
        assert path.read_text()[:len(written)] == written, path
    ids = _records(cut)
    assert len(ids) == len(set(ids)), "a sample was predicted twice"
    assert len(ids) == len(_records(whole))
    # every prediction bit for bit the one-go run's (one process, killed, then two; the batching
    # itself: test_each_item_is_batched_as_in_a_run_never_stopped_whatever_the_process_count)
    assert _predictions(cut) == _predictions(whole)
    assert _metrics(cut) == _metrics(whole)
    for bench in NINE:
        result = json.loads((cut / f"{bench}.json").read_text())
        assert result["duplicate_records_ignored"] == 0
        assert result["settings"]["max_new_tokens_cap"] == 12
        assert result["settings"]["benchmark"]["benchmark"] == bench

    md, csv_path, _ = write_table([whole, cut], setup / "tables/llama3.2-3b", baseline="whole")
    assert (md.name, csv_path.name) == ("llama3.2-3b.md", "llama3.2-3b.csv")  # a dotted prefix is kept whole
    assert json.loads((setup / "tables/llama3.2-3b.provenance.json").read_text())["complete"]
    header = csv_path.read_text().splitlines()[0].split(",")
    assert header[:4] == ["run", "is_baseline", "mmbench_en_dev", "mmbench_en_dev_delta"]
    assert all(b in header for b in NINE)
    # A model saved outside a training run has no training record: its rows say so.
    text = md.read_text()
    assert "| cut † |" in text and "| whole † |" in text and "no training record" in text


def test_finished_benchmarks_are_not_recomputed_and_changed_settings_are_refused(setup, whole):
    from llava_norm.cli import main

    # One process, as `llava-norm eval` runs without torchrun: here, in this one (nothing to launch).
    def evaluate(*extra):
        main(_eval_command(setup, whole, nproc=1, extra=["--benchmarks", "pope", *extra])[3:])

    result = json.loads((whole / "pope.json").read_text())
    stamp = (whole / "pope.json").stat().st_mtime_ns
    evaluate()
    assert (whole / "pope.json").stat().st_mtime_ns == stamp
    (whole / "pope.json").unlink()  # results lost, predictions kept: rescored from disk, nothing rerun
    records = _records(whole)
    evaluate()
    assert _records(whole) == records
    assert json.loads((whole / "pope.json").read_text())["metrics"] == result["metrics"]
    with pytest.raises(SystemExit) as stop:  # one line, not a traceback
        evaluate("--limit", "2")
    said = stop.value.code
    assert isinstance(said, str) and "\n" not in said, said
    assert said.startswith("eval: ") and "limit=2" in said and "--replace-stale" in said, said
    # --batch-size 4: a generated item is a row, a log-likelihood item several (a quarter as many items)
    recorded = {b: json.loads((whole / f"{b}.json").read_text())["settings"]["batch_items"] for b in NINE}
    assert recorded == {b: 1 if b in ("hellaswag", "mmlu") else 4 for b in NINE}
    with pytest.raises(SystemExit) as stop:  # the batch moves logits: predictions of another are not kept
        evaluate("--batch-size", "2")
    assert "batch_items=4, this run has batch_items=2 (--batch-size)" in str(stop.value.code), stop.value.code


def test_replace_stale_recomputes_predictions_made_with_other_settings(setup, whole, tmp_path, capsys):
    """What the pipeline passes: predictions on disk from other settings (here another --limit)
    are cleared and made again, none of the old records kept, and the result is the new one's."""
    from llava_norm.cli import main

    out = tmp_path / "copy"
    shutil.copytree(whole, out)
    (out / "pope.json").unlink()  # the predictions alone stand for the other settings
    path = next(out.glob("predictions/pope/rank*.jsonl"))
    path.write_text("".join(json.dumps({**json.loads(line), "before": True}) + "\n"
                            for line in path.read_text().splitlines()))
    main(_eval_command(setup, out, nproc=1, extra=["--benchmarks", "pope", "--limit", "2", "--replace-stale"])[3:])
    assert "[llava-norm] pope: recomputing; " in capsys.readouterr().out
    records = [json.loads(line) for p in out.glob("predictions/pope/rank*.jsonl") for line in p.read_text().splitlines()]
    assert len(records) == 2 and not [r for r in records if "before" in r], records
    result = json.loads((out / "pope.json").read_text())
    assert result["settings"]["limit"] == 2 and result["num_items"] == 2


def test_the_command_prints_each_benchmarks_headline_as_the_table_heads_it(setup, whole, capsys):
    """``llava-norm eval`` ends with every benchmark's headline in its output folder, each under
    the results table's label, read here from that benchmark's result file by the metric path the
    line names and shown in percent; POPE's line has the README's shape. Nothing is recomputed."""
    from llava_norm.cli import main
    from llava_norm.evaluation.table import build_table, headline

    names = list(json.loads((whole / "summary.json").read_text())["benchmarks"])
    written = {name: (whole / f"{name}.json").stat().st_mtime_ns for name in names}
    main(_eval_command(setup, whole, nproc=1, extra=["--benchmarks", "pope"])[3:])
    printed = capsys.readouterr().out.splitlines()
    assert {name: (whole / f"{name}.json").stat().st_mtime_ns for name in names} == written  # none reran
    assert printed[0] == f"results in {whole}:" and len(names) > 1 and "pope" in names
    assert len(printed) == len(names) + 1
    table = build_table([whole])
    for name, line in zip(names, printed[1:]):
        label, value, path, unread = re.fullmatch(r"  (.+): (\d+\.\d) \(([\w.]+), percent(?:; (\d+) repl(?:y|ies) "
                                                  r"its answer rule could not read)?\)", line).groups()
        result = json.loads((whole / f"{name}.json").read_text())
        assert int(unread or 0) == result["metrics"].get("unparsable_replies", 0), line  # said where any
        node = result["metrics"]
        for key in path.split("."):
            node = node[key]
        assert 0 <= float(node) <= 1 and value == f"{100 * float(node):.1f}", (line, node)
        # the table's column: its label, its metric and its number
        assert label == headline(name).label(result["settings"]) and path == headline(name).metric, line
        assert value == f"{table.values[table.runs[0]][name]:.1f}", (line, table.values)
    pope = next(line for name, line in zip(names, printed[1:]) if name == "pope")
    assert re.fullmatch(r"  POPE: \d+\.\d \(mean_over_splits\.f1, percent(; \d+ repl(y|ies) its answer rule could "
                        r"not read)?\)", pope), pope


def test_bad_input_and_ctrl_c_end_the_command_in_one_line(setup, tmp_path, monkeypatch, capsys):
    """A checkpoint that is not there, a benchmark file cut short (a parquet shard), and Ctrl-C:
    each ends ``llava-norm eval`` with one line naming it, not a traceback; and without --out the
    results go beside the run's model, or beside any other folder under its own name."""
    import shutil

    from llava_norm import cli
    from llava_norm.evaluation import runner
    from llava_norm.evaluation.arguments import check_saved_model, default_out_dir, parse_eval_args

    assert default_out_dir(str(tmp_path / "run" / "model")) == tmp_path / "run" / "eval"
    assert default_out_dir(str(tmp_path / "merged")) == tmp_path / "eval-merged"  # not the folder's parent's eval/
    assert default_out_dir("Org/some-model") == Path.cwd() / "eval-some-model"  # a hub id: here
    bench = ["--benchmarks", "pope", "--data-root", str(setup / "world/benchmarks")]
    assert parse_eval_args([str(setup / "ckpt"), *bench]).out_dir == str(setup / "eval-ckpt")  # what eval takes
    # EVAL_DATA stands in for --data-root, as in scripts/eval.sh and the pipeline
    monkeypatch.setenv("EVAL_DATA", str(setup / "world/benchmarks"))
    assert parse_eval_args([str(setup / "ckpt"), "--benchmarks", "pope"]).benchmarks == \
        parse_eval_args([str(setup / "ckpt"), *bench]).benchmarks
    monkeypatch.delenv("EVAL_DATA")
    check_saved_model("Org/some-model")  # a hub id goes on to the loader

    def said(*argv) -> str:
        with pytest.raises(SystemExit) as stop:
            cli.main(["eval", *argv])
        return stop.value.code

    assert "pass --data-root DIR or set EVAL_DATA=DIR" in said(str(setup / "ckpt"), "--benchmarks", "pope")
    # a data root without the benchmark (scripts/eval.sh's default, data/eval, without EVAL_DATA): named
    assert said(str(setup / "ckpt"), "--benchmarks", "pope", "--data-root", str(tmp_path)) == \
        f"eval: pope: data path does not exist: {tmp_path / 'pope'}; the data root is {tmp_path}: --data-root DIR or " \
        "EVAL_DATA=DIR names another (see eval/README.md for where to get it)"
    assert said(str(setup / "ckpt"), *bench, "--limit", "0") == \
        "eval: limit must be a positive int or None (no items, no score), got 0"
    for name in (str(tmp_path / "runs" / "none" / "model"), "mergd"):
        assert said(name, *bench) == f"eval: {name}: no saved model here (from {os.getcwd()}; give a saved model " \
            "directory, RUN/model, or a Hugging Face hub id, organisation/name)"

    def nowhere(*args, **kwargs):  # what the loader raises for a hub id it cannot find, offline or not
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files,\nand couldn't find them")

    monkeypatch.setattr(runner, "load_bundle", nowhere)
    monkeypatch.chdir(tmp_path)
    assert said("Org/not-a-model", *bench) == "eval: Org/not-a-model: not a folder here, and not a model the hub (or " \
        "its cache) has: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them"
    assert not (tmp_path / "eval-not-a-model").exists()  # nothing left behind
    monkeypatch.undo()
    data = tmp_path / "benchmarks"
    shutil.copytree(setup / "world/benchmarks/hellaswag", data / "hellaswag")
    shard = data / "hellaswag" / "validation-00000-of-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:99])  # a download cut short
    common = ["--benchmarks", "hellaswag", "--data-root", str(data), "--out", str(tmp_path / "out")]
    cut = said(str(setup / "ckpt"), *common)
    assert cut.startswith(f"eval: hellaswag: {shard}") and "\n" not in cut, cut

    def interrupt(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_evaluation", interrupt)
    monkeypatch.delenv("RANK", raising=False)
    capsys.readouterr()
    try:
        code = said(str(setup / "ckpt"), *common)
    except KeyboardInterrupt:  # a failure of this test, not an interrupt of the test run
        pytest.fail("Ctrl-C ended llava-norm eval in a traceback")
    assert code == 130  # as the shell reports an interrupt
    assert capsys.readouterr().err == (f"\ninterrupted: the predictions so far are kept in {tmp_path / 'out'}; the "
                                       "same command continues from them\n")


def test_sigterm_on_an_evaluation_says_what_is_kept_with_the_status_a_shell_gives_it(
        setup, tmp_path, monkeypatch, capsys, sigterm_to_self):
    """A real SIGTERM (scancel, a preemption) is handled as Ctrl-C is, with 143 (128 + SIGTERM)."""
    from llava_norm import cli
    from llava_norm.evaluation import runner

    def terminated(config):
        sigterm_to_self()
        time.sleep(30)  # the handler raises here

    monkeypatch.setattr(runner, "run_evaluation", terminated)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) as left:
        cli.main(["eval", str(setup / "ckpt"), "--benchmarks", "pope", "--data-root", str(setup / "world/benchmarks"),
                  "--out", str(tmp_path / "out")])
    assert left.value.code == 143
    assert capsys.readouterr().err.endswith(f"\nterminated by SIGTERM: the predictions so far are kept in "
                                            f"{tmp_path / 'out'}; the same command continues from them\n")


def test_loglikelihood_flags_exactly_the_greedy_continuation(tiny_dir):
    import torch

    from llava_norm.inference import Predictor

    bundle = build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama"))
    predictor, tok = Predictor(bundle), bundle.tokenizer
    def next_token_logits(text):
        ids = [tok.bos_token_id] + tok.encode(text, add_special_tokens=False)
        with torch.no_grad():
            return bundle.model(input_ids=torch.tensor([ids])).logits[0, -1]

    def round_trips(t):
        return tok.encode(tok.decode([t]), add_special_tokens=False) == [t]

    # A context whose greedy next token survives decode -> encode, so it can be a text continuation.
    context, logits = next((c, lg) for c in ["a red circle", "the square", "blue", "one two", "shapes are", "a", "the"]
                           for lg in [next_token_logits(c)] if round_trips(int(lg.argmax())))
    ranked = [t for t in logits.argsort(descending=True).tolist() if round_trips(t)]
    best, other = tok.decode([ranked[0]]), tok.decode([ranked[1]])
    (s_best, g_best), (s_other, g_other) = predictor.loglikelihood_details([(context, best), (context, other)])
    assert g_best and not g_other
    expected = torch.log_softmax(logits, -1)
    assert s_best == pytest.approx(expected[ranked[0]].item(), abs=1e-4)
    assert s_other == pytest.approx(expected[ranked[1]].item(), abs=1e-4)
    # two tokens: greedy only when both are (the first alone greedy is not enough)
    ctx_ids = tok.encode(context, add_special_tokens=False)
    with torch.no_grad():
        after = bundle.model(input_ids=torch.tensor([[tok.bos_token_id, *ctx_ids, ranked[0]]])).logits[0, -1]

    def two_tokens(t):  # the whole text's ids are the context's, then these two
        return tok.encode(context + best + tok.decode([t]), add_special_tokens=False) == [*ctx_ids, ranked[0], t]

    seconds = [t for t in after.argsort(descending=True).tolist() if two_tokens(t)]
    assert seconds[0] == int(after.argmax()), "the tiny LLM's greedy second token does not tokenise apart"
    (_, g_both), (_, g_first_only) = predictor.loglikelihood_details(
        [(context, best + tok.decode([seconds[0]])), (context, best + tok.decode([seconds[1]]))])
    assert g_both and not g_first_only


def test_table_given_a_run_its_model_or_a_file_names_the_evaluation_folder(tmp_path):
    """The new user's trial: `table RUN` or `table RUN/model` said "run llava-norm eval first"
    though RUN/eval held the results; a file was "not found". Each is one line naming what to give."""
    from llava_norm.cli import main

    run = tmp_path / "stage2"
    (run / "model").mkdir(parents=True)
    (run / "eval").mkdir()
    (run / "eval" / "summary.json").write_text("{}")
    for given in (run, run / "model"):
        with pytest.raises(SystemExit) as stop:
            main(["table", str(given)])
        assert stop.value.code == f"table: {given}: no benchmark result files here; its evaluation is " \
                                  f"{run / 'eval'}: give that folder"
    for other in (run / "checkpoint-2", run / "eval-checkpoint-2"):  # not the final model's: no pointer to it
        other.mkdir()
        with pytest.raises(SystemExit) as stop:
            main(["table", str(other)])
        assert stop.value.code.endswith("no benchmark result files (<benchmark>.json); run `llava-norm eval` first")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(SystemExit) as stop:
        main(["table", str(tmp_path / "notes.txt")])
    assert stop.value.code == f"table: {tmp_path / 'notes.txt'}: a file; give the evaluation's folder (llava-norm " \
                              "eval's --out)"
    with pytest.raises(SystemExit) as stop:  # nothing beside it either: evaluate first
        main(["table", str(tmp_path)])
    assert stop.value.code == f"table: {tmp_path}: no benchmark result files (<benchmark>.json); run `llava-norm " \
                              "eval` first"


def test_a_pair_is_scored_on_the_whole_texts_tokens_with_the_contexts_trailing_space(tiny_dir):
    """As lm-eval's HF model scores a (context, continuation) pair: the context (its trailing
    whitespace stripped) is tokenised on its own, the continuation's tokens are the whole text's
    after as many as the context has, so a HellaSwag context's final space counts and a token
    spanning the boundary is the whole text's; computed here from one forward pass."""
    import torch

    from llava_norm.inference import Predictor

    bundle = build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama"))
    predictor, tok = Predictor(bundle), bundle.tokenizer
    pairs = [("Personal Care: How to wash a dog. Fill the tub. ", " Then the dog jumps in."),
             ("Question: which shape is red?\nAnswer:", " circle"),
             ("Question: red", "dish")]  # a token spanning the boundary: the whole text's, not "dish" alone
    for (context, continuation), score in zip(pairs, predictor.loglikelihood(pairs)):
        # the stripped context's own ids, then the whole text's ids after as many as those
        own = tok.encode(context.rstrip(), add_special_tokens=False)
        ids = [tok.bos_token_id] + own + tok.encode(context + continuation, add_special_tokens=False)[len(own):]
        start = 1 + len(own)
        with torch.no_grad():
            logprobs = torch.log_softmax(bundle.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        expected = sum(logprobs[i - 1, ids[i]].item() for i in range(start, len(ids)))
        assert score == pytest.approx(expected, abs=1e-4), (context, score, expected)
    # the cases are what they stand for: the first context's tokens change when its space is
    # stripped, and the last continuation's tokens within the whole text are not its own
    assert tok.encode(pairs[0][0], add_special_tokens=False)[-1] not in \
        tok.encode(pairs[0][0].rstrip(), add_special_tokens=False)[-1:]
    context, continuation = pairs[2]
    whole = tok.encode(context + continuation, add_special_tokens=False)
    assert whole[len(tok.encode(context, add_special_tokens=False)):] != tok.encode(continuation, add_special_tokens=False)
    # no context on an LLM without BOS (the tiny Qwen): scored after the end-of-text token, as
    # lm-eval does, so the continuation's first token counts
    qwen = build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/qwen2"))
    qtok = qwen.tokenizer
    assert qtok.bos_token_id is None
    ids = [qtok.eos_token_id] + qtok.encode("circle", add_special_tokens=False)
    with torch.no_grad():
        logprobs = torch.log_softmax(qwen.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    expected = sum(logprobs[i - 1, ids[i]].item() for i in range(1, len(ids)))
    assert Predictor(qwen).loglikelihood([("", "circle")]) == [pytest.approx(expected, abs=1e-4)]
    # with a context, nothing goes before it on that LLM (lm-eval adds the token for no context only)
    ids = qtok.encode("Answer:", add_special_tokens=False) + qtok.encode(" circle", add_special_tokens=False)
    with torch.no_grad():
        logprobs = torch.log_softmax(qwen.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    start = len(qtok.encode("Answer:", add_special_tokens=False))
    expected = sum(logprobs[i - 1, ids[i]].item() for i in range(start, len(ids)))
    assert ids == qtok.encode("Answer: circle", add_special_tokens=False)  # the whole text splits there
    assert Predictor(qwen).loglikelihood([("Answer:", " circle")]) == [pytest.approx(expected, abs=1e-4)]
    # and a result records the tokenisation, so one scored under another is not taken as current
    from llava_norm.evaluation.benchmarks import get_benchmark
    from llava_norm.evaluation.benchmarks.base import PAIR_ENCODING

    assert get_benchmark("hellaswag").settings()["pair_encoding"] == PAIR_ENCODING
    assert get_benchmark("mmlu").settings()["pair_encoding"] == PAIR_ENCODING
    assert "pair_encoding" not in get_benchmark("pope").settings()


def test_a_run_folder_or_checkpoint_given_as_the_model_names_the_folder_to_evaluate(tmp_path):
    from llava_norm.evaluation.arguments import check_saved_model

    run = tmp_path / "stage2"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text('{"model_type": "llava_norm"}')
    (run / "checkpoint-40").mkdir()  # as the trainer writes one: the model's config beside the marker
    (run / "checkpoint-40" / "config.json").write_text('{"model_type": "llava_norm"}')
    (run / "checkpoint-40" / "checkpoint_complete").write_text("")
    check_saved_model(str(run / "model"))  # a saved model: nothing to say
    with pytest.raises(ValueError, match=rf"is a training run's folder, not a saved model: its model is {run / 'model'}$"):
        check_saved_model(str(run))
    with pytest.raises(ValueError, match=rf"is a training checkpoint .*: the run's model is {run / 'model'}, written"):
        check_saved_model(str(run / "checkpoint-40"))
    backbone = tmp_path / "llama"  # a backbone given where a trained model belongs
    backbone.mkdir()
    (backbone / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match=r"a 'llama' model \(its config.json\), not one a llava-norm run saved"):
        check_saved_model(str(backbone))


def test_bad_arguments_an_empty_benchmark_and_damaged_outputs_end_the_command_in_one_line(setup, tmp_path, capsys):
    """What a hostile new user tried: a batch size or token cap of 0, --out naming a file, a folder
    without a model, a benchmark whose file holds no items (it scored 0% before), then a result
    file cut short, another model's result in the folder (the summary merged both) and a
    predictions line that is not a record, in an evaluation resumed: each ends the command with
    one line naming the option or the file; the table names a cut file too, and --overwrite
    recomputes a cut result."""
    import pyarrow.parquet as pq

    from llava_norm import cli

    def said(*argv) -> str:
        with pytest.raises(SystemExit) as stop:
            cli.main(list(argv))
        return stop.value.code

    ckpt, out = str(setup / "ckpt"), tmp_path / "out"
    bench = ["--benchmarks", "pope", "--data-root", str(setup / "world/benchmarks"), "--out", str(out)]
    for option in ("--batch-size", "--max-new-tokens-cap"):
        assert said("eval", ckpt, *bench, option, "0") == 2  # argparse's usage error, naming the option
        assert f"argument {option}: 0 is not at least 1" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("x")
    assert said("eval", ckpt, *bench[:-1], str(tmp_path / "a_file")) == \
        f"eval: --out {tmp_path / 'a_file'}: a file, not a folder for the results"
    assert said("eval", str(tmp_path), *bench) == \
        f"eval: {tmp_path}: no saved model here (no config.json); give a saved model directory, RUN/model"

    data = tmp_path / "benchmarks" / "ai2d"
    shutil.copytree(setup / "world/benchmarks/ai2d", data)
    for shard in data.rglob("*.parquet"):
        pq.write_table(pq.read_schema(shard).empty_table(), shard)
    empty = said("eval", ckpt, "--benchmarks", "ai2d", "--data-root", str(data.parent), "--out", str(out))
    assert empty.startswith("eval: ai2d: ") and empty.endswith("holds no items: nothing to score"), empty
    assert not (out / "ai2d.json").exists()

    cli.main(["eval", ckpt, *bench, "--limit", "2", "--max-new-tokens-cap", "2"])
    result = out / "pope.json"
    whole = result.read_text()
    result.write_text(whole[:40])  # cut short
    cut = said("eval", ckpt, *bench, "--limit", "2", "--max-new-tokens-cap", "2")
    assert cut.startswith(f"eval: {result}: not a whole JSON file (") and "\n" not in cut, cut
    assert said("table", str(out), "--out", str(tmp_path / "table")).startswith(f"table: {result}: not a whole JSON")
    from llava_norm.evaluation.predictions import DamagedFileError
    from llava_norm.evaluation.units import read_units
    from llava_norm.reuse import eval_decision

    # the pipeline's reuse decision and the statistics table's units read it too
    for read in (lambda: eval_decision([ckpt, *bench], out, False), lambda: read_units(result)):
        with pytest.raises(DamagedFileError, match=re.escape(f"{result}: not a whole JSON file")):
            read()
    # --overwrite recomputes only what is asked for: a cut result of another benchmark is said so
    unasked = said("eval", ckpt, "--benchmarks", "ai2d", *bench[2:], "--limit", "2", "--max-new-tokens-cap", "2",
                   "--overwrite")
    assert unasked == (f"eval: {result}: not a whole JSON file, the result of a benchmark not asked for here: "
                       "delete it, or ask for that benchmark with --overwrite"), unasked
    # the way on the message names: --overwrite recomputes the cut result
    cli.main(["eval", ckpt, *bench, "--limit", "2", "--max-new-tokens-cap", "2", "--overwrite"])
    assert json.loads(result.read_text())["metrics"] == json.loads(whole)["metrics"]
    result.write_text(whole)
    # a moved copy of the model is the same model: its AI2D joins the POPE result in the summary
    moved = tmp_path / "moved"
    shutil.copytree(setup / "ckpt", moved)
    ai2d = ["--benchmarks", "ai2d", "--out", str(out), "--limit", "2", "--max-new-tokens-cap", "2"]
    cli.main(["eval", str(moved), *bench[2:4], *ai2d])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoint"] == str(moved) and list(summary["benchmarks"]) == ["ai2d", "pope"]
    # another model's POPE result there: evaluating this one's AI2D is refused (the summary would
    # list that POPE as this model's)
    result.write_text(json.dumps({"benchmark": "pope", "metrics": {}, "settings": {
        "checkpoint": "/elsewhere/model", "checkpoint_fingerprint": "another model's"}}))
    assert said("eval", ckpt, *bench[2:4], *ai2d) == f"eval: {out} holds results of another model: pope (of " \
        "/elsewhere/model); give this evaluation another --out (or delete that folder)"
    result.unlink()
    predictions = out / "predictions" / "pope" / "rank0.jsonl"
    predictions.write_text(predictions.read_text() + "not a record\n")
    garbage = said("eval", ckpt, *bench, "--limit", "2", "--max-new-tokens-cap", "2")
    assert garbage.startswith(f"eval: {predictions}:3: not a prediction record (") and "\n" not in garbage, garbage
    # the first way on it names: that line deleted, the records around it are kept and its item predicted again
    assert "delete that line (the records around it are kept" in garbage, garbage
    lines = predictions.read_text().splitlines(keepends=True)
    kept = json.dumps({**json.loads(lines[0]), "kept": True}) + "\n"
    predictions.write_text(kept)  # the damaged line deleted, and the second record too: its item is predicted again
    cli.main(["eval", ckpt, *bench, "--limit", "2", "--max-new-tokens-cap", "2"])
    again = predictions.read_text().splitlines()
    assert again[0] == kept.strip() and len(again) == 2 and json.loads(result.read_text())["num_items"] == 2
