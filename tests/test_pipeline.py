"""scripts/pipeline.sh on tiny configs: two arms through stage 1 -> stage 2 -> eval -> table, then
the reuse rule both ways. An unchanged rerun launches nothing; each kind of change (a YAML key,
a data file, the starting checkpoint, a benchmark file, the code version, an interrupted or
tampered stage) reruns exactly the steps it affects, with the differing key or input named.

The first run is shared by the module (it is the expensive part); every test but the last puts
back what it changed.
"""

import contextlib
import csv
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from launch import REPO, env, kill_during_save
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tinydata import write_dataset, write_stage1_config

from llava_norm.config_schema import ConfigError
from llava_norm.pipeline import PipelineConfig, launch, plan, run_steps
from llava_norm.provenance import RECORD, fingerprint, read_record
from llava_norm.reuse import stage_decision
from llava_norm.train.rundir import complete_checkpoints
from llava_norm_demo.synth import build_world

ARMS = ("none", "ln_textnorm_gwc")
BENCHMARKS = "pope,ai2d,mmlu"


def _statuses(stdout: str) -> dict[str, str]:
    rows = [line.rsplit(None, 3) for line in stdout.splitlines() if line.strip().endswith(" s")]
    return {row[0].strip(): row[1] for row in rows if len(row) == 4}


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("pipeline")
    shutil.copytree(REPO / "configs", root / "configs")  # arm YAMLs a test may edit
    shutil.copytree(tiny_dir / "llama", root / "llama")  # a backbone a test may change
    world = root / "world"
    build_world(world, seed=5, n_pretrain=10, n_instruct=10, n_text=20, n_bench=4, bench_sizes={"pope": 2})
    data, images = write_dataset(root / "data", n=8, text_only_every=4)
    # One process without DeepSpeed keeps it quick (the multi-process paths have their own tests).
    common = [f"model.vision_tower={tiny_dir}/siglip", f"model.llm={root}/llama",
              f"data.mixture=[{{path: {data}, image_folder: {images}}}]", "train.max_steps=2",
              "train.deepspeed=null", "train.per_device_batch_size=2", "train.save_steps=1"]
    runs = root / "runs"
    arms = [str(root / "configs/tiny" / arm) for arm in ARMS]
    eval_args = ["--limit=2", "--max-new-tokens-cap=4"]
    command = ["bash", "scripts/pipeline.sh", "--runs", str(runs), "--data-root", str(world / "benchmarks"),
               "--benchmarks", BENCHMARKS, *[f"--eval-arg={a}" for a in eval_args],
               *[f"--stage1={o}" for o in common], *[f"--stage2={o}" for o in common], *arms]
    environment = {**env(), "GPUS_PER_NODE": "1"}

    def launch(*extra: str) -> subprocess.CompletedProcess:
        result = subprocess.run([*command[:2], *extra, *command[2:]], cwd=REPO, env=environment,
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result

    def decide(code_counts: bool = False, reuse_stale: bool = False) -> dict[str, object]:
        """What the pipeline would do now, step by step, without running anything."""
        config = PipelineConfig(arms=arms, runs_dir=str(runs), data_root=str(world / "benchmarks"),
                                benchmarks=BENCHMARKS, stage1_overrides=common, stage2_overrides=common,
                                eval_args=eval_args, env={"GPUS_PER_NODE": "1"}, code_counts=code_counts)
        steps, _ = plan(config)
        decisions: dict[str, object] = {}
        run_steps(steps, dry_run=True, decisions=decisions, reuse_stale=reuse_stale)
        return decisions

    first = launch()
    return SimpleNamespace(root=root, runs=runs, world=world, data=data, arms=arms, launch=launch, decide=decide,
                           first=first, command=command, environment=environment)


def kill_in_stage(project, out: Path) -> str:
    """Launch the pipeline and SIGKILL its process group while the training run in ``out`` writes
    checkpoint-2, its last (checkpoint-1 complete). Proves the kill (launch.kill_during_save: no
    process survives, no file changes afterwards, the run had not finished); returns the output."""
    _, printed = kill_during_save([(project.command, project.environment)], out, 2, "early")
    assert not read_record(out).complete
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-1"]
    return printed


@contextlib.contextmanager
def appended(path: Path, text: str):
    """The file with ``text`` appended, put back afterwards."""
    original = path.read_text()
    path.write_text(original + text)
    try:
        yield
    finally:
        path.write_text(original)


def _reruns(decisions: dict) -> dict[str, list[str]]:
    """step -> reasons, for the steps that would run (the table always runs)."""
    return {name: d.reasons for name, d in decisions.items() if not d.reuse and name != "results table"}


def test_first_run_trains_evaluates_and_tabulates_with_provenance(project):
    runs = project.runs
    rows = list(csv.DictReader((runs / "results.csv").open()))
    assert [r["run"] for r in rows] == list(ARMS)
    assert rows[0]["is_baseline"] == "True" and float(rows[0]["pope_delta"]) == 0.0
    assert {"pope", "ai2d", "mmlu", "average", "checkpoint", "config_hash", "eval_settings", "evaluated",
            "code"} <= set(rows[0])
    for row, arm in zip(rows, ARMS):
        assert row["marks"] == "", row["marks"]
        assert row["checkpoint"] == str(runs / arm / "stage2/model")
        record = json.loads((runs / arm / "stage2" / RECORD).read_text())
        assert record["complete"] and record["seed"] == 42 and record["environment"]["source"]
        assert set(record["inputs"]) >= {"model.llm", "model.pretrained_projector", "data.mixture.0.path"}
        assert "optim.lr" in record["config"] and "train.output_dir" not in record["config"]
    markdown = (runs / "results.md").read_text()
    assert "| ln_textnorm_gwc |" in markdown and "Where each row comes from" in markdown and "†" not in markdown


def test_an_unchanged_rerun_launches_nothing(project):
    logs = {p: p.stat().st_mtime_ns for p in project.runs.rglob("*") if p.is_file() and p.suffix in (".log", ".json")
            and "results" not in p.name}
    second = project.launch()
    statuses = _statuses(second.stdout)
    assert list(statuses.values()) == ["reused"] * 6 + ["done"], second.stdout
    print("timings of the unchanged rerun:\n" + "\n".join(l for l in second.stdout.splitlines() if l.endswith(" s")))
    assert {p: p.stat().st_mtime_ns for p in logs} == logs  # no log appended, no result rewritten


def test_a_changed_data_file_reruns_both_stages_of_every_arm_that_reads_it(project):
    original = project.data.read_text()
    rows = json.loads(original)
    project.data.write_text(json.dumps(rows[:-1]))
    try:
        reruns = _reruns(project.decide())
        assert set(reruns) == {f"{arm}: {step}" for arm in ARMS for step in ("stage 1", "stage 2", "eval")}
        assert any(r.startswith("input data.mixture.0.path changed") for r in reruns["none: stage 1"])
    finally:
        project.data.write_text(original)
    assert _reruns(project.decide()) == {}


def test_a_changed_starting_checkpoint_reruns_from_the_stage_that_loads_it(project):
    weights = project.root / "llama/model.safetensors"
    original = weights.read_bytes()
    state = load_file(str(weights))
    name = sorted(state)[0]
    state[name] = state[name] + 1e-3
    save_file(state, str(weights), metadata={"format": "pt"})
    try:
        reruns = _reruns(project.decide())
        # stage 1 loads the LLM; everything after it reads what stage 1 wrote: every step reruns
        assert set(reruns) == {f"{arm}: {step}" for arm in ARMS for step in ("stage 1", "stage 2", "eval")}
        assert any(r.startswith("input model.llm changed") for r in reruns["none: stage 1"])
    finally:
        weights.write_bytes(original)
    # The stage-1 projector is stage 2's starting checkpoint: changing it (and its record) reruns stage 2 on.
    stage1 = project.runs / "none/stage1"
    projector = stage1 / "projector.safetensors"
    original_projector, original_record = projector.read_bytes(), (stage1 / RECORD).read_text()
    state = load_file(str(projector))
    with safe_open(str(projector), "pt") as f:  # the same run's projector, other weights: its origin kept
        origin = f.metadata()
    save_file({k: v * 2 for k, v in state.items()}, str(projector), metadata=origin)
    try:
        reruns = _reruns(project.decide())
        assert set(reruns) == {"none: stage 1", "none: stage 2", "none: eval"}
        assert reruns["none: stage 1"] == ["output projector was changed after the run recorded it"]
        record = json.loads(original_record)
        record["outputs"]["projector"] = fingerprint(projector)
        (stage1 / RECORD).write_text(json.dumps(record))  # as if stage 1 had produced it
        reruns = _reruns(project.decide())
        assert set(reruns) == {"none: stage 2", "none: eval"}
        assert any(r.startswith("input model.pretrained_projector changed") for r in reruns["none: stage 2"])
    finally:
        projector.write_bytes(original_projector)
        (stage1 / RECORD).write_text(original_record)
    assert _reruns(project.decide()) == {}


def test_a_changed_benchmark_file_reruns_only_that_evaluation(project):
    pope = next(p for p in sorted((project.world / "benchmarks/pope").rglob("*")) if p.is_file() and p.stat().st_size)
    original = pope.read_bytes()
    pope.write_bytes(original + b"\n")
    try:
        reruns = _reruns(project.decide())
        assert set(reruns) == {"none: eval", "ln_textnorm_gwc: eval"}
        assert reruns["none: eval"] == ["pope: data_fingerprint"]
    finally:
        pope.write_bytes(original)
    assert _reruns(project.decide()) == {}


def test_a_code_change_alone_is_noted_and_counts_only_when_asked(project):
    path = project.runs / "none/stage2" / RECORD
    original = path.read_text()
    record = json.loads(original)
    record["environment"]["source"] = "0" * 16
    path.write_text(json.dumps(record))
    try:
        decisions = project.decide()
        assert _reruns(decisions) == {}
        assert decisions["none: stage 2"].notes[0].startswith("code: ")
        assert set(_reruns(project.decide(code_counts=True))) == {"none: stage 2", "none: eval"}
    finally:
        path.write_text(original)


def test_an_interrupted_stage_resumes_and_a_stale_one_restarts(project):
    path = project.runs / "none/stage2" / RECORD
    original = path.read_text()
    record = json.loads(original)
    path.write_text(json.dumps({**record, "complete": False}))
    try:
        decision = project.decide()["none: stage 2"]
        assert decision.reasons == ["interrupted: resuming it"] and not decision.stale
    finally:
        path.write_text(original)
    path.unlink()  # a run without a record cannot prove what it was
    try:
        decision = project.decide()["none: stage 2"]
        assert decision.stale and decision.reasons == ["its output has no provenance record"]
    finally:
        path.write_text(original)


def test_deleted_outputs_rerun_and_reuse_stale_never_keeps_an_unfinished_step(project):
    model = project.runs / "none/stage2/model"
    shutil.move(model, project.root / "moved-model")
    try:
        decision = project.decide(reuse_stale=True)["none: stage 2"]
        assert not decision.reuse and decision.reasons == ["output model is missing"]
    finally:
        shutil.move(project.root / "moved-model", model)
    path = project.runs / "none/stage1" / RECORD
    original = path.read_text()
    record = json.loads(original)
    record["config"]["optim.lr"] = 1.0  # stale, and interrupted: nothing finished to keep
    path.write_text(json.dumps({**record, "complete": False}))
    try:
        decision = project.decide(reuse_stale=True)["none: stage 1"]
        assert not decision.reuse and decision.stale and not decision.finished
    finally:
        path.write_text(original)
    # an output changed by hand is never kept, even beside a stale config (which alone --reuse-stale keeps)
    projector = project.runs / "none/stage1" / "projector.safetensors"
    saved = projector.read_bytes()
    projector.write_bytes(saved + b"\0")
    try:
        with appended(Path(project.arms[0]) / "stage1.yaml", "optim: {weight_decay: 0.1}\n"):
            decision = project.decide(reuse_stale=True)["none: stage 1"]
        assert not decision.reuse and not decision.finished, decision
        assert "output projector was changed after the run recorded it" in decision.reasons, decision.reasons
    finally:
        projector.write_bytes(saved)
    pope = project.runs / "none/eval/pope.json"
    hidden = pope.with_suffix(".hidden")
    pope.rename(hidden)  # a benchmark not evaluated yet is never kept as "stale"
    try:
        assert not project.decide(reuse_stale=True)["none: eval"].reuse
    finally:
        hidden.rename(pope)


def test_reusing_a_stale_step_on_purpose_marks_its_row(project):
    with appended(Path(project.arms[0]) / "stage2.yaml", "optim: {weight_decay: 0.1}\n"):
        result = project.launch("--reuse-stale")
    assert set(_statuses(result.stdout).values()) == {"reused", "done"}
    assert list(_statuses(result.stdout).values()).count("done") == 1  # the table only
    rows = {r["run"]: r for r in csv.DictReader((project.runs / "results.csv").open())}
    assert "stage 2 stale, reused: optim.weight_decay" in rows["none"]["marks"]
    assert rows["ln_textnorm_gwc"]["marks"] == ""
    assert "| none † |" in (project.runs / "results.md").read_text()


def test_a_yaml_edit_to_stage_2_reruns_that_stage_and_its_evaluation_only(project):
    with appended(Path(project.arms[1]) / "stage2.yaml", "optim: {lr: 3.0e-5}\n"):
        reruns = _reruns(project.decide())
        assert set(reruns) == {"ln_textnorm_gwc: stage 2", "ln_textnorm_gwc: eval"}
        assert [r.split(":")[0] for r in reruns["ln_textnorm_gwc: stage 2"]] == ["optim.lr"]
        assert reruns["ln_textnorm_gwc: eval"] == ["an earlier step of this arm would run"]
        before = json.loads((project.runs / "ln_textnorm_gwc/eval/pope.json").read_text())
        kill_in_stage(project, project.runs / "ln_textnorm_gwc/stage2")  # interrupted in the stale stage
        decision = project.decide()["ln_textnorm_gwc: stage 2"]
        assert decision.reasons == ["interrupted: resuming it"] and not decision.stale
        result = project.launch()  # the same command continues at the interrupted stage
        statuses = _statuses(result.stdout)
        assert [statuses[f"ln_textnorm_gwc: {s}"] for s in ("stage 1", "stage 2", "eval")] == ["reused", "done", "done"]
        summary = json.loads((project.runs / "ln_textnorm_gwc/stage2/train_summary.json").read_text())
        # continued from the checkpoint the killed launch completed: only the remaining step trained
        assert summary["resumed_from"] == str(project.runs / "ln_textnorm_gwc/stage2/checkpoint-1")
        assert (summary["global_step"], summary["steps_this_launch"]) == (2, 1)
        assert all(statuses[f"none: {s}"] == "reused" for s in ("stage 1", "stage 2", "eval"))
        assert "stage 2: running (interrupted: resuming it)" in result.stdout  # not restarted: continued
        after = json.loads((project.runs / "ln_textnorm_gwc/eval/pope.json").read_text())
        assert after["settings"]["checkpoint_fingerprint"] != before["settings"]["checkpoint_fingerprint"]
        assert _reruns(project.decide()) == {}
    # Back to the original YAML: the run it now holds is stale the other way.
    assert set(_reruns(project.decide())) == {"ln_textnorm_gwc: stage 2", "ln_textnorm_gwc: eval"}


@pytest.mark.parametrize("override,key", [
    ("data.mixture=[{{path: {tmp}/data/data.json, image_folder: {tmp}/no_images}}]", "data.mixture[0].image_folder"),
    ("data.mixture=[{{path: {tmp}/no.json, image_folder: {tmp}/data/images}}]", "data.mixture[0].path"),
    ("model.llm={tmp}/no_llm", "model.llm"),
    ("model.pretrained_projector={tmp}/no.safetensors", "model.pretrained_projector"),
    ("train.deepspeed={tmp}/no.json", "train.deepspeed"),
])
def test_a_stage_decision_names_a_missing_input_by_its_config_and_key(tmp_path, tiny_dir, override, key):
    """The reuse decision skips the machine's checks (the launch's), not the input files' (each
    input a training record fingerprints): a missing one is named by the config file and its key,
    before anything launches."""
    config = write_stage1_config(tmp_path / "stage1.yaml", tiny_dir, *write_dataset(tmp_path / "data", n=4))
    assert stage_decision(config, [], tmp_path / "out", 1, False).reasons == ["not run yet"]
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(config))}: key '{re.escape(key)}': "):
        stage_decision(config, [override.format(tmp=tmp_path)], tmp_path / "out", 1, False)


