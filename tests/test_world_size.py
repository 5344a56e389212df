"""A run killed on one number of processes and relaunched, by the same command, on another: it
continues from its last checkpoint with the same global batch and the same samples in each
optimizer step, DeepSpeed's partitioned state converted to its universal format in a new folder.
Losses are compared within 1e-4 relative, not bit for bit: with another world size the
reductions run in another order."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from launch import REPO, env, kill_at_checkpoint, run_launches, torchrun_command
from tinydata import write_dataset

from llava_norm.train.rundir import COMPLETE_MARKER

ZERO = {2: "configs/deepspeed/zero2.json", 3: "configs/deepspeed/zero3.json"}
# no LoRA dropout: its masks come from each rank's generator, which another world size cannot replay
LORA = ["lora.enabled=true", "lora.rank=4", "lora.alpha=8", "lora.vision_tower=frozen", "lora.dropout=0"]
# (stage, ZeRO stage, processes before the kill, after it, extra overrides). 24 rows at a global
# batch of 8: 3 steps an epoch; the kill after step 2 leaves step 3 in epoch 0 and step 4 in epoch 1.
# The first case logs every 3 steps: the kill cuts a log window, which the relaunch's one process
# must close with the mean and tokens of both saved processes' halves. It trains the scale_learned
# arm with model.scale_value auto: c is calibrated at the start of the launched stage 1, and the
# relaunch on one process continues from the checkpoint's value.
SCALE = ["model.norm_alignment=scale_learned", "model.scale_value=auto"]
# The LoRA case's relaunch also doubles the micro-batch (allowed as a config change): its position
# in micro-batches must scale by the rows a micro-batch of all processes holds (2 x 2 -> 1 x 4).
WIDER = ["train.per_device_batch_size=4", "train.allow_config_change=true"]
CASES = {  # (..., extra overrides, the relaunch's own)
    "stage1-zero2-scale_learned-2to1": (1, 2, 2, 1, ["train.logging_steps=3", *SCALE], []),
    "stage2-zero3-1to2": (2, 3, 1, 2, [], []),
    "lora-stage2-zero2-2to1": (2, 2, 2, 1, LORA, WIDER),
}


def _config(root, tiny_dir, stage, bad_image=False):
    data, images = write_dataset(root / "data", n=24, text_only_every=3)
    if bad_image:  # found when drawn: each process's skip records must all reach the summary
        (images / "0001.png").write_bytes(b"not a png")
    path = root / "run.yaml"
    path.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: ln_textnorm_gwc}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], prompt_format: {"plain" if stage == 1 else "chat"},
       num_workers: 0, max_length: 256}}
optim: {{lr: 2.0e-3, lr_projector: 3.0e-3, lr_norm: 4.0e-3, warmup_ratio: 0.25, scheduler: cosine}}
train: {{stage: {stage}, per_device_batch_size: 2, global_batch_size: 8, save_steps: 1, save_total_limit: 20,
        report_to: [], logging_steps: 1, max_steps: 4}}
""")
    return path


def _steps(summary):
    return {e["step"]: e for e in summary["log_history"] if "loss" in e}


