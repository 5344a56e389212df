"""Both training stages under DeepSpeed ZeRO-2/3 with 2 CPU processes (exact resume: test_resume.py,
test_resume_ddp_one_process.py; the scaling arms' one number under ZeRO-3, learned and fixed, is
checked there, through a kill and resume: resumecases.SCALE_ARMS)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from launch import REPO, env, free_port, run_train, step_losses
from tinydata import write_dataset

from llava_norm.model.builder import ModelSpec, build_model
from llava_norm.train.params import learning_rates, module_of
from llava_norm.config import OptimConfig


def _config(tmp: Path, tiny_dir: Path, stage: int, text_only_every: int = 0) -> Path:
    data, images = write_dataset(tmp / "data", n=32, text_only_every=text_only_every)
    fmt = "plain" if stage == 1 else "chat"
    path = tmp / f"stage{stage}.yaml"
    path.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: ln_textnorm_gwc}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], prompt_format: {fmt}, num_workers: 0, max_length: 256}}
optim: {{lr: 2.0e-3, lr_vision_tower: 1.0e-4, lr_projector: 3.0e-3, lr_norm: 4.0e-3, warmup_ratio: 0.0,
        scheduler: constant_with_warmup}}
train: {{stage: {stage}, per_device_batch_size: 2, grad_accum: 2, save_steps: 100, report_to: [],
        norm_stats_steps: 2, logging_steps: 1}}
""")
    return path


def _initial_state(tiny_dir):
    model = build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama", norm_alignment="ln_textnorm_gwc")).model
    return {k: v.clone() for k, v in model.state_dict().items()}


def _falls(losses: dict[int, float]) -> bool:
    values = [losses[s] for s in sorted(losses)]
    return sum(values[-3:]) / 3 < sum(values[:3]) / 3


@pytest.mark.parametrize("zero", [2, 3])
def test_stage1_then_stage2_under_deepspeed(tmp_path, tiny_dir, zero):
    ds = REPO / f"configs/deepspeed/zero{zero}.json"
    out1 = tmp_path / "s1"
    s1 = run_train(_config(tmp_path, tiny_dir, 1), [f"train.output_dir={out1}", "train.max_steps=10",
                                                    f"train.deepspeed={ds}"])
    assert _falls(step_losses(s1)), step_losses(s1)
    # Stage 1 trains projector + norm only: the backbones are bit-identical to the start.
    start, after = _initial_state(tiny_dir), load_file(str(out1 / "model" / "model.safetensors"))
    assert set(start) - set(after) <= {"lm_head.weight"}  # tied to the embeddings, saved once
    start = {k: v for k, v in start.items() if k in after}
    changed = {module_of(k) for k in start if not torch.equal(start[k], after[k])}
    assert changed == {"projector", "norm"}, changed
    assert set(load_file(str(out1 / "projector.safetensors"))) == {
        k for k in start if module_of(k) in ("projector", "norm")}
    with safe_open(str(out1 / "projector.safetensors"), "pt") as f:  # where it came from, for stage 2's check
        origin = f.metadata()
    assert (origin["norm_alignment"], origin["llm"], origin["vision_tower"]) == (
        "ln_textnorm_gwc", str((tiny_dir / "llama").resolve()), str((tiny_dir / "siglip").resolve()))
    assert float(origin["text_norm"]) > 0
    logged = next(e for e in s1["log_history"] if "lr/projector" in e)
    assert {k for k in logged if k.startswith("lr/")} == {"lr/projector", "lr/norm"}
    assert "norm/gain_abs_mean" in next(e for e in s1["log_history"] if e.get("step") == 2)

    out2 = tmp_path / "s2"
    s2 = run_train(_config(tmp_path, tiny_dir, 2, text_only_every=3), [
        f"train.output_dir={out2}", "train.max_steps=10", f"train.deepspeed={ds}",
        f"model.pretrained_projector={out1 / 'projector.safetensors'}"])
    assert _falls(step_losses(s2)), step_losses(s2)
    logged = next(e for e in s2["log_history"] if "lr/llm" in e)
    expected = learning_rates(OptimConfig(lr=2e-3, lr_vision_tower=1e-4, lr_projector=3e-3, lr_norm=4e-3))
    assert {k[3:]: v for k, v in logged.items() if k.startswith("lr/")} == pytest.approx(expected)
    final = load_file(str(out2 / "model" / "model.safetensors"))
    changed = {module_of(k) for k in start if not torch.equal(after[k], final[k])}
    assert changed == {"projector", "norm", "llm", "vision_tower"}


EXIT_PROBE = """
import atexit, sys
import torch, torch.distributed as dist
from llava_norm.worker import exit_launched_worker
log = lambda word: open(sys.argv[1], "a").write(word + ";")
atexit.register(log, "atexit")
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(3))
dist.destroy_process_group()
print("buffered", end="")
exit_launched_worker()
log("returned")
"""


@pytest.mark.parametrize("launched", [True, False])
def test_launched_worker_exits_after_atexit_and_flush(tmp_path, launched):
    marker = tmp_path / "marker"
    probe_env = {**env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    probe_env.pop("PYTHONUNBUFFERED")  # stdout to a pipe stays block-buffered: the flush is what is tested
    probe_env.pop("TORCHELASTIC_RUN_ID", None)
    if launched:
        probe_env["TORCHELASTIC_RUN_ID"] = "probe"  # what torchrun's agent sets for its workers
    proc = subprocess.run([sys.executable, "-c", EXIT_PROBE, str(marker)], cwd=REPO, env=probe_env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "buffered"
    # A torchrun worker leaves right there, after its atexit handlers; in-process it returns.
    assert marker.read_text() == ("atexit;" if launched else "returned;atexit;")


def test_the_optimizer_is_fused_on_cuda_and_the_default_on_cpu():
    """The kit's 3B ZeRO-2 step ran out of memory in the foreach AdamW's temporaries on an H100
    (bench/RESULTS.md): on CUDA the trainer's optimizer is the fused one; CPU runs (and their exact
    resume figures) keep torch's default."""
    from llava_norm.train.params import make_optimizer

    model = torch.nn.Linear(4, 4)
    optim = OptimConfig(lr=1e-3)
    assert make_optimizer(model, optim, torch.device("cuda")).defaults["fused"] is True
    cpu = make_optimizer(model, optim, torch.device("cpu"))
    assert cpu.defaults["fused"] is None and cpu.defaults["foreach"] is None
    assert [g["lr"] for g in cpu.param_groups] == [optim.lr] and cpu.defaults["eps"] == optim.adam_epsilon
    # the config's betas and eps, not torch's defaults (which OptimConfig's defaults equal)
    tuned = OptimConfig(lr=1e-3, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6)
    for device in ("cpu", "cuda"):
        made = make_optimizer(model, tuned, torch.device(device)).defaults
        assert (made["betas"], made["eps"]) == ((0.8, 0.95), 1e-6), device