def test_a_stage_that_would_run_gets_the_launchs_checks_before_it_launches(tmp_path, tiny_dir):
    """A stage the pipeline is about to run (or a dry run says it would) is checked as its launch
    will be, this machine's packages included: the problem is said in one line naming the config
    and key, not found in a launch's log (buried, on several GPUs, under torchrun's report)."""
    config = write_stage1_config(tmp_path / "stage1.yaml", tiny_dir, *write_dataset(tmp_path / "data", n=4))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(config))}: key 'train.report_to': \['tensorboardx'\]"):
        stage_decision(config, ["train.report_to=[tensorboardx]"], tmp_path / "out", 1, False)


@pytest.mark.parametrize("streamed", [True, False])
def test_a_failed_launch_stops_the_chain_with_the_steps_error(tmp_path, streamed):
    """Streamed (--stream) or logged, a launch that fails ends in the step's one-line error, which
    the command line prints and exits on, not in a traceback."""
    log = None if streamed else tmp_path / "step.log"
    with pytest.raises(RuntimeError, match=r"^step failed \(exit 3\): bash -c echo said; exit 3"):
        launch(["bash", "-c", "echo said; exit 3"], log)
    if log is not None:  # the command's output, below the header line that quotes the command
        assert log.read_text().splitlines()[-1] == "said"


