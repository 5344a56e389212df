"""A run killed inside a log window and again while it writes its final model ends with what an
uninterrupted run ends with: the same model and projector bytes, summary and logged series, one
W&B run, each message once. Stage 2 under ZeRO-3 with 2 processes and a constant schedule (an
extra step after the last one would change the weights; under cosine its rate is 0)."""

import json
import math
from pathlib import Path

import torch
from transformers import get_scheduler

from launch import (env, kill_at_checkpoint, kill_during_final_save, run_launches, summary_figures, torchrun_command,
                    REPO)
from tinydata import write_dataset

from llava_norm.config import load_config
from llava_norm.train.params import learning_rates
from llava_norm.train.rundir import WANDB_RUN_ID

MAX_STEPS = 5  # 3 steps per epoch: the last one inside epoch 1, where the stock loop trained a sixth
LOGGING_STEPS = 2  # logs at steps 2 and 4; the kill at checkpoint-3 cuts the window of step 4
WARMUP = 0.4  # of 5 steps: 2 warmup steps, so the rate differs from one logged step to the next


def _config(tmp_path, tiny_dir):
    data, images = write_dataset(tmp_path / "data", n=24, text_only_every=3)
    path = tmp_path / "stage2.yaml"
    path.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: ln_textnorm_gwc}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], prompt_format: chat, num_workers: 0, max_length: 256}}
optim: {{lr: 2.0e-3, lr_projector: 3.0e-3, lr_norm: 4.0e-3, warmup_ratio: {WARMUP}, scheduler: constant_with_warmup}}
train: {{stage: 2, per_device_batch_size: 2, grad_accum: 2, save_steps: 1, save_total_limit: 20, report_to: [],
        logging_steps: {LOGGING_STEPS}, max_steps: {MAX_STEPS}, deepspeed: {REPO}/configs/deepspeed/zero3.json}}
""")
    return path


def test_a_run_killed_mid_window_and_in_its_final_save_ends_as_an_uninterrupted_one(tmp_path, tiny_dir):
    config = _config(tmp_path, tiny_dir)
    ref_out, out = tmp_path / "reference", tmp_path / "killed"
    reference = run_launches([(torchrun_command(config, [f"train.output_dir={ref_out}"]), env())], ref_out)
    wandb_env = {**env(), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    launches = [(torchrun_command(config, [f"train.output_dir={out}", "train.report_to=[wandb]"]), wandb_env)]

    position = kill_at_checkpoint(launches, out, 3)  # inside the window logged at step 4
    assert (position["epoch"], position["batches_consumed"]) == (1, 0)
    stopped_in, printed = kill_during_final_save(launches, out)  # resumes from checkpoint-3, trains 4 and 5
    assert Path(stopped_in) == out / "model/model.safetensors"
    assert (out / f"checkpoint-{MAX_STEPS}" / "checkpoint_complete").is_file()
    for message in (f"resuming from {out / 'checkpoint-3'}", "stage 2: llm"):  # once, not once per rank
        assert printed.count(message) == 1, (message, printed[-3000:])

    text = run_launches(launches, out, return_output=True)
    assert "nothing left to train" in text, text[-3000:]
    finished = json.loads((out / "train_summary.json").read_text())
    assert (finished["resumed_from"], finished["steps_this_launch"]) == (str(out / f"checkpoint-{MAX_STEPS}"), 0)
    assert not (out / f"checkpoint-{MAX_STEPS + 1}").exists()
    for name in ("model/model.safetensors", "projector.safetensors"):
        assert (out / name).read_bytes() == (ref_out / name).read_bytes(), name
    # train_loss over all five steps, and the loss of the window cut by the kill
    assert summary_figures(finished) == summary_figures(reference)
    logged = {e["step"]: e for e in reference["log_history"] if "loss" in e}
    assert sorted(logged) == [2, 4]

    # lr/<group> at step k is the rate update k used (the next update's is 0.5 -> 1.0 at step 2)
    rates = learning_rates(load_config(config, [f"train.output_dir={out}"]).optim)
    groups = [{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in rates.values()]
    schedule = get_scheduler("constant_with_warmup", torch.optim.SGD(groups),
                             num_warmup_steps=math.ceil(WARMUP * MAX_STEPS))
    for step in range(1, MAX_STEPS + 1):
        if step in logged:
            assert {f"lr/{name}": g["lr"] for name, g in zip(rates, schedule.optimizer.param_groups)} == {
                k: v for k, v in logged[step].items() if k.startswith("lr/")}, step
        schedule.optimizer.step()
        schedule.step()

    # One W&B run across the three launches: each wrote an offline run under the same id, the one kept.
    runs = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    ids = {name.rsplit("-", 1)[1] for name in runs}
    assert len(runs) == 3 and len(ids) == 1, runs
    assert ids == {(out / WANDB_RUN_ID).read_text().strip()}