def _digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_killed_on_one_number_of_processes_continues_on_another(tmp_path, tiny_dir, case):
    stage, zero, before, after, extra, relaunch = CASES[case]
    config = _config(tmp_path, tiny_dir, stage, bad_image=extra == LORA)
    common = [f"train.deepspeed={ZERO[zero]}", *extra]
    ref_out, out = tmp_path / "uninterrupted", tmp_path / "killed"
    printed = run_launches([(torchrun_command(config, [f"train.output_dir={ref_out}", *common], before), env())],
                           ref_out, return_output=True)
    reference = _summary(ref_out)
    position = kill_at_checkpoint([(torchrun_command(config, [f"train.output_dir={out}", *common], before), env())],
                                  out, 2)
    assert (position["world_size"], position["global_batch"], position["epoch"], position["batches_consumed"]) == \
        (before, 8, 0, 2 * (8 // (2 * before)))  # two steps of its accumulation, in the first epoch
    saved = out / "checkpoint-2"
    original = _digest(saved)
    # a conversion killed earlier: a half-written folder, and one without its completion marker
    (out / "checkpoint-2.universal.tmp").mkdir()
    (out / "checkpoint-2.universal.tmp" / "half").write_text("x")
    (out / "checkpoint-2.universal").mkdir()

    text = run_launches([(torchrun_command(config, [f"train.output_dir={out}", *common, *relaunch], after), env())],
                        out, return_output=True)
    processes = {1: "1 process", 2: "2 processes"}
    per_device = 4 if relaunch == WIDER else 2
    assert f"resuming at step 2 on {processes[after]}, saved on {processes[before]} (global batch 8: " \
           f"{8 // (per_device * after)} accumulation steps)" in text
    resumed = _summary(out)
    assert (resumed["resumed_from"], resumed["steps_this_launch"]) == (str(saved), 2)
    got, expected = _steps(resumed), _steps(reference)
    logged = [3] if "train.logging_steps=3" in extra else [1, 2, 3, 4]
    assert sorted(got) == sorted(expected) == logged
    for step in [s for s in logged if s > 2]:  # logged after the resume, on the other number of processes
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], rel=1e-4), step
        lrs = {k: v for k, v in expected[step].items() if k.startswith("lr/")}
        assert len(lrs) > 1 and {k: v for k, v in got[step].items() if k.startswith("lr/")} == pytest.approx(lrs, rel=1e-6)
        assert got[step]["tokens"] == expected[step]["tokens"]  # the same samples in the step
    assert resumed["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-4)
    assert _digest(saved) == original  # the checkpoint it resumed from is unchanged
    skipped = [(out / run / "skipped.jsonl").read_text().splitlines() for run in (out, ref_out)]
    assert sorted(skipped[0]) == sorted(skipped[1]) and (extra != LORA or skipped[0])
    assert not list(out.glob("*.universal*"))  # the converted copy is gone once the run saved its own
    assert (out / "checkpoint-4" / COMPLETE_MARKER).is_file()
    # under LoRA the adapters, and the projector and norm (trained in full) in the model's own file
    for weights in (["model/adapter_model.safetensors"] if extra == LORA else []) + ["model/model.safetensors"]:
        final, uninterrupted = load_file(str(out / weights)), load_file(str(ref_out / weights))
        assert final.keys() == uninterrupted.keys() and final
        for name in final:  # each parameter group trained at its own rate after the resume
            torch.testing.assert_close(final[name], uninterrupted[name], rtol=1e-4, atol=1e-6, msg=name)
    if SCALE[0] in extra:
        # Each launch calibrates from the freshly built model and the same first images, so the
        # relaunch finds the first launch's c (a trained scale then takes the checkpoint's value; a
        # fixed one is a buffer, which the universal load does not bring back). Four steps move the
        # trained scale by far less than c - 1.
        found = [float(v) for launch in (printed, text)
                 for v in re.findall(r"model\.scale_value auto: c = .* = ([-+.\de]+) \(stored", launch)]
        assert len(found) == 2 and found[0] == found[1], found
        c = found[0]
        scale = float(final["model.multi_modal_projector.norm.scale"])
        assert abs(c - 1.0) > 0.1 and abs(scale - c) < 0.05 and abs(scale - c) > 1e-4 * abs(c), (c, scale)


class _Payload:
    def __reduce__(self):
        return (print, ("unpickled code ran",))


def test_the_conversion_and_the_universal_load_unpickle_no_code(tmp_path, tiny_dir):
    """DeepSpeed reads its files with weights_only=False; a payload in the checkpoint being converted,
    or in the converted copy a relaunch loads, is refused and never runs."""
    import pickle
    import shutil

    from llava_norm.train.universal import universal_checkpoint

    config = _config(tmp_path, tiny_dir, 1)
    out = tmp_path / "killed"
    common = [f"train.deepspeed={ZERO[2]}", f"train.output_dir={out}"]
    kill_at_checkpoint([(torchrun_command(config, common, 2), env())], out, 2)
    payload = pickle.dumps({"state": _Payload()})
    handed = tmp_path / "handed" / "checkpoint-2"  # a checkpoint with a payload where DeepSpeed's state goes
    shutil.copytree(out / "checkpoint-2", handed)
    for state in handed.glob("global_step2/*optim_states.pt"):
        state.write_bytes(payload)
    with pytest.raises(pickle.UnpicklingError):
        universal_checkpoint(handed, tmp_path / "handed")
    copy = universal_checkpoint(out / "checkpoint-2", out)  # a good conversion, then tampered with
    tampered = list(copy.glob("global_step2_universal/zero/*/fp32.pt"))
    assert tampered
    for state in tampered:
        state.write_bytes(payload)
    done = subprocess.run(torchrun_command(config, common, 1), cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=300)
    text = done.stdout + done.stderr
    assert done.returncode != 0, text[-3000:]
    # one line naming the file refused (torch's own message names only what it refused)
    assert any(f"relaunch refused: {state}: refused by the weights-only load" in text for state in tampered), text[-3000:]
    assert "unpickled code ran" not in text
    # before any weights load, every launch prints its plan for its own processes (README, Planning)
    assert re.search(r"^plan for \S+: stage 1, arm \w+, 1 node x 1 GPU$", done.stdout, re.MULTILINE), done.stdout[-3000:]


def _summary(out):
    return json.loads((out / "train_summary.json").read_text())


def test_a_universal_copy_counts_only_while_its_source_files_are_the_ones_it_was_made_from(tmp_path):
    """The copy's marker records its checkpoint's files (size, modification time): a checkpoint
    written again at the same step (other files) no longer has a complete copy, so the relaunch
    converts it again instead of loading the old one."""
    from llava_norm.train.universal import _identity, universal_checkpoint

    checkpoint = tmp_path / "checkpoint-2"
    (checkpoint / "global_step2").mkdir(parents=True)
    (checkpoint / "global_step2" / "optim_states.pt").write_bytes(b"a" * 64)
    (checkpoint / "latest").write_text("global_step2")
    copy = tmp_path / "checkpoint-2.universal"
    copy.mkdir()
    (copy / COMPLETE_MARKER).write_text(json.dumps(_identity(checkpoint)))
    assert universal_checkpoint(checkpoint, tmp_path, convert=False) == copy
    # the step saved again: the same number of bytes (DeepSpeed's files for one step are), a later time
    optim = checkpoint / "global_step2" / "optim_states.pt"
    saved_at = optim.stat().st_mtime_ns
    optim.write_bytes(b"b" * 64)
    os.utime(optim, ns=(saved_at + 1, saved_at + 1))
    with pytest.raises(RuntimeError, match="no complete universal copy"):
        universal_checkpoint(checkpoint, tmp_path, convert=False)
    optim.write_bytes(b"b" * 65)  # and another size at the same time
    os.utime(optim, ns=(saved_at, saved_at))
    with pytest.raises(RuntimeError, match="no complete universal copy"):
        universal_checkpoint(checkpoint, tmp_path, convert=False)


FORKED_CONVERSION = """
import sys
from pathlib import Path
import torch
from deepspeed.checkpoint import ds_to_universal
from llava_norm.train.universal import universal_checkpoint

def extract(n):  # what a conversion worker does to each fragment: a narrow copy of a flat buffer
    return float(torch.ones(n).narrow(0, 0, n // 2).clone().sum())

def conversion(args):  # DeepSpeed's own pool of forked workers, as its extraction runs it
    print(ds_to_universal._do_parallel_work(extract, [2_000_000, 2_000_000], 2), flush=True)

torch.set_num_threads(2)
float((torch.ones(4_000_000) * 2).sum())  # this process's OpenMP threads have run, as a launch's have
ds_to_universal.main = conversion
checkpoint = Path(sys.argv[1])
universal_checkpoint(checkpoint, checkpoint.parent)
print("threads after", torch.get_num_threads())
"""


def test_the_conversions_forked_workers_do_not_wait_forever_on_this_process_threads(tmp_path):
    """A launch without torchrun has as many intra-op threads as cores; DeepSpeed's conversion
    forks its workers from it, and a forked worker's first parallel op waited forever (GNU OpenMP
    is not fork-safe): a one-process resume of a run saved on two hung. Here DeepSpeed's own
    worker pool runs a fragment-sized copy from universal_checkpoint, in a process whose OpenMP
    threads ran; it ends, and the process has its threads back afterwards."""
    checkpoint = tmp_path / "checkpoint-2"
    (checkpoint / "global_step2").mkdir(parents=True)
    (checkpoint / "latest").write_text("global_step2")
    proc = subprocess.Popen([sys.executable, "-c", FORKED_CONVERSION, str(checkpoint)], cwd=REPO,
                            env={**env(), "OMP_NUM_THREADS": "2"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the workers too, waiting where they hung
        proc.communicate()
        raise AssertionError("the conversion's forked workers still waited after 60 s") from None
    assert proc.returncode == 0, err[-3000:]
    assert "[1000000.0, 1000000.0]" in out and "threads after 2" in out, out