def test_a_failed_launchs_errors_above_its_last_lines_are_shown_and_earlier_launches_are_not(tmp_path):
    """A worker's one-line error followed by more than the shown tail (as torchrun's report of the
    failed workers follows it) is still in the step's error, before the tail; lines naming an error
    are shown once each, the first and last ten of them; a failed launch before it in the same log
    is not shown."""
    log = tmp_path / "step.log"
    with pytest.raises(RuntimeError):
        launch(["bash", "-c", "echo 'data error: an earlier launch'; exit 1"], log)
    # the words are printed, not spelled in the command (which the step's error quotes)
    noisy = ("printf 'data %s: rows.json row 7\\n' error; for i in $(seq 30); do printf 'warn: an %s again\\n' error; done; "
             "printf 'bad byte \\xff %s\\n' error; printf 'bar 1%%\\rbar 2 %s\\n' error; for i in $(seq 25); do printf 'step %s %s\\n' $i error; done; "
             "for i in $(seq 60); do echo noise $i; done; exit 1")
    with pytest.raises(RuntimeError) as failed:
        launch(["bash", "-c", noisy], log)
    message = str(failed.value)
    assert "data error: rows.json row 7\n" in message and "noise 60\n" in message
    assert message.index("data error: rows.json row 7") < message.index("noise 21\n")
    assert message.count("warn: an error again") == 1 and "bad byte \ufffd error\n" in message
    assert "\nbar 2 error\n" in message and "\r" not in message  # a progress bar's rewritten line, as shown
    assert "step 6 error\n" in message and "... (9 more)\n" in message and "step 7 error" not in message
    shown = ["data error: rows.json row 7", "warn: an error again", "bad byte", "\nbar 2 error", "step 1 error",
             "step 6 error", "... (9 more)", "step 16 error", "step 25 error", "noise 21\n"]
    report = message[message.index("\n--- lines naming an error"):]  # below the quoted command
    assert [report.index(line) for line in shown] == sorted(report.index(line) for line in shown)  # first-seen order
    assert "noise 20\n" not in message and "an earlier launch" not in message


