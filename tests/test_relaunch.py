"""Relaunching on an output dir that holds a run: every decision, and what the files look like after.

Single process, in-process and without DeepSpeed, so each launch costs a few seconds; the
multi-process shapes are in test_resume.py and test_resume_ddp_one_process.py.
"""

import json
import os
import pickle
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from PIL import Image

from launch import saved_as_is, scheduled_rates, snapshot
from tinydata import write_dataset

from llava_norm.config import load_config, to_yaml
from llava_norm.train.relaunch import RelaunchError, config_differences, plan_launch
from llava_norm.train.deepspeed_setup import safe_deepspeed_loading
from llava_norm.train.run import run_training
from llava_norm.train.trainer import LlavaNormTrainer, ResumeError


@pytest.fixture
def run(tmp_path, tiny_dir):
    data, images = write_dataset(tmp_path / "data", n=8, text_only_every=3)
    path = tmp_path / "c.yaml"
    path.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: ln_textnorm_gwc}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], num_workers: 0, max_length: 256}}
train: {{stage: 2, output_dir: {tmp_path}/out, max_steps: 3, per_device_batch_size: 2, grad_accum: 1,
        save_steps: 1, report_to: []}}
""")

    def launch(*overrides):
        return run_training(load_config(path, list(overrides)))

    return launch, tmp_path / "out", path


def _summary(out):
    return json.loads((out / "train_summary.json").read_text())


def test_finished_run_is_left_alone_and_the_ways_out_are_explicit(run, capsys, tiny_dir, tmp_path):
    launch, out, path = run
    launch()
    assert _summary(out)["complete"] and _summary(out)["global_step"] == 3
    exported = {p.name for p in (out / "model").iterdir()}
    assert "training_args.bin" not in exported  # a pickle never ships with the model
    assert all(name.endswith((".safetensors", ".json", ".jinja", ".txt", ".model")) for name in exported), exported

    before = snapshot(out)
    assert launch() is None  # the same command again: nothing trained, nothing written
    assert "complete at step 3" in capsys.readouterr().out
    assert snapshot(out) == before
    # the same inputs spelt from this folder, or through a symlink: the same run, nothing to do
    (tmp_path / "backbones").symlink_to(tiny_dir)
    data = os.path.relpath(tmp_path / "data" / "data.json")
    same = [f"model.llm={os.path.relpath(tiny_dir / 'llama')}", f"model.vision_tower={tmp_path / 'backbones/siglip'}",
            f"data.mixture=[{{path: {data}, image_folder: {tmp_path / 'data/images'}}}]"]
    assert launch(*same) is None and "complete at step 3" in capsys.readouterr().out
    assert snapshot(out) == before

    with pytest.raises(RelaunchError, match=r"optim\.lr: 1e-05 -> 0\.001"):
        launch("optim.lr=1e-3")  # a different config is refused, naming the key
    with pytest.raises(RelaunchError, match="train.restart=true"):
        launch("train.resume=none")
    assert snapshot(out) == before

    launch("train.max_steps=5", "train.extend=true", "train.logging_steps=1")  # continues from the last checkpoint
    assert (_summary(out)["global_step"], _summary(out)["steps_this_launch"]) == (5, 2)
    assert _summary(out)["resumed_from"] == str(out / "checkpoint-3")
    # the extended updates take the lengthened schedule's rates from the first one on (the 3-step
    # cosine the checkpoint's optimizer holds ends at 0)
    expected = scheduled_rates(load_config(path, ["train.max_steps=5"]).optim, 1, 5)  # warmup_ratio 0.03 of 5: 1
    logged = {e["step"]: {k: v for k, v in e.items() if k.startswith("lr/")} for e in _summary(out)["log_history"]
              if "loss" in e}
    assert {step: logged[step] for step in (4, 5)} == {step: expected[step] for step in (4, 5)}, logged
    assert min(expected[4].values()) > 0

    launch("train.restart=true")  # deletes the run's outputs, trains from scratch
    assert (_summary(out)["global_step"], _summary(out)["steps_this_launch"], _summary(out)["resumed_from"]) == (3, 3, None)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]  # 4, 5 gone


def test_a_restart_deletes_only_a_runs_outputs_and_never_the_projector_it_loads(run, tmp_path):
    """train.restart removes what a run wrote: in a folder that holds no run, files that only share
    a run output's name (a "runs" or "model" folder, a config.yaml) are refused by name, not
    deleted; and in a run's folder, the stage-1 projector a stage 2 would load from it is refused
    before anything is removed (the launch deleted it, then failed loading it)."""
    launch, out, path = run
    other = tmp_path / "elsewhere"
    for name in ("runs/old/r.txt", "model/w.txt", "config.yaml"):
        (other / name).parent.mkdir(parents=True, exist_ok=True)
        (other / name).write_text("keep")
    before = snapshot(other)
    with pytest.raises(RelaunchError, match=re.escape(f"{other}: train.restart=true would delete model, config.yaml, "
                                                      "runs, but the folder holds no llava-norm run")):
        plan_launch(load_config(path, [f"train.output_dir={other}", "train.restart=true"]))
    assert snapshot(other) == before
    launch()
    before = snapshot(out)
    for projector in (out / "projector.safetensors", out / "checkpoint-3"):
        with pytest.raises(RelaunchError, match=re.escape(f"would delete model.pretrained_projector {projector} (in "
                                                          f"{projector.name}) before this launch loads it")):
            plan_launch(load_config(path, ["train.restart=true", f"model.pretrained_projector={projector}"],
                                    check_paths=False))
    assert snapshot(out) == before
    assert plan_launch(load_config(path, ["train.restart=true"])).action == "fresh"  # a run's folder: as before


def test_a_checkpoint_changed_after_its_save_is_refused_naming_its_files(run, tmp_path):
    """A complete checkpoint whose optimizer.pt was deleted resumed with a fresh optimizer and
    schedule without a word; one with a file cut short failed in a traceback, while `check` said
    OK. Its marker records every file's size: the relaunch and `check` refuse it, naming the files
    and the complete checkpoint before it, which `train.resume` then resumes."""
    from llava_norm.train.preflight import preflight
    from llava_norm.train.rundir import complete_checkpoints

    launch, out, path = run
    launch()
    (out / "train_summary.json").unlink()  # as if killed after its last checkpoint
    *_, before, last = complete_checkpoints(out)
    (last / "optimizer.pt").unlink()
    (last / "training_args.bin").unlink()  # never read by a resume: its loss is not a change
    state = last / "trainer_state.json"
    saved = state.stat().st_size
    state.write_text(state.read_text()[:50])
    said = (f"{last}: it holds a checkpoint to resume, but it changed after its save: optimizer.pt is missing; "
            f"trainer_state.json has 50 bytes, {saved:,} when saved. train.resume={before.resolve()} resumes from the "
            "last complete checkpoint before it as saved")
    with pytest.raises(RelaunchError) as refused:
        plan_launch(load_config(path))
    assert str(refused.value) == said
    assert f"{path}: relaunch refused: {said}" in preflight(path, [], 1, plan=False).problems
    plan = plan_launch(load_config(path, [f"train.resume={before}"]))
    assert (plan.action, plan.checkpoint) == ("resume", before)
    # its run config damaged in place (the size kept): named, not a YAML parser's traceback
    kept = (before / "run_config.yaml").read_bytes()
    (before / "run_config.yaml").write_bytes(b"garbage: [" + b" " * (len(kept) - 10))
    with pytest.raises(RelaunchError, match=re.escape(f"{before / 'run_config.yaml'}: not a readable config (")):
        plan_launch(load_config(path, [f"train.resume={before}"]))
    (before / "run_config.yaml").write_bytes(kept)
    # a named checkpoint under train.extend may take a larger train.max_steps, as the extension asks
    with pytest.raises(RelaunchError, match=r"train\.max_steps: 3 -> 5"):
        plan_launch(load_config(path, [f"train.resume={before}", "train.max_steps=5"]))
    assert plan_launch(load_config(path, [f"train.resume={before}", "train.max_steps=5", "train.extend=true"])).checkpoint \
        == before
    # the advice skips an earlier checkpoint that changed too
    (before / "rng_state.pth").unlink()
    earlier = [p for p in complete_checkpoints(out) if p not in (before, last)]
    with pytest.raises(RelaunchError) as refused:
        plan_launch(load_config(path))
    assert str(refused.value).endswith(f"train.resume={earlier[-1].resolve()} resumes from the last complete checkpoint "
                                       "before it as saved" if earlier else "train.restart=true starts over")


def test_a_damaged_run_record_is_named_in_one_line_by_check_and_the_relaunch(run, monkeypatch):
    """A relaunch reads the run's provenance record: a resume to carry its earlier launches'
    changes, a finished run's to complete it. One that no longer reads as a record was a traceback
    at the relaunch, and `check` said OK; both now name it in one line, for either."""
    from llava_norm.cli import main
    from llava_norm.provenance import RECORD, RELAUNCH_PAST_A_DAMAGED_RECORD
    from llava_norm.train.preflight import preflight

    launch, out, path = run
    launch()
    (out / RECORD).write_text("{")
    said = f"{path}: relaunch refused: {out / RECORD}: not a provenance record ("
    monkeypatch.delenv("RANK", raising=False)
    for then in ("finished", "resume"):
        if then == "resume":
            (out / "train_summary.json").unlink()  # as if killed after its last checkpoint
        assert [p for p in preflight(path, [], 1, plan=False).problems
                if p.startswith(said) and p.endswith(RELAUNCH_PAST_A_DAMAGED_RECORD)], then
        with pytest.raises(SystemExit) as refused:  # a resume's launch check says it, before anything loads
            main(["train", str(path)])
        told = str(refused.value.code)
        assert told.startswith(f"launch check: {said}" if then == "resume" else said.split(": ", 1)[1]), (then, told)
        assert told.endswith(RELAUNCH_PAST_A_DAMAGED_RECORD) and "\n" not in told, told


def test_changes_that_regroup_a_lora_runs_optimizer_are_named():
    """The shipped LoRA stage 2 (lora.vision_tower null: the tower trains in full, as
    train_vision_tower says): the tower frozen, adapted instead, another rank or arm each gives
    the model or optimizer other parameters; its learning rates do not."""
    from llava_norm.train.relaunch import optimizer_layout_changes

    path = Path(__file__).resolve().parents[1] / "configs/tiny/ln_textnorm_gwc/stage2_lora.yaml"
    saved = to_yaml(load_config(path, [], check_paths=False))

    def changes(*overrides):
        return optimizer_layout_changes(saved, load_config(path, list(overrides), check_paths=False))

    assert changes("train.train_vision_tower=false") == ["train.train_vision_tower: True -> False"]
    assert changes("lora.vision_tower=lora") == ["lora.vision_tower: None -> 'lora'"]
    assert changes("lora.vision_tower=full") == []  # what null means here
    assert changes("lora.rank=4") == ["lora.rank: 8 -> 4"]
    assert changes("model.norm_alignment=ln_textnorm") == ["model.norm_alignment: 'ln_textnorm_gwc' -> 'ln_textnorm'"]
    assert changes("optim.lr_lora=1e-4", "optim.lr=3e-5") == []
    # each other key the docstring names, one by one
    assert changes("model.projector_type=linear") == ["model.projector_type: 'mlp2x_gelu' -> 'linear'"]
    assert changes("lora.target_modules=[q_proj]") == ["lora.target_modules: None -> ['q_proj']"]
    assert changes("lora.lm_head=true") == ["lora.lm_head: False -> True"]
    assert changes("optim.weight_decay=0.1") == ["optim.weight_decay: 0.0 -> 0.1"]
    decayed = to_yaml(load_config(path, ["optim.weight_decay=0.1"], check_paths=False))
    assert optimizer_layout_changes(decayed, load_config(path, [], check_paths=False)) == \
        ["optim.weight_decay: 0.1 -> 0.0"]  # to 0 as from 0
    assert optimizer_layout_changes(decayed, load_config(path, ["optim.weight_decay=0.2"], check_paths=False)) == []
    # another stage: that change alone is said (the tower and LoRA follow from it)
    assert changes("train.stage=1", "lora.enabled=false") == ["train.stage: 2 -> 1"]


def test_the_advice_for_another_global_batch_is_one_that_resumes():
    """What a refused resume on another number of processes advises is what the relaunch then
    takes: the recorded global batch, a per-device batch that splits it over the processes where
    this launch's does not, and allow_config_change for the config's own key; where nothing
    splits it, the number of processes to change instead."""
    from llava_norm.train.rundir import global_batch_problem

    saved = {"world_size": 1, "global_batch": 8}
    said = global_batch_problem(saved, 2, 32, per_device=8)
    assert said == ("saved with a global batch of 8 on 1 process; on 2 processes it would be 32. Set "
                    "train.global_batch_size to 8 so the accumulation is re-derived, with train.per_device_batch_size "
                    "one of [1, 2, 4] (to split it over 2 processes), and train.allow_config_change=true where the "
                    "checkpoint's config names another global batch or none"), said
    assert "per_device_batch_size one of" not in global_batch_problem(saved, 2, 16, per_device=4)
    assert global_batch_problem(saved, 16, 16, per_device=1) == (
        "saved with a global batch of 8 on 1 process; on 16 processes it would be 16, and no per-device batch "
        "splits 8 rows over 16 processes: resume it on a number of processes that divides it")
    assert global_batch_problem(saved, 2, 8, per_device=4) is None


def test_a_rate_changed_under_allow_config_change_takes_effect_from_the_next_update(run):
    """A relaunch that lowers optim.lr* under train.allow_config_change (what the divergence stop
    advises) trains its remaining updates on the new config's schedule: the restored scheduler
    kept the checkpoint's peak rates, while config.yaml and the log named the new ones."""
    launch, out, path = run
    launch("train.logging_steps=1")
    (out / "train_summary.json").unlink()
    shutil.rmtree(out / "checkpoint-3")  # killed after checkpoint-2: update 3 is the relaunch's
    changed = ["optim.lr=1e-3", "optim.lr_projector=3e-3", "optim.lr_vision_tower=5e-4"]
    launch("train.logging_steps=1", *changed, "train.allow_config_change=true")
    expected = scheduled_rates(load_config(path, changed).optim, 1, 3)  # warmup_ratio 0.03 of 3: 1
    logged = {e["step"]: {k: v for k, v in e.items() if k.startswith("lr/")} for e in _summary(out)["log_history"]
              if "loss" in e}
    assert logged[3] == expected[3] and min(expected[3].values()) > 0, logged


