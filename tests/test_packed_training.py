"""Packed rows with the fused loss train the same model as plain, unpacked rows, through the
trainer: two processes under ZeRO-2, gradient accumulation 2, two optimizer steps.

Both runs see the same samples in every optimizer step: the 8 samples are one global batch
(plain: 2 samples x 2 micro-batches x 2 ranks; packed: the plan's 4 rows x 1 x 2 x 2), so each
step's gradient is that of the same token-mean loss, whatever the rows, micro-batches and ranks
it is split into. A loss normalised per row, per micro-batch or per rank, or a fused loss that
dropped or double-counted positions, would move the weights apart. The full case's fused loss
compiles its softmax (CUDA's path, by inductor for the CPU; a launch that fell back to the eager
blocks fails), the LoRA case's takes the eager blocks.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from launch import REPO, env, run_launches, run_train, step_losses, torchrun_command
from tinydata import write_dataset

from llava_norm.config import DataSource
from llava_norm.data.conversation import conversation_tokenizer
from llava_norm.data.dataset import SupervisedDataset
from llava_norm.data.packing import PackedDataset, plan_packs
from llava_norm.model.builder import ModelSpec, build_model

SAMPLES, ROWS, MAX_LENGTH, SEED = 8, 4, 256, 42
ZERO2 = REPO / "configs/deepspeed/zero2.json"
# Adam divides each gradient element by its own running magnitude, so with its default eps
# (1e-8) an element whose gradient is near float32 rounding noise moves by up to a whole step
# either way. An eps of 1e-4 keeps those elements' updates proportional to their gradients, so
# the weights can be held to float32 tolerance.
ADAM_EPSILON = 1.0e-4
LORA = ["lora.enabled=true", "lora.rank=4", "lora.alpha=8", "lora.dropout=0", "lora.vision_tower=frozen"]  # no dropout: the same draws


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("packed-vs-plain")
    data, images = write_dataset(root / "data", n=SAMPLES, text_only_every=4)
    config = root / "stage2.yaml"
    config.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: ln_textnorm_gwc}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], prompt_format: chat, num_workers: 0,
       max_length: {MAX_LENGTH}}}
optim: {{lr: 2.0e-3, lr_projector: 3.0e-3, lr_norm: 4.0e-3, warmup_ratio: 0.0, scheduler: constant,
        adam_epsilon: {ADAM_EPSILON}}}
train: {{stage: 2, grad_accum: 2, save_steps: 100, report_to: [], logging_steps: 1, max_steps: 2, seed: {SEED}}}
""")
    # The smallest row budget that the run's own planner (same lengths, same seed) fills in 4 rows.
    bundle = build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama", norm_alignment="ln_textnorm_gwc", seed=SEED))
    encoder = conversation_tokenizer(bundle, "chat", {"date_string": "26 Jul 2024"})
    samples = SupervisedDataset([DataSource(path=str(data), image_folder=str(images))], encoder,
                                bundle.image_processor, MAX_LENGTH)
    lengths = PackedDataset(samples, MAX_LENGTH, seed=SEED).lengths
    assert len(lengths) == SAMPLES and all(lengths)
    budget = next(b for b in range(max(lengths), sum(lengths) + 1) if len(plan_packs(lengths, b, SEED)) == ROWS)
    assert max(len(p) for p in plan_packs(lengths, budget, SEED)) > 1  # rows that really hold several samples
    initial = {k: v.clone() for k, v in bundle.model.state_dict().items()}
    return root, config, budget, initial


def _runs(setup, extra: list[str]):
    root, config, budget, _ = setup
    name = "lora" if extra else "full"
    plain_out, packed_out = root / f"{name}-plain", root / f"{name}-packed"
    plain = run_train(config, [f"train.output_dir={plain_out}", f"train.deepspeed={ZERO2}",
                               "train.per_device_batch_size=2", *extra])
    overrides = [f"train.output_dir={packed_out}", f"train.deepspeed={ZERO2}", "train.per_device_batch_size=1",
                 "data.packing=true", f"data.pack_max_tokens={budget}", "train.loss=fused",
                 *([] if extra else ["train.fused_loss_softmax=compiled"]), *extra]
    printed = run_launches([(torchrun_command(config, overrides), env())], packed_out, return_output=True)
    # the path asked for (said by the main process, the one that logs at INFO): the compiled
    # softmax in the full case, the blocks with LoRA
    assert printed.count("each chunk's softmax compiled by inductor") == (0 if extra else 1)
    packed = json.loads((packed_out / "train_summary.json").read_text())
    return (plain_out, plain), (packed_out, packed)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_packed_fused_training_equals_plain_training(setup, lora):
    (plain_out, plain), (packed_out, packed) = _runs(setup, LORA if lora else [])
    # Each optimizer step saw the whole data once, in both runs: one step per epoch.
    for out in (plain_out, packed_out):
        state = json.loads((out / "train_summary.json").read_text())
        assert state["global_step"] == 2
    epochs = {e["step"]: e["epoch"] for e in plain["log_history"] if "loss" in e}
    assert epochs == {e["step"]: e["epoch"] for e in packed["log_history"] if "loss" in e} == {1: 1.0, 2: 2.0}
    # The same token-mean loss at every step (the second after a step that must match too).
    for step, loss in step_losses(plain).items():
        assert step_losses(packed)[step] == pytest.approx(loss, rel=1e-5), step
    final = {}
    for name in ["model/model.safetensors"] + (["model/adapter_model.safetensors"] if lora else []):
        ours, theirs = load_file(str(packed_out / name)), load_file(str(plain_out / name))
        assert ours.keys() == theirs.keys()
        for key in theirs:
            torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-6, msg=lambda m: f"{key}: {m}")
        final.update(theirs)
    # ... and training moved them far beyond that tolerance: the projector always, the LLM's own
    # weights in full training, the adapters (B starts at zero) with LoRA.
    initial = setup[3]

    def moved(part: str) -> float:
        return sum(float((final[k] - initial.get(k, torch.zeros_like(final[k]))).norm()) for k in final if part in k)

    assert moved("multi_modal_projector") > 0.1
    if lora:  # the adapters moved; the LLM's own weights (model.safetensors holds them unmerged) did not
        assert moved("lora_B") > 1e-2
        base = [k for k in final if "language_model.layers" in k and "lora_" not in k]
        assert base and all(torch.equal(final[k], initial[k]) for k in base)
    else:
        assert moved("language_model.layers") > 0.1
