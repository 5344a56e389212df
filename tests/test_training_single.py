"""Single-process training: logging backends, activation checkpointing, checkpoint completeness."""

import json
import os
from pathlib import Path

import torch

from tinydata import write_dataset

from llava_norm.config import load_config, to_yaml
from llava_norm.train.relaunch import plan_launch
from llava_norm.train.run import run_training
from llava_norm.train.rundir import COMPLETE_MARKER, RUN_CONFIG, complete_checkpoints


def test_logs_to_tensorboard_and_offline_wandb_with_checkpointing(tmp_path, tiny_dir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    for name in ("WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)
    data, images = write_dataset(tmp_path / "data", n=8, text_only_every=3)
    config = tmp_path / "c.yaml"
    config.write_text(f"""
model: {{vision_tower: {tiny_dir}/clip, llm: {tiny_dir}/qwen2, norm_alignment: ln_default}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], num_workers: 0, max_length: 256}}
train: {{stage: 2, output_dir: {tmp_path}/out, max_steps: 2, per_device_batch_size: 2, grad_accum: 1,
        gradient_checkpointing: true, report_to: [tensorboard, wandb], save_steps: 1}}
""")
    run_training(load_config(config))
    assert list((tmp_path / "out").rglob("events.out.tfevents*"))
    assert list((tmp_path / "wandb").glob("offline-run-*"))
    # the run's W&B id does not outlive it in this process: a later launch from here (another
    # test's torchrun inherits os.environ) would log into this run ("run ID ... is in use")
    assert "WANDB_RUN_ID" not in os.environ and "WANDB_RESUME" not in os.environ
    assert [p.name for p in complete_checkpoints(tmp_path / "out")] == ["checkpoint-1", "checkpoint-2"]


def test_draw_time_skips_are_logged_ten_per_process_over_workers_and_epochs(tmp_path, tiny_dir, caplog):
    """Six of eight images gone (a partial unpack), drawn by two loader workers over two epochs:
    the training process logs its first 10 skips only, the last saying so (a count in each
    worker's copy of the dataset would log 10 per worker and epoch), and every skipped row is in
    skipped.jsonl."""
    data, images = write_dataset(tmp_path / "data", n=8)
    for path in sorted(images.iterdir())[2:]:
        path.unlink()
    config = tmp_path / "c.yaml"
    config.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], num_workers: 2, max_length: 256}}
train: {{stage: 2, output_dir: {tmp_path}/out, max_steps: 8, per_device_batch_size: 2, grad_accum: 1,
        save_steps: 0, report_to: []}}
""")
    with caplog.at_level("WARNING"):
        run_training(load_config(config))
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping bad sample")]
    assert len(said) == 10 and said[-1].endswith("this process's further skips are recorded in skipped.jsonl only")
    summary = json.loads((tmp_path / "out/train_summary.json").read_text())
    # 8 steps of 2 rows: two epochs of the 8 rows; each bad row recorded once
    assert summary["global_step"] == 8 and summary["rows_skipped_when_drawn"] == 6, summary
    assert len((tmp_path / "out/skipped.jsonl").read_text().splitlines()) == 6


def test_incomplete_checkpoint_is_never_resumed(tmp_path, tiny_dir):
    data, images = write_dataset(tmp_path / "data", n=4)
    path = tmp_path / "c.yaml"
    path.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}]}}
train: {{output_dir: {tmp_path}/out}}
""")
    config = load_config(path)
    assert plan_launch(config).action == "fresh"
    for step in (2, 4, 6):
        (tmp_path / "out" / f"checkpoint-{step}").mkdir(parents=True)
        (tmp_path / "out" / f"checkpoint-{step}" / RUN_CONFIG).write_text(to_yaml(config))
    for step in (2, 4):
        (tmp_path / "out" / f"checkpoint-{step}" / COMPLETE_MARKER).write_text(str(step))
    # checkpoint-6 was being written when the run died: no marker.
    plan = plan_launch(config)
    assert (plan.action, plan.checkpoint) == ("resume", tmp_path / "out" / "checkpoint-4")


def _tiny_stage2(tmp_path, tiny_dir, train: str, rows: int = 4):
    """A stage-2 run of the tiny backbones writing no checkpoint; ``train``: more train keys."""
    data, images = write_dataset(tmp_path / "data", n=rows)
    config = tmp_path / "c.yaml"
    config.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], num_workers: 0}}