def test_intervals_changed_on_a_relaunch_are_the_ones_it_saves_and_logs_at(run):
    """train.save_steps and train.logging_steps never block a resume, and the relaunch saves and
    logs at its own: transformers restores the checkpoint's with its state, which kept them."""
    launch, out, _ = run
    launch("train.max_steps=4", "train.logging_steps=1", "train.save_total_limit=10")
    (out / "train_summary.json").unlink()
    for step in (2, 3, 4):  # killed after checkpoint-1
        shutil.rmtree(out / f"checkpoint-{step}")
    launch("train.max_steps=4", "train.save_total_limit=10", "train.save_steps=2", "train.logging_steps=3")
    assert sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")) == [1, 2, 4]
    assert [e["step"] for e in _summary(out)["log_history"] if "loss" in e] == [1, 3]


def test_a_save_over_a_folder_of_another_course_of_the_run_clears_it_first(run):
    """Resumed by train.resume from checkpoint-2 while a complete checkpoint-3 is there (and a
    killed save's checkpoint-1 never completed): the save at step 3 clears that folder before it
    writes (a file the earlier save left, another world size's rank file say, would stay beside
    the new ones under the old marker), and the half-written folder goes too."""
    launch, out, _ = run
    launch("train.save_total_limit=10")
    (out / "train_summary.json").unlink()
    (out / "checkpoint-1" / "checkpoint_complete").unlink()  # as a killed save leaves it
    for folder in ("checkpoint-1", "checkpoint-3"):
        (out / folder / "zero_pp_rank_5_mp_rank_00_optim_states.pt").write_bytes(b"an earlier save's")
    launch("train.save_total_limit=10", f"train.resume={out / 'checkpoint-2'}")
    assert _summary(out)["resumed_from"] == str(out / "checkpoint-2")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    assert not list(out.rglob("zero_pp_rank_5_*"))
    assert json.loads((out / "checkpoint-3" / "checkpoint_complete").read_text())["step"] == 3