def test_an_arm_whose_stage_file_trains_the_other_stage_is_refused_before_any_step(tmp_path):
    """finetune.sh refuses a stage2.yaml that trains stage 1, but only when stage 2 starts; the
    pipeline (and each sweep task) says so while planning, before stage 1 trains, with every
    other arm's stage file that does not load."""
    shutil.copytree(REPO / "configs", tmp_path / "configs")  # the arm's base files beside it
    arms = [tmp_path / "configs/tiny/none", tmp_path / "configs/tiny/ln_textnorm_gwc"]
    (arms[1] / "stage2.yaml").write_text((arms[1] / "stage2.yaml").read_text().replace("train: {", "train: {stage: 1, "))
    expected = (f"ln_textnorm_gwc stage 2: {arms[1] / 'stage2.yaml'}: key 'train.stage': the config trains stage 1, "
                "not stage 2")
    config = PipelineConfig(arms=[str(a) for a in arms], runs_dir=str(tmp_path / "runs"), benchmarks="pope")
    with pytest.raises(ValueError) as refused:
        plan(config)
    assert str(refused.value) == expected
    config.seeds, config.task = [0], 1  # the sweep task that runs that arm
    with pytest.raises(ValueError, match=re.escape(expected)):
        plan(config)
    config.task = 0  # the other arm's task runs
    assert [step.name for step in plan(config)[0]] == ["none@seed0: stage 1", "none@seed0: stage 2", "none@seed0: eval"]
    assert not (tmp_path / "runs").exists()
    # a key that does not load in one arm's stage 1 as well: both said at once, not the first alone
    (arms[0] / "stage1.yaml").write_text((arms[0] / "stage1.yaml").read_text() + "optim: {warmupx: 1}\n")
    config.seeds, config.task = [], None
    with pytest.raises(ValueError) as refused:
        plan(config)
    assert str(refused.value).splitlines() == [
        f"none stage 1: {arms[0] / 'stage1.yaml'}: key 'optim.warmupx': Key 'warmupx' not in 'OptimConfig'. Did you "
        "mean: 'warmup_ratio'?", expected], str(refused.value)