train: {{stage: 2, output_dir: {tmp_path}/out, per_device_batch_size: 2, save_steps: 0, report_to: [], {train}}}
""")
    return load_config(config)


def test_save_steps_zero_writes_no_checkpoint_and_the_final_model(tmp_path, tiny_dir):
    """A benchmark run that cannot hold a checkpoint (a 3B DeepSpeed checkpoint is about 58 GB):
    no checkpoint folder at any step, the final model and summary still written."""
    run_training(_tiny_stage2(tmp_path, tiny_dir, "max_steps: 2"))
    out = tmp_path / "out"
    assert not list(out.glob("checkpoint-*"))
    assert (out / "train_summary.json").is_file() and list((out / "model").glob("*.safetensors"))


def test_the_named_fused_loss_kernel_reaches_the_loss(tmp_path, tiny_dir, monkeypatch, caplog):
    """train.fused_loss_kernel travels config -> trainer -> model -> loss: named here on a CPU,
    Liger's kernel cannot run, and the loss says so (the launch check told torch is its package)."""
    import logging

    from llava_norm import config_checks
    from llava_norm.model import loss as loss_module

    monkeypatch.setattr(config_checks, "FUSED_LOSS_DISTRIBUTIONS", {"liger": "torch"})
    loss_module._say_once.cache_clear()
    config = _tiny_stage2(tmp_path, tiny_dir, "max_steps: 1, loss: fused, fused_loss_kernel: liger")
    with caplog.at_level(logging.WARNING, logger="llava_norm.model.loss"):
        run_training(config)
    assert "train.loss fused: liger runs on CUDA only, not on cpu; using the chunked torch cross-entropy" in caplog.text


def test_a_pack_budget_below_an_images_tokens_stops_the_launch_before_any_weights_load(tmp_path, tiny_dir,
                                                                                        monkeypatch):
    """`check` refuses it from the plan; the launch, whose start-up plan otherwise only informs,
    stops on it too, with the same line, not after loading the model on "32 consecutive samples do
    not fit". The model's builder fails the test if it is reached."""
    import pytest

    from llava_norm.config import ConfigError
    from llava_norm.train import run

    def loads(*args, **kwargs):
        raise AssertionError("the weights were loaded before the launch refused its pack budget")

    monkeypatch.setattr(run, "build_model", loads)
    config = _tiny_stage2(tmp_path, tiny_dir, "max_steps: 1")
    config.data.packing, config.data.pack_max_tokens = True, 4
    with pytest.raises(ConfigError, match=r"key 'data\.pack_max_tokens': 4 tokens per row do not hold 1 image\(s\) "
                                          r"of \d+ tokens"):
        run_training(config)


def test_stage_1_on_text_only_rows_stops_before_training(tmp_path, tiny_dir):
    """Stage 1 trains the projector and norm layer, which only image rows reach: on rows without
    an image every step ran with a zero gradient, and the run said "stage 1 done"."""
    import pytest

    from llava_norm.data.dataset import BadSampleError

    config = _tiny_stage2(tmp_path, tiny_dir, "max_steps: 1")
    data, images = write_dataset(tmp_path / "text", n=4, text_only_every=1)
    config.train.stage, config.data.prompt_format = 1, "plain"
    config.data.mixture[0].path, config.data.mixture[0].image_folder = str(data), str(images)
    with pytest.raises(BadSampleError, match=r"data\.mixture: none of its 4 usable rows has an image"):
        run_training(config)
    assert not (tmp_path / "out").exists()  # nothing written