def test_checkpoint_with_another_config_is_refused_unless_allowed(run):
    launch, out, path = run
    launch()
    (out / "train_summary.json").unlink()  # as if killed after its last checkpoint
    config = load_config(path, ["data.max_length=128"])
    with pytest.raises(RelaunchError, match=r"data\.max_length: 256 -> 128.*allow_config_change"):
        plan_launch(config)
    plan = plan_launch(load_config(path, ["data.max_length=128", "train.allow_config_change=true"]))
    assert (plan.action, plan.checkpoint.name) == ("resume", "checkpoint-3")
    assert plan.differences == ["data.max_length: 256 -> 128"]
    # ... but not a change that regroups the optimizer: its saved state would not load (a
    # traceback deep in DeepSpeed, naming a setting the user never touched)
    for change, said in (("optim.weight_decay=0.5", "optim.weight_decay: 0.0 -> 0.5"),
                         ("train.train_vision_tower=false", "train.train_vision_tower: True -> False"),
                         ("lora.enabled=true", "lora.enabled: False -> True")):
        with pytest.raises(RelaunchError, match=re.escape(f"{said} would give the optimizer other parameters or "
                                                          "groups than the checkpoint's")):
            plan_launch(load_config(path, [change, "train.allow_config_change=true"]))
    # Where and how often to write never block a resume, nor a packing budget with packing off:
    # a moved run, other save and log intervals, other reporters, other loader workers.
    moved = out.parent / "moved"
    shutil.copytree(out, moved)
    assert plan_launch(load_config(path, [f"train.output_dir={moved}", "train.save_steps=7", "train.logging_steps=2",
                                          "train.report_to=[tensorboard]", "data.num_workers=2"])).action == "resume"
    # nor sdpa's kernel choice: a run saved while train.cudnn_attention's default was null resumes
    assert plan_launch(load_config(path, ["train.cudnn_attention=null"])).action == "resume"
    assert plan_launch(load_config(path, ["data.pack_max_tokens=512"])).action == "resume"
    with pytest.raises(RelaunchError, match=r"data\.packing: False -> True"):
        plan_launch(load_config(path, ["data.packing=true", "data.pack_max_tokens=512"]))
    # nor the fused loss's kernel with the plain loss; with the fused loss it is a change
    assert plan_launch(load_config(path, ["train.fused_loss_kernel=cce"])).action == "resume"
    with pytest.raises(RelaunchError, match=r"train\.loss: 'plain' -> 'fused'"):
        plan_launch(load_config(path, ["train.loss=fused", "train.fused_loss_kernel=cce"], check_paths=False))
    fused = to_yaml(load_config(path, ["train.loss=fused"], check_paths=False))  # a fused run's saved config
    other = load_config(path, ["train.loss=fused", "train.fused_loss_kernel=cce", "train.fused_loss_softmax=eager"],
                        check_paths=False)
    assert config_differences(fused, other) == ["train.fused_loss_kernel: 'torch' -> 'cce'",
                                                "train.fused_loss_softmax: 'auto' -> 'eager'"]
    # a run allowed to end before the checkpoint it would resume from is refused, writing nothing
    before = snapshot(out)
    with pytest.raises(RelaunchError, match=r"checkpoint-3: at step 3, past this run's last step 2 \(train\.max_steps"):
        launch("train.max_steps=2", "train.allow_config_change=true")
    assert plan_launch(load_config(path)).action == "resume"  # the run's own config still resumes it
    assert snapshot(out) == before
    # a run that ends by epochs is refused by the trainer at its start: half an epoch of 4 steps is 2
    with pytest.raises(ResumeError, match=r"checkpoint-3: at step 3, past this run's last step 2 \(train\.max_steps "
                                          r"or train\.epochs lowered\?\)"):
        launch("train.max_steps=-1", "train.epochs=0.5", "train.allow_config_change=true")
    assert not (out / "checkpoint-4").exists() and not (out / "train_summary.json").exists()