@pytest.mark.parametrize("global_batch", [16, None])
def test_a_stage_on_another_number_of_processes_is_kept_only_under_a_fixed_global_batch(tmp_path, global_batch):
    """A requeue on fewer nodes (README, "Another number of processes"): with train.global_batch_size
    fixed, each step trains the same samples on any count, so a finished stage is kept and an
    interrupted one resumed, not deleted and retrained; without it the batch changes, so it reruns."""
    from llava_norm.provenance import fingerprint, make_record, write_record
    from llava_norm.reuse import _stage_decision

    out = tmp_path / "stage1"
    (out / "model").mkdir(parents=True)
    (out / "model" / "model.safetensors").write_text("weights")
    settings = {"train.global_batch_size": global_batch, "world_size": 1}
    for complete in (True, False):
        found = make_record("stage1", settings, {})
        found.complete, found.outputs = complete, {"model": fingerprint(out / "model")}
        write_record(out, found)
        decision = _stage_decision(make_record("stage1", {**settings, "world_size": 2}, {}), out, False)
        if global_batch is None:
            assert not decision.reuse and decision.stale and decision.reasons == ["world_size: 1 -> 2"]
        else:
            assert decision.kept == ["world_size: 1 -> 2"] and not decision.stale
            assert (decision.reuse, decision.reasons) == ((True, []) if complete else (False, ["interrupted: resuming it"]))