def test_train_cudnn_attention_is_off_by_default_at_launch(tmp_path, tiny_dir):
    """A config that does not name train.cudnn_attention turns torch's cuDNN attention switch off at
    launch (its default, false); set here on a CPU, where sdpa never picks cuDNN anyway, and put
    back after."""
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        run_training(_tiny_stage2(tmp_path, tiny_dir, "max_steps: 1"))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_the_profiles_gpu_time_counts_each_kernel_once():
    """On a GPU the profile's header says the kernels' time against the wall: an operator's row and
    an annotation's (the optimizer step's) repeat their kernels' time and are not added again."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from llava_norm.train.profile import kernel_seconds

    def row(device, microseconds, annotation=False):
        return SimpleNamespace(device_type=device, self_device_time_total=microseconds, is_user_annotation=annotation)

    rows = [row(DeviceType.CPU, 3e5), row(DeviceType.CUDA, 3e5), row(DeviceType.CUDA, 2e5, annotation=True),
            row(DeviceType.CUDA, 1e5)]  # aten::mm with its kernel, the optimizer step's annotation, a copy
    assert kernel_seconds(rows) == 0.4


def test_profile_steps_write_a_trace_and_the_top_operators_of_those_steps(tmp_path, tiny_dir):
    import json

    run_training(_tiny_stage2(tmp_path, tiny_dir, "max_steps: 3, profile_steps: [2, 3]", rows=8))
    profile = tmp_path / "out" / "profile"
    top = (profile / "top_ops.txt").read_text()
    assert top.startswith("steps 2-3 of the main process:") and "aten::mm" in top
    events = json.loads((profile / "trace.json").read_text())["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)


def test_the_done_line_counts_an_unreadable_shard_apart_from_bad_rows():
    from llava_norm.train.run import skipped_phrase

    row = {"file": "a.json", "row": "s1", "cause": "image_corrupt"}
    shard = {"file": "train-00002.parquet", "row": "*", "cause": "shard_unreadable"}
    assert skipped_phrase([]) == "0 bad rows"
    assert skipped_phrase([row]) == "1 bad row"
    assert skipped_phrase([row, row, shard]) == "2 bad rows and 1 whole file or shard"
    assert skipped_phrase([shard, shard]) == "0 bad rows and 2 whole files or shards"


def test_ctrl_c_leaves_one_line_naming_the_checkpoint_to_resume_from(tmp_path, monkeypatch, capsys):
    """Interrupted, `llava-norm train` says where the run stands instead of a traceback per rank."""
    import argparse

    import pytest

    from llava_norm import cli
    from llava_norm.train import run

    def interrupt(config, check):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "run_training", interrupt)
    monkeypatch.delenv("RANK", raising=False)
    args = argparse.Namespace(config="configs/tiny/none/stage1.yaml", overrides=[f"train.output_dir={tmp_path}"],
                              stage=None)
    def said(overrides=()):
        args.overrides = [f"train.output_dir={tmp_path}", *overrides]
        with pytest.raises(SystemExit) as left:
            cli._train(args)
        assert left.value.code == 130  # as the shell reports an interrupt, not a failed run
        err = capsys.readouterr().err
        assert err.startswith("\ninterrupted: ")  # below whatever a progress bar left on its line
        return err.strip()

    assert said() == "interrupted: no checkpoint was complete yet; the same command starts the run again"
    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-2" / COMPLETE_MARKER).write_text("")
    last = f"interrupted: its last complete checkpoint is {tmp_path / 'checkpoint-2'}"
    assert said() == f"{last}; relaunch the same command to resume from it"
    assert said(["train.restart=true"]) == (f"{last}; the same command deletes it and starts over "
                                            "(train.restart=true): drop that to resume")
    assert said(["train.resume=none"]) == (f"{last}; relaunch with train.resume=auto to resume from it (this "
                                           "command has train.resume=none)")
    (tmp_path / "train_summary.json").write_text('{"complete": true, "global_step": 4}')  # stopped after its end
    saved = to_yaml(load_config(args.config, [f"train.output_dir={tmp_path}"], check_paths=False))
    (tmp_path / "config.yaml").write_text(saved)  # the finished run's own config, and its checkpoint's
    (tmp_path / "checkpoint-2" / RUN_CONFIG).write_text(saved)
    done = f"interrupted: the run had finished ({tmp_path / 'train_summary.json'})"
    assert said() == f"{done}; the same command exits at once"
    # what the same command then does is the relaunch's own rules' (train/relaunch.py plan_launch)
    assert said(["train.restart=true"]) == f"{done}; the same command deletes it and trains again (train.restart=true)"
    assert said(["train.resume=none"]) == (f"{done}; the same command is refused: {tmp_path}: holds a run already "
                                           "and train.resume is none; use train.restart=true to delete it and start "
                                           "over, or train.resume=auto to continue it")
    assert said([f"train.resume={tmp_path / 'checkpoint-2'}"]) == (
        f"{done}; the same command resumes from {tmp_path / 'checkpoint-2'}")
    assert said([f"train.resume={tmp_path / 'checkpoint-9'}"]).startswith(  # rotated away, say
        f"{done}; the same command is refused: {tmp_path / 'checkpoint-9'}: train.resume=")
    # extending a finished run, stopped before its new summary: the relaunch resumes the extension
    assert said(["train.extend=true", "train.max_steps=1000"]) == (
        f"{done}; the same command resumes from {tmp_path / 'checkpoint-2'}")
    (tmp_path / "train_summary.json").unlink()
    # a stage the pipeline launched (it restarts a stale one): rerunning the chain resumes it
    from llava_norm import chain_launch
    from llava_norm.layout import CHAIN_LAUNCH

    given = {}
    monkeypatch.setattr(chain_launch.subprocess, "Popen", lambda command, cwd, env, **kw: given.update(env) or
                        argparse.Namespace(wait=lambda: 0))
    chain_launch.launch(["true"], None)
    monkeypatch.setenv(CHAIN_LAUNCH, given[CHAIN_LAUNCH])
    assert said(["train.restart=true"]) == f"{last}; the pipeline (or sweep) that launched it resumes from it when run again"


def test_sigterm_leaves_the_same_line_as_ctrl_c_and_the_status_a_shell_gives_it(tmp_path, monkeypatch, capsys,
                                                                                  sigterm_to_self):
    """What scancel, a preemption and torchrun's own stop send: a real SIGTERM, handled as Ctrl-C is."""
    import argparse
    import time

    import pytest

    from llava_norm import cli
    from llava_norm.train import run

    def terminated(config, check):
        sigterm_to_self()
        time.sleep(30)  # the handler raises here

    monkeypatch.setattr(run, "run_training", terminated)
    monkeypatch.delenv("RANK", raising=False)
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / COMPLETE_MARKER).write_text("")
    args = argparse.Namespace(config="configs/tiny/none/stage1.yaml", overrides=[f"train.output_dir={tmp_path}"],
                              stage=None)
    said = (f"\nterminated by SIGTERM: its last complete checkpoint is {tmp_path / 'checkpoint-2'}; relaunch the "
            "same command to resume from it\n")
    with pytest.raises(SystemExit) as left:
        cli._train(args)
    assert left.value.code == 143  # 128 + SIGTERM
    assert capsys.readouterr().err == said
    # a rank done training and waiting at the last barrier for one still saving: the same line
    import torch.distributed as dist

    def waiting():
        sigterm_to_self()
        time.sleep(30)  # the handler raises here

    monkeypatch.setattr(run, "run_training", lambda config, check: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", waiting)
    with pytest.raises(SystemExit) as left:
        cli._train(args)
    assert left.value.code == 143 and capsys.readouterr().err == said


def test_a_wandb_run_id_you_set_wins_and_is_kept_and_a_restart_makes_a_new_one(tmp_path, monkeypatch):
    """README: the id made at the first launch is kept in output_dir; one set in WANDB_RUN_ID
    wins and is kept for the launches after it; train.restart removes the file, so a new id."""
    from llava_norm.train.relaunch import clear_outputs
    from llava_norm.train.rundir import WANDB_RUN_ID
    from llava_norm.train.runlog import keep_wandb_run

    for name in ("WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)
    made = keep_wandb_run(tmp_path)
    assert len(made) == 8 and (tmp_path / WANDB_RUN_ID).read_text().strip() == made
    monkeypatch.delenv("WANDB_RUN_ID")
    assert keep_wandb_run(tmp_path) == made  # a relaunch logs to the same run
    monkeypatch.setenv("WANDB_RUN_ID", "mine0001")
    assert keep_wandb_run(tmp_path) == "mine0001" and os.environ["WANDB_RESUME"] == "allow"
    monkeypatch.delenv("WANDB_RUN_ID")
    assert keep_wandb_run(tmp_path) == "mine0001"  # kept after the variable is gone
    root = Path(__file__).resolve().parents[1]
    clear_outputs(load_config(root / "configs/tiny/none/stage1.yaml", [f"train.output_dir={tmp_path}"],
                              check_paths=False))  # what train.restart does first
    assert not (tmp_path / WANDB_RUN_ID).exists()
    monkeypatch.delenv("WANDB_RUN_ID")
    assert keep_wandb_run(tmp_path) not in (made, "mine0001")


def test_zero2_gradient_buckets_are_the_ones_the_plan_counts(tmp_path, tiny_dir, monkeypatch):
    """The buffers DeepSpeed's ZeRO-2 stages gradients in, recorded as it makes them in a tiny bf16
    run with the shipped zero2.json, add up to the plan's term for that JSON (gradient_bucket_bytes):
    the plan held against DeepSpeed's own allocation, not its own formula."""
    import json

    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    from llava_norm.plan.estimate import gradient_bucket_bytes

    made = []
    original = DeepSpeedZeroOptimizer.setup_buckets

    def recording(self):
        original(self)
        made.append(sum(b.numel() * b.element_size() for bucket in self.ipg_buckets.values() for b in bucket.buffer))

    monkeypatch.setattr(DeepSpeedZeroOptimizer, "setup_buckets", recording)
    zero2 = Path(__file__).resolve().parents[1] / "configs" / "deepspeed" / "zero2.json"
    run_training(_tiny_stage2(tmp_path, tiny_dir, f"max_steps: 1, precision: bf16, deepspeed: {zero2}"))
    hidden = json.loads((tiny_dir / "llama" / "config.json").read_text())["hidden_size"]
    assert made and max(made) == gradient_bucket_bytes(json.loads(zero2.read_text()), hidden, "bf16")


def test_a_diverged_run_stops_at_its_first_non_finite_update(tmp_path, tiny_dir):
    """At a learning rate of 1e30 the weights leave the floats within a few steps; transformers
    logged the NaN steps' loss as the mean of the others and trained on to a final model of NaNs,
    saying it was done. The run stops at that step instead, before its log (every third step) or
    checkpoint (every step), in one line naming the step and its last complete checkpoint, with no
    final model and every checkpoint it kept finite."""
    import re

    import pytest
    from safetensors.torch import load_file

    from llava_norm.cli import main

    _tiny_stage2(tmp_path, tiny_dir, "max_steps: 6, logging_steps: 3", rows=12)
    with pytest.raises(SystemExit) as stopped:  # the command's own path: one line, exit status 1
        main(["train", str(tmp_path / "c.yaml"), "optim.lr=1e30", "train.save_steps=1"])
    said = stopped.value.code
    assert isinstance(said, str) and re.match(r"training diverged: the gradient norm at step \d is (nan|inf)", said), said
    out = tmp_path / "out"
    kept = complete_checkpoints(out)
    assert f"(the last complete checkpoint: {kept[-1] if kept else 'none'})" in said and "\n" not in said
    step = int(re.search(r"at step (\d)", said).group(1))
    assert [p.name for p in kept] == [f"checkpoint-{k}" for k in range(1, step)]  # up to the step before
    assert not (out / "model").exists() and not (out / "train_summary.json").exists()
    for checkpoint in kept:
        weights = load_file(str(checkpoint / "model.safetensors"))
        assert all(torch.isfinite(w).all() for w in weights.values()), checkpoint


def test_one_nan_batch_stops_a_plain_run_but_not_one_deepspeed_skips(tmp_path, tiny_dir, monkeypatch):
    """The loss of the second step made NaN, logged every 4 steps, no checkpoint: without
    DeepSpeed its update turns the weights to NaN and the run stops at step 2; under ZeRO-2 in
    bf16 DeepSpeed skips that step (its overflow handling, weights untouched) and the run ends
    with a finite model; the plain run once more in this process, after the DeepSpeed one, stops
    at step 2 again (accelerate's state had made it a DeepSpeed run too)."""
    import pytest
    from safetensors.torch import load_file

    from llava_norm.train import trainer as trainer_module
    from llava_norm.train.trainer import DivergedError

    computed = trainer_module.LlavaNormTrainer.compute_loss

    def one_nan_batch(self, model, inputs, *args, **kwargs):
        loss = computed(self, model, inputs, *args, **kwargs)
        if self.state.global_step != 1:
            return loss
        return (loss[0] * float("nan"), *loss[1:]) if isinstance(loss, tuple) else loss * float("nan")

    monkeypatch.setattr(trainer_module.LlavaNormTrainer, "compute_loss", one_nan_batch)
    with pytest.raises(DivergedError, match=r"^training diverged: the gradient norm at step 2 is nan"):
        run_training(_tiny_stage2(tmp_path / "plain", tiny_dir, "max_steps: 4, logging_steps: 4", rows=8))
    zero2 = Path(__file__).resolve().parents[1] / "configs" / "deepspeed" / "zero2.json"
    run_training(_tiny_stage2(tmp_path / "zero2", tiny_dir, f"max_steps: 4, logging_steps: 4, precision: bf16, "
                                                           f"deepspeed: {zero2}", rows=8))
    weights = load_file(str(tmp_path / "zero2" / "out" / "model" / "model.safetensors"))
    assert all(torch.isfinite(w.float()).all() for w in weights.values())
    # the plain run again, in the process the DeepSpeed run left its state in: still not DeepSpeed's
    with pytest.raises(DivergedError, match=r"^training diverged: the gradient norm at step 2 is nan"):
        run_training(_tiny_stage2(tmp_path / "again", tiny_dir, "max_steps: 4, logging_steps: 4", rows=8))