def test_a_cut_summary_resumes_the_run_and_an_unfinished_checkpoint_is_refused(run, caplog, monkeypatch):
    launch, out, path = run
    launch()
    summary = out / "train_summary.json"
    summary.write_text(summary.read_text()[:200])  # as a machine that went down mid-write may leave it
    plan = plan_launch(load_config(path))
    assert (plan.action, plan.checkpoint) == ("resume", out / "checkpoint-3")
    assert "train_summary.json is unreadable" in caplog.text
    launch()  # resumes at the last step, trains nothing, and writes the summary again
    assert (_summary(out)["global_step"], _summary(out)["steps_this_launch"]) == (3, 0)
    # train.resume naming a checkpoint whose save never finished: refused, the complete ones named
    (out / "checkpoint-2" / "checkpoint_complete").unlink()
    with pytest.raises(RelaunchError, match=r"checkpoint-2 was asked for, but it has no checkpoint_complete.*"
                                            r"Complete ones beside it: checkpoint-3$"):
        plan_launch(load_config(path, [f"train.resume={out / 'checkpoint-2'}"]))
    assert plan_launch(load_config(path, [f"train.resume={out / 'checkpoint-3'}"])).action == "resume"
    # train.resume naming no folder: said as that, not as a checkpoint of an older version; the
    # launch check says it once, by its key
    missing = out / "checkpoint-30"
    with pytest.raises(RelaunchError, match=rf"checkpoint-30 was asked for, but there is no such folder\. Complete "
                                            rf"checkpoints beside it: {out / 'checkpoint-3'}$"):
        plan_launch(load_config(path, [f"train.resume={missing}"], check_paths=False))
    from llava_norm.train.preflight import preflight

    assert preflight(path, [f"train.resume={missing}"], gpus=1, plan=False).problems == [
        f"{path}: key 'train.resume': path does not exist: {missing}"]
    # a stage-2 run without a stage-1 projector is warned of at its start only: a relaunch resumes
    # its checkpoint's trained projector
    assert not [w for w in preflight(path, [], gpus=1, plan=False).warnings if "pretrained_projector" in w]
    def random_start(*overrides):
        return [w for w in preflight(path, list(overrides), gpus=1, plan=False).warnings
                if "key 'model.pretrained_projector' is unset" in w]

    assert random_start(f"train.output_dir={out}-new")  # a new run
    assert random_start("train.restart=true")  # the run deleted, then trained from the built model
    assert not random_start(f"train.output_dir={out}-new", f"train.resume={out / 'checkpoint-3'}")  # its weights
    # train.resume under ~, as the config checks read it
    monkeypatch.setenv("HOME", str(out.parent))
    plan = plan_launch(load_config(path, [f"train.resume=~/{out.name}/checkpoint-3"]))
    assert (plan.action, plan.checkpoint) == ("resume", out / "checkpoint-3")


