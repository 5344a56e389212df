"""``llava-norm sweep`` on the one-GPU recipe's configs (``configs/recipe-1gpu``) at tiny scale:
2 arms x 2 seeds written as Slurm files and run through them (each array task is the generated script with ``SLURM_ARRAY_TASK_ID`` set, as Slurm runs
it), then the table job; its statistics are checked here against the per-run table: each mean
and delta recomputed, each interval shown to hold Student's t interval over the seeds (the
bootstrap that widens it: tests/test_ablation.py).
Two training steps leave the tiny models' scores close; tests/test_ablation.py checks the
statistics on models that differ.
"""

import contextlib
import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from launch import REPO, env
from safetensors.torch import load_file
from tinydata import write_dataset

from llava_norm.cli import main
from llava_norm.provenance import read_record
from llava_norm.stats import mean_over_seeds
from llava_norm.sweep import parse_seeds
from llava_norm_demo.synth import build_world

ARMS = "none,scale_to_t"
SEEDS = (0, 1)
BENCHMARKS = "pope,ai2d,mmlu"  # mmlu: scored by log-likelihood, so untrained models score above 0
NAMES = ["none@seed0", "none@seed1", "scale_to_t@seed0", "scale_to_t@seed1"]


def _cli(*args: str, cwd: Path = REPO) -> SimpleNamespace:
    """``llava-norm ARGS`` run in this process from the checkout, with its exit code and what it
    printed. Why not a process of its own: these commands launch nothing (they write files or
    refuse), so a new process would add only the start-up of the libraries this one has loaded."""
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as stop:  # as the interpreter does: a message goes to stderr with status 1
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
            code = 1 if isinstance(stop.code, str) else stop.code or 0
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("sweep")
    world = root / "world"
    build_world(world, seed=5, n_pretrain=10, n_instruct=10, n_text=20, n_bench=4, bench_sizes={"pope": 2})
    data, images = write_dataset(root / "data", n=8, text_only_every=4)
    # The recipe's LLM family (Qwen2.5) and its data slicing (take), at tiny scale. No TensorBoard
    # (the recipe's report_to): its check, before each task's first launch, imports transformers'
    # Trainer stack into the task's driver, seconds per task (tested in test_pipeline.py; the
    # logging itself in test_training_single.py).
    common = [f"model.vision_tower={tiny_dir}/siglip", f"model.llm={tiny_dir}/qwen2",
              f"data.mixture=[{{path: {data}, image_folder: {images}, take: 'first:6'}}]", "train.max_steps=2",
              "train.deepspeed=null", "train.per_device_batch_size=2", "train.save_steps=2",
              "train.global_batch_size=null", "train.report_to=[]"]
    runs, slurm = root / "runs", root / "slurm"
    args = [str(REPO / "configs/recipe-1gpu"), "--arms", ARMS, "--seeds", ",".join(map(str, SEEDS)), "--runs", str(runs),
            "--data-root", str(world / "benchmarks"), "--benchmarks", BENCHMARKS,
            "--eval-arg=--limit=4", "--eval-arg=--max-new-tokens-cap=4",
            *[f"--stage1={o}" for o in common], *[f"--stage2={o}" for o in common]]
    # Through the recipe's own script: its settings, with the tiny ones given after them winning.
    written = subprocess.run(["bash", "scripts/recipe_1gpu.sh", *args[1:], "--slurm", str(slurm),
                              "--slurm-arg=--partition=gpu"], cwd=REPO, env=env(), capture_output=True, text=True,
                             timeout=600)
    assert written.returncode == 0, written.stderr
    # The array's tasks side by side, as Slurm runs them: one data index cache, one world, four runs.
    logs = [root / f"task{task}.log" for task in range(len(NAMES))]
    running = [subprocess.Popen(["bash", str(slurm / "sweep.sbatch")], env={**env(), "SLURM_ARRAY_TASK_ID": str(task)},
                                stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
               for task, log in enumerate(logs)]
    for proc, log in zip(running, logs):
        assert proc.wait(timeout=600) == 0, log.read_text()[-6000:]
    table = subprocess.run(["bash", str(slurm / "table.sbatch")], env=env(), capture_output=True, text=True,
                           timeout=600)
    assert table.returncode == 0, table.stdout[-3000:] + table.stderr[-3000:]
    return SimpleNamespace(root=root, runs=runs, slurm=slurm, args=args, table=table)


def test_slurm_files_name_every_chain(sweep):
    array = (sweep.slurm / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-3" in array and "#SBATCH --partition=gpu" in array and "#SBATCH --requeue" in array
    listed = [line.split(": ", 1)[1] for line in array.splitlines() if line.startswith("#   ")]
    assert listed == NAMES  # arm-major, the baseline first: what --task N selects
    assert "export MASTER_PORT" not in array  # one GPU per task: its single process picks a free port
    # one node each, whatever rendezvous the submitting shell left (sbatch hands its environment on)
    for text in (array, (sweep.slurm / "table.sbatch").read_text()):
        assert "export NNODES=1 NODE_RANK=0\nunset MASTER_ADDR MASTER_PORT\n" in text
    assert '--task "$SLURM_ARRAY_TASK_ID"' in array and f'--output="{sweep.slurm}/logs/task_%a_job_%A.out"' in array
    table = (sweep.slurm / "table.sbatch").read_text()
    assert "--table-only" in table and "#SBATCH --partition=gpu\n" in table  # --slurm-arg lines go to both jobs
    assert f"sweep {REPO / 'configs/recipe-1gpu'} " in array and "--eval-arg=--limit=500" in array
    # the tasks run where the command ran; a memory request is there (its figure: the test below)
    assert f"\ncd {REPO}\n" in array and "#SBATCH --cpus-per-task=8\n" in array
    mem = re.search(r"#SBATCH --mem=(\d+)G\n", array)
    assert mem and int(mem.group(1)) >= 1


def test_multi_gpu_tasks_take_a_port_from_their_job_and_task(sweep, tmp_path):
    done = _cli("sweep", *sweep.args, "--slurm", str(tmp_path), "--slurm-gpus", "2")
    assert done.returncode == 0, done.stderr
    array = (tmp_path / "sweep.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=2" in array and "export GPUS_PER_NODE=2" in array
    assert "#SBATCH --cpus-per-task=16\n" in array
    assert "MASTER_PORT=$((20000 + (SLURM_ARRAY_JOB_ID * 97 + SLURM_ARRAY_TASK_ID) % 40000))" in array
    assert "export GPUS_PER_NODE=2" in (tmp_path / "table.sbatch").read_text()  # records are checked at 2
    # what a cluster's nodes offer, given: it replaces the defaults (8 CPUs a GPU, the plan's memory)
    given = _cli("sweep", *sweep.args, "--slurm", str(tmp_path / "given"), "--slurm-gpus", "2",
                 "--slurm-cpus-per-task", "5", "--slurm-mem", "400G")
    assert given.returncode == 0, given.stderr
    array = (tmp_path / "given" / "sweep.sbatch").read_text()
    assert "#SBATCH --cpus-per-task=5\n" in array and "#SBATCH --mem=400G\n" in array


def test_the_slurm_files_name_the_grids_arms_so_an_arm_added_later_shifts_no_task(sweep, tmp_path, monkeypatch):
    """--arms all (the default) is resolved when the files are written: the tasks repeat the arms
    their header lists, one by one, so an arm directory added before a task runs (or is
    requeued) does not renumber the chains under it."""
    import shutil

    import llava_norm.sweep as sweeps

    monkeypatch.setattr(sweeps, "check_grid", lambda config, gpus: ([], 10.0))
    backbone = tmp_path / "configs" / "recipe"  # two of the recipe's arms, with the base files they name
    for arm in ("none", "scale_to_t"):
        shutil.copytree(REPO / "configs/recipe-1gpu" / arm, backbone / arm)
    shutil.copytree(REPO / "configs/_base", tmp_path / "configs" / "_base")
    rest = list(sweep.args[1:])  # the fixture's words but its backbone and its --arms
    at = rest.index("--arms")
    del rest[at:at + 2]
    done = _cli("sweep", str(backbone), *rest, "--slurm", str(tmp_path / "s"))
    assert done.returncode == 0, done.stderr
    array = (tmp_path / "s" / "sweep.sbatch").read_text()
    assert " --arms none,scale_to_t " in array and "--arms all" not in array
    assert " --arms none,scale_to_t " in (tmp_path / "s" / "table.sbatch").read_text()  # the table's grid too
    assert [line.split(": ", 1)[1] for line in array.splitlines() if line.startswith("#   ")] == NAMES


def test_slurm_files_ask_the_plans_host_memory_and_a_quarter_and_keep_the_data_roots(sweep, tmp_path, monkeypatch):
    """--mem from the grid's host memory (check_grid's, here 10 GiB) with MEMORY_MARGIN's quarter
    more and PROCESS_HOST_GIB for each process, rounded up; LLAVA_DATA and EVAL_DATA as set when the files are written, in both jobs;
    and written from another checkout than the package's, nothing is written and both are named."""
    import llava_norm.sweep as sweeps

    monkeypatch.setattr(sweeps, "check_grid", lambda config, gpus: ([], 10.0))
    monkeypatch.setenv("LLAVA_DATA", "/data/llava next")
    monkeypatch.setenv("EVAL_DATA", "/data/eval")
    done = _cli("sweep", *sweep.args, "--slurm", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    for name in ("sweep.sbatch", "table.sbatch"):
        text = (tmp_path / "a" / name).read_text()
        assert "export LLAVA_DATA='/data/llava next'\nexport EVAL_DATA=/data/eval\n" in text, text
    assert "#SBATCH --mem=14G\n" in (tmp_path / "a" / "sweep.sbatch").read_text()  # 10 x 1.25 + 1 process's 1
    two = _cli("sweep", *sweep.args, "--slurm", str(tmp_path / "two"), "--slurm-gpus", "2")
    assert two.returncode == 0 and "#SBATCH --mem=15G\n" in (tmp_path / "two" / "sweep.sbatch").read_text()
    other = tmp_path / "checkout"
    (other / "llava_norm").mkdir(parents=True)
    (other / "llava_norm" / "__init__.py").write_text("")
    refused = _cli("sweep", *sweep.args, "--slurm", str(tmp_path / "b"), cwd=other)
    assert refused.returncode == 1 and not (tmp_path / "b").exists()
    assert f"runs in the checkout {other.resolve()}, but the llava_norm package is installed from {REPO}" in \
        refused.stderr, refused.stderr


def test_submit_chains_the_table_after_the_array(sweep, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "sbatch.log"
    (fake / "sbatch").write_text(f'#!/usr/bin/env bash\necho "$@" >> {log}\necho "4242;cluster"\n')
    (fake / "sbatch").chmod(0o755)
    done = subprocess.run(["bash", str(sweep.slurm / "submit.sh")], env={**env(), "PATH": f"{fake}:{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == ["--parsable sweep.sbatch", "--dependency=afterany:4242 table.sbatch"]


def test_each_task_trains_its_own_seed(sweep):
    for name in NAMES:
        arm, seed = name.split("@seed")
        run = sweep.runs / arm / f"seed{seed}"
        for stage in ("stage1", "stage2"):
            record = read_record(run / stage)
            assert record.complete and record.seed == int(seed)
        assert (run / "eval" / "summary.json").is_file()
        assert json.loads((run / "eval" / "summary.json").read_text())["run_name"] == name
    # The seed reaches the weights: the two seeds' projectors differ.
    one, two = (load_file(sweep.runs / "none" / f"seed{s}" / "stage1" / "projector.safetensors") for s in SEEDS)
    assert any(not np.array_equal(one[k].numpy(), two[k].numpy()) for k in one)


def test_a_rerun_task_launches_nothing(sweep):
    again = subprocess.run(["bash", str(sweep.slurm / "sweep.sbatch")], env={**env(), "SLURM_ARRAY_TASK_ID": "2"},
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    statuses = [line.rsplit(None, 3)[1] for line in again.stdout.splitlines() if line.startswith("scale_to_t@seed0")]
    assert statuses == ["reused"] * 3


def test_the_table_is_the_mean_over_seeds_and_the_paired_delta(sweep):
    per_run = {row["run"]: row for row in csv.DictReader((sweep.runs / "results.csv").open())}
    assert sorted(per_run) == sorted(NAMES)
    cells = {(r["arm"], r["benchmark"]): r for r in csv.DictReader((sweep.runs / "results_stats.csv").open())}
    assert sorted(cells) == sorted((a, b) for a in ARMS.split(",") for b in BENCHMARKS.split(","))
    for (arm, bench), cell in cells.items():
        per_seed = [float(per_run[f"{arm}@seed{s}"][bench]) for s in SEEDS]
        expected = mean_over_seeds(per_seed)
        assert float(cell["score"]) == pytest.approx(expected.estimate, abs=1e-3)
        assert float(cell["score_low"]) <= max(expected.low, 0.0) + 1e-3
        assert float(cell["score_high"]) >= min(expected.high, 100.0) - 1e-3
        assert cell["n_seeds"] == "2" and cell["score_method"].startswith("Student t over 2 seeds")
        if arm == "none":
            assert cell["delta"] == ""
            continue
        base = [float(per_run[f"none@seed{s}"][bench]) for s in SEEDS]
        assert float(cell["delta"]) == pytest.approx(np.mean(np.subtract(per_seed, base)), abs=1e-3)
        t = mean_over_seeds(list(np.subtract(per_seed, base)))
        assert float(cell["delta_low"]) <= max(t.low, -100.0) + 1e-3 and float(cell["delta_high"]) >= min(t.high, 100.0) - 1e-3
        assert cell["delta_seeds"] == "0,1" and float(cell["delta_low"]) <= float(cell["delta"]) <= float(
            cell["delta_high"])
        covers = float(cell["delta_low"]) <= 0 <= float(cell["delta_high"])
        verdict = "no detectable difference" if covers else "higher" if float(cell["delta"]) > 0 else "lower"
        identical = cell["verdict"] == "identical on every unit"  # both arms the same on every unit: 0, said so
        assert cell["verdict"] == verdict or identical and float(cell["delta"]) == 0 and "by construction" in cell["note"]
    # the figure draws the deltas not 0 by construction (the tiny arms can answer alike on every unit)
    drawn = any(c["verdict"] not in ("", "identical on every unit") for c in cells.values())
    assert (sweep.runs / "results_forest.png").is_file() == drawn
    assert "## Arms over training seeds" in sweep.table.stdout


def test_the_table_command_takes_whatever_runs_exist(sweep, tmp_path):
    dirs = [sweep.runs / "none/seed0/eval", sweep.runs / "none/seed1/eval", sweep.runs / "scale_to_t/seed1/eval"]
    done = _cli("table", *map(str, dirs), "--baseline", "none", "--out", str(tmp_path / "t"))
    assert done.returncode == 0, done.stderr
    cells = {(r["arm"], r["benchmark"]): r for r in csv.DictReader((tmp_path / "t_stats.csv").open())}
    one = cells[("scale_to_t", "ai2d")]
    assert (one["n_seeds"], one["score_method"], one["delta_seeds"]) == ("1", "bootstrap over units (one seed)", "1")
    assert "seed-to-seed spread not measured" in one["verdict"] or one["verdict"] == "identical on every unit"
    assert "| scale_to_t | 1 |" in (tmp_path / "t_stats.md").read_text()
    # a folder, there or named with a trailing slash: the tables go inside it, not beside it
    for folder in (tmp_path, f"{tmp_path / 'new'}/"):
        done = _cli("table", *map(str, dirs), "--baseline", "none", "--out", str(folder))
        assert done.returncode == 0 and (Path(folder) / "table_stats.md").is_file(), done.stderr
    assert not (tmp_path / "new.md").exists()


def test_a_run_whose_name_and_training_record_disagree_on_its_seed_is_marked(sweep, tmp_path):
    """Seeds are read from the names (`<arm>@seed<k>`): copies of scale_to_t@seed0's evaluation
    named without a seed, or with another, are marked with the seed their training record gives
    (the new user's trial: such a run paired with nothing, or with the wrong seed, unsaid)."""
    import shutil

    from llava_norm.analysis.ablation import write_tables

    runs = {"none@seed0": sweep.runs / "none/seed0/eval", "none@seed1": sweep.runs / "none/seed1/eval"}
    for name in ("scale_to_t", "other@seed1"):
        runs[name] = shutil.copytree(sweep.runs / "scale_to_t/seed0/eval", tmp_path / name)
        (runs[name] / "summary.json").write_text(json.dumps({**json.loads((runs[name] / "summary.json").read_text()),
                                                             "run_name": name}))
    _, _, stats = write_tables(runs, tmp_path / "t", "none", "none@seed0")
    text = stats.read_text()
    assert "- † scale_to_t: scale_to_t: its name carries no seed, so it pairs with no seeded run (its training " \
           "record says seed 0: `llava-norm eval --name scale_to_t@seed0` names it so)" in text, text
    assert "- † other: other@seed1: named seed 1, but its training record says seed 0: it pairs as seed 1" in text
    assert "none †" not in text and "| none |" in text  # the runs whose names agree are not marked
    # where the checkpoints are now (moved since their evaluation, say) is what is read: other@seed1's
    # is seed 1's here, so it is not marked
    moved = {name: sweep.runs / "none" / f"seed{s}" / "stage2" / "model" for s, name in enumerate(["none@seed0", "none@seed1"])}
    moved["other@seed1"] = sweep.runs / "scale_to_t/seed1/stage2/model"
    _, _, stats = write_tables(runs, tmp_path / "now", "none", "none@seed0", checkpoints=moved)
    assert "other@seed1: named seed 1" not in stats.read_text() and "scale_to_t: scale_to_t: its name" in stats.read_text()


def test_the_recipe_has_every_arm_on_its_slices():
    from llava_norm.config import load_config
    from llava_norm.config_schema import NORM_ARMS
    from llava_norm.sweep import arm_dirs

    dirs = arm_dirs(REPO / "configs/recipe-1gpu")
    assert [Path(d).name for d in dirs] == list(NORM_ARMS)  # every arm, the baseline 'none' first
    for d in dirs:
        one, two = (load_config(Path(d) / f"stage{s}.yaml", check_paths=False) for s in (1, 2))
        assert one.model.norm_alignment == two.model.norm_alignment == Path(d).name
        assert (one.model.llm, one.model.vision_tower) == ("Qwen/Qwen2.5-0.5B-Instruct", "google/siglip-base-patch16-224")
        assert [m.take for m in one.data.mixture] == ["first:50000"] and [m.take for m in two.data.mixture] == [
            "first:40000"]
        assert (one.train.global_batch_size, two.train.global_batch_size) == (256, 128)


def test_the_table_job_marks_runs_a_rerun_would_not_reuse(sweep, tmp_path):
    clean = _cli("sweep", *sweep.args, "--table-only", "--table", str(tmp_path / "same"))
    assert clean.returncode == 0, clean.stderr
    assert "†" not in (tmp_path / "same_stats.md").read_text()
    changed = _cli("sweep", *sweep.args, "--stage2=train.max_steps=3", "--table-only", "--table", str(tmp_path / "new"))
    assert changed.returncode == 0, changed.stderr
    text = (tmp_path / "new_stats.md").read_text()
    assert "| none † |" in text and "| scale_to_t † |" in text
    assert "- † none: none@seed0: stage 2 does not match a rerun: train.max_steps: 2 -> 3" in text
    rows = list(csv.DictReader((tmp_path / "new_stats.csv").open()))
    assert all("does not match a rerun" in r["note"] for r in rows)
    # a chain whose stage 1 was restarted and interrupted: its projector is gone, so stage 2's
    # config no longer loads; the table still comes out, the run marked
    projector = sweep.runs / "none" / "seed0" / "stage1" / "projector.safetensors"
    moved = projector.rename(tmp_path / "projector.safetensors")
    try:
        gone = _cli("sweep", *sweep.args, "--table-only", "--table", str(tmp_path / "gone"))
    finally:
        moved.rename(projector)
    assert gone.returncode == 0, gone.stderr
    text = (tmp_path / "gone_stats.md").read_text()
    assert "- † none: none@seed0: stage 2 does not match a rerun: " in text and "path does not exist" in text, text
    # the benchmark files moved since the evaluations (the data root copied to another disk, say):
    # both tables read them where --data-root says now
    root = sweep.root / "world" / "benchmarks"
    elsewhere = root.rename(tmp_path / "benchmarks-now")
    try:
        args = [str(elsewhere) if a == str(root) else a for a in sweep.args]
        assert args != sweep.args
        now = _cli("sweep", *args, "--table-only", "--table", str(tmp_path / "now"))
    finally:
        elsewhere.rename(root)
    assert now.returncode == 0, now.stderr
    assert (tmp_path / "now.md").read_text().split("\n## ")[0] == (tmp_path / "same.md").read_text().split("\n## ")[0]
    assert (tmp_path / "now_stats.csv").read_text() == (tmp_path / "same_stats.csv").read_text()
    # no finished evaluation of the baseline arm yet: the per-run table comes out, the statistics
    # say why they cannot
    summaries = list(sweep.runs.glob("none/seed*/eval/summary.json"))
    assert summaries
    for summary in summaries:
        summary.rename(summary.with_name("summary.json.aside"))
    try:
        early = _cli("sweep", *sweep.args, "--table-only", "--table", str(tmp_path / "early"))
    finally:
        for summary in summaries:
            summary.with_name("summary.json.aside").rename(summary)
    assert early.returncode != 0 and "baseline arm 'none' not among the runs' arms" in early.stderr, early.stderr
    # the runs left out are named (a failed array task would otherwise leave a table that looks whole)
    left_out = [name for name in NAMES if name.startswith("none@")]
    assert f"{len(left_out)} of {len(NAMES)} runs have no finished evaluation and are left out of the tables: " \
           f"{', '.join(left_out)}" in early.stdout, early.stdout
    assert (tmp_path / "early.md").is_file() and not (tmp_path / "early_stats.md").exists()


def test_from_outside_the_checkout_missing_relative_paths_come_with_where_they_are_read(tmp_path, monkeypatch):
    """The new user's trial: the shipped configs' relative paths (runs/..., configs/deepspeed/...)
    from another directory were listed as missing with nothing saying why, once per arm; now once,
    and the last problem says where relative paths are read and where to run it. Nothing is written."""
    done = _cli("sweep", str(REPO / "configs/tiny"), "--arms", "none,ln_textnorm_gwc", "--slurm", str(tmp_path / "out"),
                cwd=tmp_path)
    problems = [line for line in done.stdout.splitlines() if line.startswith("problem: ")]
    # a cause every arm's files share is one problem (each file's path no longer tells them apart)
    assert done.returncode == 1 and [p for p in problems if "configs/deepspeed/zero2.json" in p] == [
        "problem: every arm, stages 1 and 2: key 'train.deepspeed': path does not exist: configs/deepspeed/zero2.json"]
    assert problems[-1] == (f"problem: relative paths were read from {tmp_path.resolve()}, where this command runs; "
                            f"each launch reads them from the checkout, {REPO} (scripts/_launch.sh): run the command "
                            "from there"), problems
    assert not (tmp_path / "out").exists()
    # only missing absolute paths (the grid's check stood in for): running from the checkout would not help
    import llava_norm.sweep as sweeps

    absolute = "evaluation: pope: data path does not exist: /nowhere/eval/pope; the data root is /nowhere/eval"
    monkeypatch.setattr(sweeps, "check_grid", lambda config, gpus: ([absolute], 1.0))
    done = _cli("sweep", str(REPO / "configs/tiny"), "--arms", "none", "--slurm", str(tmp_path / "out"), cwd=tmp_path)
    assert [line for line in done.stdout.splitlines() if line.startswith("problem: ")] == [f"problem: {absolute}"]


def test_bad_grids_are_refused_before_anything_runs(sweep):
    out_of_range = _cli("sweep", *sweep.args, "--task", "4")
    assert out_of_range.returncode != 0 and "task 4 is not in 0..3" in out_of_range.stderr
    no_arm = _cli("sweep", *sweep.args[:1], "--arms", "none,nonexistent")
    assert no_arm.returncode != 0 and "nonexistent" in no_arm.stderr
    no_baseline = _cli("sweep", *sweep.args[:1], "--arms", "scale_to_t")
    assert no_baseline.returncode != 0 and "baseline arm 'none'" in no_baseline.stderr
    seeded = _cli("sweep", *sweep.args, "--stage1=train.seed=7")  # the sweep's own seed would replace it silently
    assert seeded.returncode != 0 and "train.seed=7: the sweep sets train.seed from --seeds" in seeded.stderr
    assert parse_seeds("0-2") == [0, 1, 2] and parse_seeds("3,5") == [3, 5]
    for bad in ("a,b", "2-0", "", ",", "-1", "0,-1"):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)
    arm_dir = _cli("sweep", str(REPO / "configs/recipe-1gpu/none"), "--dry-run")
    assert arm_dir.returncode != 0 and "is an arm directory" in arm_dir.stderr
    both = _cli("sweep", *sweep.args, "--slurm", "/tmp/x", "--task", "1")
    assert both.returncode != 0 and "--task and --table-only" in both.stderr


def test_an_arm_whose_stage_file_trains_the_other_stage_is_refused_before_the_grid_runs(tmp_path, tiny_dir):
    """finetune.sh refuses a stage2.yaml that trains stage 1 (tests/test_config.py); the grid's check
    says so before any stage 1 trains for hours."""
    import shutil

    from llava_norm.pipeline import PipelineConfig
    from llava_norm.sweep import check_grid

    shutil.copytree(REPO / "configs", tmp_path / "configs")  # the arm's base files beside it
    arm = tmp_path / "configs/tiny/none"
    (arm / "stage2.yaml").write_text((arm / "stage2.yaml").read_text().replace("train: {", "train: {stage: 1, "))
    data, images = write_dataset(tmp_path / "data", n=4)
    common = [f"model.vision_tower={tiny_dir}/siglip", f"model.llm={tiny_dir}/llama",
              f"data.mixture=[{{path: {data}, image_folder: {images}}}]"]
    world = tmp_path / "world"
    build_world(world, seed=5, n_pretrain=4, n_instruct=4, n_text=4, n_bench=2)
    problems, _ = check_grid(PipelineConfig(arms=[str(arm)], data_root=str(world / "benchmarks"), benchmarks="pope",
                                            stage1_overrides=common, stage2_overrides=common), gpus=1)
    assert problems == ["none, stage 2: key 'train.stage': the config trains stage 1, not stage 2"], problems
