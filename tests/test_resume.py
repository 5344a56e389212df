"""Runs that survive a SIGKILL anywhere, launched with DeepSpeed by torchrun (one agent, or two
standing in for two nodes): exact resume, kills that leave no worker behind, kills during a
save, and relaunches of a finished run that change nothing. The DDP and one-process cases are
in test_resume_ddp_one_process.py (the cases themselves: resumecases.py).

Each case kills a real launch (torchrun, the shell scripts, or two torchrun agents standing in
for two nodes) once a checkpoint is complete, proves the kill (no surviving process, no file
written afterwards, no summary), removes any checkpoint the run completed before the signal
landed, so the relaunch resumes from the one the case names, checks from that checkpoint's own
data position the epoch and micro-batch it holds, relaunches the same command, and compares
per-step losses, learning rates and the final weights bit for bit with an uninterrupted run.
"""

import json
import math
from pathlib import Path

import pytest

from launch import (kill_during_final_save, kill_during_save, kill_during_summary_write, run_launches,
                    scheduled_rates, summary_figures)
from resumecases import (CASES, DDP_OR_ONE_PROCESS, MAX_STEPS, STEPS_PER_EPOCH, ZERO, config_file,
                         killed_run_resumes_exactly, launches_of, per_step, reference_store)

from llava_norm.config import load_config
from llava_norm.train.rundir import complete_checkpoints

HERE = [case for case in CASES if case not in DDP_OR_ONE_PROCESS]

# the uninterrupted runs, built once per module
references_fixture = pytest.fixture(scope="module", name="references")(reference_store)


@pytest.mark.parametrize("case", HERE)
def test_killed_run_resumes_exactly(tmp_path, tiny_dir, references, case):
    killed_run_resumes_exactly(tmp_path, tiny_dir, references, case)


# A kill while a checkpoint is being written: early (its first file half-written), in the middle
# (a rank's optimizer partition half-written, after the weights), while the second rank writes
# its own log state (the main process must wait for it at a barrier, not write the marker) and
# late (every file written but the completion marker). Each relaunch of the same command must
# resume from the checkpoint before it; the kill at checkpoint-3 makes the run resume from
# checkpoint-2, the folder the first relaunch wrote over a half-written one. The next relaunch is killed while it writes the
# final model, after checkpoint-8, and the one after it while it writes its summary: the last one
# must finish the run from checkpoint-8 without training a step (the last step falls inside
# epoch 2, where the stock loop trained a ninth). Each half-written folder is given a rank file a
# save on more processes would have left: the save that writes there again clears it first.
SAVE_KILLS = [(2, "early"), (3, "middle"), (4, "rank"), (5, "late")]


def test_a_kill_during_a_save_resumes_from_the_checkpoint_before(tmp_path, tiny_dir, references):
    config = config_file(tmp_path, tiny_dir, 2, STEPS_PER_EPOCH * 2 * 2 * 2)
    common = [f"train.deepspeed={ZERO[2]}"]
    ref_out, reference = references((2, 2, 2, False, False, *common), lambda o: launches_of(
        "torchrun", config, [f"train.output_dir={o}", *common], 2))
    out = tmp_path / "killed"
    launches = launches_of("torchrun", config, [f"train.output_dir={out}", *common], 2)
    resumed_from, strays = None, []
    for step, phase in SAVE_KILLS:
        stopped_in, printed = kill_during_save(launches, out, step, phase)
        if resumed_from is not None:  # this launch continued from the one before the previous half-written one
            assert f"resuming from {resumed_from}" in printed, printed[-3000:]
        folder = out / f"checkpoint-{step}"
        written = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
        name = Path(stopped_in).name
        if phase == "late":  # everything but the marker, which waits in its writer's temporary file
            assert stopped_in.endswith("checkpoint_complete") and "data_state.json" in written
            assert [f for f in written if f.startswith(".checkpoint_complete.") and f.endswith(".tmp")], written
        elif phase == "rank":  # the main process waited for it: none of what it writes after the barrier
            assert name == "log_state_rank1.json" and written[name] > 0 and "log_state_rank0.json" in written
            assert "data_state.json" not in written and not [f for f in written if "checkpoint_complete" in f]
        else:  # the file it stopped in holds half the bytes the uninterrupted run wrote there
            whole = ref_out / Path(stopped_in).relative_to(out)
            assert Path(stopped_in).stat().st_size == whole.stat().st_size // 2 > 0
            assert "data_state.json" not in written
            if phase == "early":
                assert not any("optim" in f for f in written), written
            else:
                assert "optim" in name and any(f.endswith("model.safetensors") for f in written), written
        assert [p.name for p in complete_checkpoints(out)][-1] == f"checkpoint-{step - 1}"
        resumed_from = out / f"checkpoint-{step - 1}"
        # what a save on more processes leaves in such a folder: the next save there must not keep it
        strays.append(folder / f"global_step{step}" / "zero_pp_rank_2_mp_rank_00_optim_states.pt")
        strays[-1].parent.mkdir(exist_ok=True)
        strays[-1].write_bytes(b"a rank this world size does not have")
    stopped_in, printed = kill_during_final_save(launches, out)
    assert printed.count(f"resuming from {resumed_from}") == 1, printed[-3000:]  # said once, not once per rank
    assert Path(stopped_in) == out / "model/model.safetensors" and (out / f"checkpoint-{MAX_STEPS}/checkpoint_complete").is_file()
    # The next relaunch is killed with half its summary written, its last act: the kill helper
    # proves no train_summary.json is there, and the half sits in the one temporary file beside it.
    stopped_in, printed = kill_during_summary_write(launches, out)
    assert "nothing left to train" in printed, printed[-3000:]
    assert list(out.glob(".train_summary.json.*")) == [Path(stopped_in)], stopped_in
    text = run_launches(launches, out, return_output=True)
    assert "nothing left to train" in text, text[-3000:]
    resumed = json.loads((out / "train_summary.json").read_text())
    assert (resumed["resumed_from"], resumed["steps_this_launch"]) == (str(out / f"checkpoint-{MAX_STEPS}"), 0)
    assert sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))[-1] == MAX_STEPS
    for name in ("model/model.safetensors", "projector.safetensors"):
        assert (out / name).read_bytes() == (ref_out / name).read_bytes(), name
    assert not list(out.rglob(".checkpoint_complete.*.tmp"))  # the save at 5 cleared the killed save's folder first
    assert not [p for p in strays if p.exists()]  # each half-written folder was cleared before it was written again
    assert not list(out.glob(".train_summary.json.*"))  # and the last one the summary's killed writer's
    # Five kills later: every logged figure but the timings, and train_loss over all eight steps
    assert summary_figures(resumed) == summary_figures(reference)


def test_each_groups_logged_learning_rate_is_the_one_its_update_used(tmp_path, tiny_dir, references):
    """lr/<group> at step k is the scheduler's rate for update k (reading the optimizer after the
    step logs the next update's); the cosine schedule moves every step."""
    config = config_file(tmp_path, tiny_dir, 2, STEPS_PER_EPOCH * 2 * 2 * 2)
    common = [f"train.deepspeed={ZERO[2]}"]
    _, reference = references((2, 2, 2, False, False, *common), lambda o: launches_of(
        "torchrun", config, [f"train.output_dir={o}", *common], 2))
    expected = scheduled_rates(load_config(config, [f"train.output_dir={tmp_path}"]).optim,
                               math.ceil(0.25 * MAX_STEPS), MAX_STEPS)  # warmup_ratio 0.25
    assert {s: {k: v for k, v in e.items() if k != "loss"} for s, e in per_step(reference).items()} == expected