class _Payload:
    def __reduce__(self):
        return (print, ("unpickled code ran",))


def test_deepspeed_checkpoints_load_without_unpickling_code(tmp_path, capsys):
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    safe_deepspeed_loading()
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save({"module": {"w": torch.ones(2)}, "ds_version": "0.19"}, good)
    bad.write_bytes(pickle.dumps({"module": _Payload()}))
    assert torch.equal(TorchCheckpointEngine().load(str(good))["module"]["w"], torch.ones(2))
    with pytest.raises(pickle.UnpicklingError):
        TorchCheckpointEngine().load(str(bad))
    assert "unpickled code ran" not in capsys.readouterr().out


class _EarlyPython311Enum:
    """A ZeRO stage as Python 3.11.2 (Debian 12's) pickles it: ``getattr(ZeroStageEnum, name)``."""

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __reduce__(self):
        return (getattr, (self.owner, self.name))


def test_a_zero_stage_pickled_by_early_python_311_loads_and_no_other_getattr_does(tmp_path):
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    safe_deepspeed_loading()
    saved = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"zero_stage": _EarlyPython311Enum(ZeroStageEnum, "gradients"), "w": torch.ones(2)}, saved)
    assert b"getattr" in saved.read_bytes()  # written the way that Python writes it
    assert TorchCheckpointEngine().load(str(saved))["zero_stage"] is ZeroStageEnum.gradients
    for owner, name in ((LossScaler, "__init__"), (ZeroStageEnum, "__class__")):  # an allowed class, not a stage
        torch.save({"x": _EarlyPython311Enum(owner, name)}, saved)
        with pytest.raises(pickle.UnpicklingError, match="is not a ZeRO stage"):
            TorchCheckpointEngine().load(str(saved))


def _stopped_after_checkpoint_2(launch, out):
    """The run trained, then left as if killed right after checkpoint-2: its data state file and record."""
    launch()
    (out / "train_summary.json").unlink()
    shutil.rmtree(out / "checkpoint-3")
    state = out / "checkpoint-2" / "data_state.json"
    return state, json.loads(state.read_text())


def test_a_checkpoint_file_that_would_run_code_is_refused_in_one_line_naming_it(run, capsys):
    """A pickled payload in the RNG state the Trainer loads itself on resume: never run, and the
    command's one line names the file (torch's own refusal names only the object)."""
    from llava_norm.cli import main

    launch, out, path = run
    _stopped_after_checkpoint_2(launch, out)
    rng = out / "checkpoint-2" / "rng_state.pth"
    assert rng.is_file()
    torch.save({"python": _Payload()}, rng)  # as torch writes its files, so the refusal names the payload
    saved_as_is(out / "checkpoint-2")  # a crafted checkpoint's marker would list it as saved
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(["train", str(path)])
    assert str(stop.value.code).startswith(
        f"relaunch refused: {rng}: refused by the weights-only load (Unsupported global: GLOBAL print was "
        "not an allowed global by default"), stop.value.code
    assert "\n" not in str(stop.value.code) and "unpickled code ran" not in capsys.readouterr().out


def test_llava_norm_check_says_a_launch_resumes_on_another_number_of_processes(run):
    """The preflight reads the checkpoint a launch would resume: on another number of processes it
    says so; where the global batch would change it is a problem naming the value to set, and where
    the checkpoint recorded none it is a problem too (the trainer's own rule, rundir.global_batch_problem)."""
    from llava_norm.train.preflight import preflight

    launch, out, path = run
    state, saved = _stopped_after_checkpoint_2(launch, out)
    state.write_text(json.dumps({**saved, "world_size": 2}))  # the same global batch (2) on 2 processes
    saved_as_is(state.parent)  # each edit stands in for another save's file
    report = preflight(path, [], gpus=1, plan=False)
    assert report.ok and f"resumes {out / 'checkpoint-2'} (saved on 2 processes) on 1 process" in report.summary
    state.write_text(json.dumps({**saved, "world_size": 2, "global_batch": 4}))
    saved_as_is(state.parent)
    report = preflight(path, [], gpus=1, plan=False)
    assert [p for p in report.problems if "checkpoint-2: saved with a global batch of 4 on 2 processes; on 1 "
            "process it would be 2. Set train.global_batch_size to 4" in p]
    # a checkpoint that recorded no global batch: the trainer refuses it, so the check says so too
    state.write_text(json.dumps({**{k: v for k, v in saved.items() if k != "global_batch"}, "world_size": 2}))
    saved_as_is(state.parent)
    report = preflight(path, [], gpus=1, plan=False)
    assert [p for p in report.problems if "checkpoint-2: saved on 2 processes without a record of its global batch" in p]
    assert preflight(path, [], gpus=2, plan=False).ok  # 2 processes: the checkpoint's own shape
    state.unlink()  # no data position at all: the trainer refuses it on any number of processes
    saved_as_is(state.parent)
    report = preflight(path, [], gpus=2, plan=False)
    assert [p for p in report.problems if "checkpoint-2: no data_state.json; its position in the data is unknown" in p]


def test_a_wider_micro_batch_on_the_same_count_resumes_where_the_run_stood(run):
    """Under train.allow_config_change with the global batch fixed, one process: the data
    position, kept in micro-batches, scales with the rows a micro-batch holds (2 x 2 -> 4 x 1), so
    a run left after checkpoint-3 (inside its second epoch) trains step 4 on the samples the
    uninterrupted run did. Another global batch is refused by the check and by the launch, naming
    the value to set."""
    from safetensors.torch import load_file

    from llava_norm.train.preflight import preflight

    launch, out, path = run
    fixed = ["train.global_batch_size=4", "train.max_steps=4"]  # 8 rows: 2 steps an epoch
    launch(*fixed)
    reference, weights = _summary(out), load_file(str(out / "model/model.safetensors"))
    (out / "train_summary.json").unlink()  # as if killed right after checkpoint-3
    shutil.rmtree(out / "checkpoint-4")
    assert json.loads((out / "checkpoint-3/data_state.json").read_text())["batches_consumed"] == 2
    wider = [*fixed, "train.per_device_batch_size=4", "train.allow_config_change=true"]
    report = preflight(path, wider, gpus=1, plan=False)
    assert report.ok and f"resumes {out / 'checkpoint-3'}" in report.summary, (report.problems, report.summary)
    other = [*wider, "train.global_batch_size=8"]
    said = "checkpoint-3: saved with a global batch of 4 on 1 process; this launch's is 8. Set " \
           "train.global_batch_size to 4"
    assert [p for p in preflight(path, other, gpus=1, plan=False).problems if said in p]
    with pytest.raises(ResumeError, match=re.escape(said)):
        launch(*other)
    launch(*wider)
    resumed = _summary(out)
    assert (resumed["resumed_from"], resumed["steps_this_launch"]) == (str(out / "checkpoint-3"), 1)
    step = {e["step"]: e for e in resumed["log_history"] if "loss" in e}[4]
    expected = {e["step"]: e for e in reference["log_history"] if "loss" in e}[4]
    assert step["tokens"] == expected["tokens"] and step["loss"] == pytest.approx(expected["loss"], rel=1e-4)
    final = load_file(str(out / "model/model.safetensors"))
    for name in weights:
        torch.testing.assert_close(final[name], weights[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_launch_finishes_the_deletions_a_kill_left(run):
    """A checkpoint rotated out, or a restart's trash, renamed aside and then killed mid-deletion
    (llava_norm.files.remove_tree): the next launch in the folder deletes it."""
    launch, out, path = run
    left = out / ".removing-checkpoint-1.node0.123" / "global_step1"
    left.mkdir(parents=True)
    (left / "optim_states.pt").write_bytes(b"x" * 100)
    launch()
    assert _summary(out)["complete"] and not list(out.glob(".removing-*"))


def test_llava_norm_check_says_a_relaunch_would_be_refused(run):
    """A finished run, or a checkpoint, with another config: the launch refuses it
    (llava_norm.train.relaunch), so the check says so before a job is queued. With the same
    config, the check says what the launch would do: nothing (finished), or resume (checkpoint)."""
    from llava_norm.train.preflight import preflight

    launch, out, path = run
    launch()
    report = preflight(path, [], gpus=1, plan=False)  # the same config: a relaunch would do nothing, and says so
    assert report.ok and f"relaunch: {out}: complete at step 3; nothing to do" in "\n".join(report.summary), \
        report.summary
    report = preflight(path, ["train.restart=true"], gpus=1, plan=False)  # maybe another experiment's folder
    assert report.ok and [w for w in report.warnings if "pretrained_projector" not in w] == [
        f"{path}: train.restart=true deletes what {out} holds, a finished run, before training"], report.warnings
    report = preflight(path, ["train.max_steps=4"], gpus=1, plan=False)
    assert len(report.problems) == 1 and report.problems[0].startswith(
        f"{path}: relaunch refused: {out}: a finished run (step 3) with a different config: train.max_steps: 3 -> 4"), \
        report.problems
    # a sweep's grid check: its chains write elsewhere, so the YAML's own output dir says nothing
    assert preflight(path, ["train.max_steps=4"], gpus=1, plan=False, output_dir=False).ok
    _stopped_after_checkpoint_2(launch, out)
    report = preflight(path, [], gpus=1, plan=False)
    assert report.ok and f"resumes {out / 'checkpoint-2'}" in report.summary, report.summary
    assert "holds, a run's checkpoints up to checkpoint-2, before" in \
        "\n".join(preflight(path, ["train.restart=true"], gpus=1, plan=False).warnings)
    report = preflight(path, ["optim.lr=0.5"], gpus=1, plan=False)
    assert len(report.problems) == 1 and "relaunch refused: " in report.problems[0] and \
        "but its config differs: optim.lr" in report.problems[0], report.problems


def test_deepspeeds_conversion_and_universal_load_read_without_unpickling_code(tmp_path, capsys):
    """DeepSpeed's universal conversion and loading call torch.load with weights_only=False; under
    weights_only_loads (how llava_norm.train.universal runs them) a pickled payload is refused."""
    from llava_norm.train.universal import weights_only_loads

    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save({"param": torch.ones(2)}, good)
    bad.write_bytes(pickle.dumps({"param": _Payload()}))
    with weights_only_loads():
        assert torch.equal(torch.load(str(good), weights_only=False)["param"], torch.ones(2))
        with pytest.raises(pickle.UnpicklingError):
            torch.load(str(bad), weights_only=False)
    assert "unpickled code ran" not in capsys.readouterr().out
    assert torch.load.__module__ == "torch.serialization"  # put back after


def test_the_record_follows_every_launch_of_a_run(run):
    """Written at start, completed at the end; a resume that differs from the launch it continues
    says so in the record; a finished run whose record was left incomplete is completed."""
    launch, out, path = run
    launch("train.max_steps=2")
    record = json.loads((out / "provenance.json").read_text())
    assert record["complete"] and record["outputs"]["model"] and "resumed_with_changes" not in record["config"]

    # Stopped between the summary and the record: the relaunch completes the record it started.
    (out / "provenance.json").write_text(json.dumps({**record, "complete": False, "outputs": {}}))
    assert launch("train.max_steps=2") is None
    assert json.loads((out / "provenance.json").read_text())["outputs"] == record["outputs"]

    # An image changes (the sample order does not, so the run can continue), then the run is
    # extended: the record names the changed input.
    images = Path(record["inputs"]["data.mixture.0.image_folder"]["path"])
    Image.new("RGB", (40, 40), (1, 2, 3)).save(sorted(images.iterdir())[0])
    launch("train.max_steps=3", "train.extend=true")
    changed = json.loads((out / "provenance.json").read_text())["config"]["resumed_with_changes"]
    assert any(c.startswith("input data.mixture.0.image_folder changed") for c in changed), changed
    assert any(c.startswith("train.max_steps") for c in changed), changed


STARTUP = 1.0  # seconds each launch's start-up is made longer by, inside train() before the first step


def test_no_logged_throughput_counts_start_up_and_train_loss_spans_every_launch(run, monkeypatch):
    """A logged window's seconds (its tokens over its tokens_per_second) start at the launch's
    first step, so none reaches the added start-up, the relaunch's first included; train_loss is
    the mean over the three steps, not over the relaunch's one."""
    launch, out, _ = run
    build = LlavaNormTrainer.get_train_dataloader

    def slow_start(self):
        time.sleep(STARTUP)
        return build(self)

    monkeypatch.setattr(LlavaNormTrainer, "get_train_dataloader", slow_start)
    launch()
    (out / "train_summary.json").unlink()  # as if killed right after checkpoint-2
    shutil.rmtree(out / "checkpoint-3")
    launch()
    summary = _summary(out)
    assert (summary["resumed_from"], summary["steps_this_launch"]) == (str(out / "checkpoint-2"), 1)
    steps = [e for e in summary["log_history"] if "loss" in e]
    assert [e["step"] for e in steps] == [1, 2, 3]
    assert all(e["tokens"] / e["tokens_per_second"] < STARTUP for e in steps), steps
    assert summary["train_loss"] == sum(e["loss"] for e in steps) / 3


def test_a_checkpoint_without_log_state_warns_and_gives_train_loss_over_the_steps_after_it(run, caplog):
    launch, out, _ = run
    launch()
    (out / "train_summary.json").unlink()  # as if killed right after checkpoint-2, written before runlog existed
    shutil.rmtree(out / "checkpoint-3")
    (out / "checkpoint-2" / "log_state_rank0.json").unlink()
    (out / "checkpoint-2" / "checkpoint_complete").write_text("2")  # the marker such a version wrote
    with caplog.at_level("WARNING", logger="llava_norm.train.runlog"):
        launch()
    assert f"{out / 'checkpoint-2'} has no log_state_rank0.json: the logs' sums start again at step 2, and " \
           "train_loss covers the steps after it only" in caplog.text, caplog.text
    summary = _summary(out)
    assert summary["steps_this_launch"] == 1
    assert summary["train_loss"] == next(e["loss"] for e in summary["log_history"] if e.get("step") == 3)


def test_a_resume_that_would_change_the_global_batch_is_refused_before_anything_is_written(run):
    """A resume on another number of processes keeps the global batch (accumulation re-derived,
    tests/test_world_size.py); with train.grad_accum fixed the global batch would change, and the
    launch is refused naming both batches and the key that fixes it, before any file changes (here
    checkpoint-2 says 2 processes, as a two-GPU run's would, and the launch is a single process)."""
    launch, out, _ = run
    state, saved = _stopped_after_checkpoint_2(launch, out)
    assert saved["world_size"] == 1
    state.write_text(json.dumps({**saved, "world_size": 2, "global_batch": 2 * saved["global_batch"]}))
    saved_as_is(state.parent)  # as a two-process save would have left it
    before = snapshot(out)
    from llava_norm.train.trainer import ResumeError

    with pytest.raises(ResumeError, match=rf"global batch of {2 * saved['global_batch']} on 2 processes; on 1 process "
                                          rf"it would be {saved['global_batch']}. Set train.global_batch_size to "
                                          rf"{2 * saved['global_batch']}"):
        launch()
    assert snapshot(out) == before
    # one that recorded no global batch cannot show its steps would hold the same samples
    state.write_text(json.dumps({**{k: v for k, v in saved.items() if k != "global_batch"}, "world_size": 2}))
    saved_as_is(state.parent)
    before = snapshot(out)
    with pytest.raises(ResumeError, match="saved on 2 processes without a record of its global batch"):
        launch()
    assert snapshot(out) == before


def test_a_second_launch_into_a_folder_a_launch_holds_is_refused_and_the_check_says_so(run):
    """A job submitted twice (README, Relaunching): while one launch holds the output folder, a
    second is refused in one line before it reads the folder, and `llava-norm check` says so (not
    a launch's own check, whose process 0 holds the lock); once the first is gone (here killed),
    the folder is free, and nothing in it changed."""
    import subprocess
    import sys

    from llava_norm.train.launch_lock import FolderInUse, sole_launch
    from llava_norm.train.preflight import preflight

    launch, out, path = run
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom llava_norm.train.launch_lock import "
                               f"sole_launch\nwith sole_launch({str(out)!r}):\n    print('held', flush=True)\n"
                               "    time.sleep(120)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(out)
        with pytest.raises(FolderInUse, match=f"{out}: another launch is training into this folder"):
            launch()
        assert snapshot(out) == before  # refused before it read or wrote anything
        said = preflight(path, [], gpus=1, plan=False).problems
        assert said == [f"{path}: relaunch refused: {out}: another launch is training into this folder (it holds "
                        ".launch.lock); wait for it to end, or give this launch another train.output_dir"], said
        # a launch's own check, on its other nodes, cannot tell its process 0's lock from another's
        assert preflight(path, [], gpus=1, plan=False, launch=True).ok
        with sole_launch(tmp := out.parent / "other"), pytest.raises(FolderInUse):  # held in this process too
            with sole_launch(tmp):
                pass
    finally:
        holder.kill()  # as a kill -9 of the first launch: the kernel drops its lock
        holder.wait()
    assert preflight(path, [], gpus=1, plan=False).ok
    with sole_launch(out):
        pass


def test_an_output_folder_that_cannot_be_made_is_one_line_before_the_launch_reads_anything(tmp_path):
    """Under a file, the folder is refused by name (`llava-norm check` says the same); where the
    file system refuses what the check cannot foresee (/proc, a read-only mount, to root), the
    error of mkdir is said on the same key: the launch's one config-error line, not a traceback
    (the second case, and its break, need root: CI's user)."""
    from llava_norm.config_schema import ConfigError
    from llava_norm.train.launch_lock import sole_launch

    (tmp_path / "data.json").write_text("[]")
    # to root, /proc is writable and only mkdir refuses; to another user the check already does
    refused = "No such file or directory" if os.geteuid() == 0 else "/proc is not writable"
    for folder, said in ((tmp_path / "data.json" / "run", f"cannot be made: {tmp_path / 'data.json'} is a file"),
                         (Path("/proc/no-such-process/run"), f"cannot be made: {refused}")):
        with pytest.raises(ConfigError, match=re.escape(f"key 'train.output_dir': {folder} {said}")):
            with sole_launch(folder):
                raise AssertionError("the launch went on")
