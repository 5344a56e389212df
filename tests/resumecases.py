"""The resume cases of test_resume.py and test_resume_ddp_one_process.py: their configs, launch
shapes and uninterrupted references, and the check every killed-run case makes. Two modules, so
that pytest-xdist runs the two halves side by side (Makefile: one module per worker)."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from launch import REPO, env, free_port, kill_at_checkpoint, run_launches, script_command, snapshot, torchrun_command
from tinydata import write_dataset, write_next_dataset

ZERO = {2: REPO / "configs/deepspeed/zero2.json", 3: REPO / "configs/deepspeed/zero3.json"}
STEPS_PER_EPOCH = 3  # every case: 3 optimizer steps of 2 micro-batches per rank per epoch
MAX_STEPS = 8


def config_file(root: Path, tiny_dir: Path, stage: int, rows: int, bad_rows: bool = False, parquet: bool = False) -> Path:
    data, images = write_dataset(root / "data", n=rows, text_only_every=3)
    if bad_rows:  # one image that fails when drawn, one row that fails at load
        (images / "0001.png").write_bytes(b"not a png")
        rows = json.loads(data.read_text())
        data.write_text(json.dumps([*rows, {"id": "broken", "conversations": [{"from": "human", "value": "hi"}]}]))
    source = f"{{path: {data}, image_folder: {images}}}"
    if parquet:  # the same rows in the NeXT hub layout, images embedded
        shards = write_next_dataset(data, images, root / "next", shards=2) / "data"
        source = f"{{path: {shards}}}"
        if bad_rows:  # and a shard whose download was cut short
            (shards / "train-00002-of-00002.parquet").write_bytes((shards / "train-00000-of-00002.parquet").read_bytes()[:99])
    path = root / f"stage{stage}.yaml"
    path.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: ln_textnorm_gwc}}
data: {{mixture: [{source}], prompt_format: {"plain" if stage == 1 else "chat"},
       num_workers: 0, max_length: 256}}
optim: {{lr: 2.0e-3, lr_projector: 3.0e-3, lr_norm: 4.0e-3, warmup_ratio: 0.25, scheduler: cosine}}
train: {{stage: {stage}, per_device_batch_size: 2, grad_accum: 2, save_steps: 1, save_total_limit: 20,
        report_to: [], logging_steps: 1, max_steps: {MAX_STEPS}}}
""")
    return path


def launches_of(shape: str, config: Path, overrides: list[str], stage: int):
    script = "pretrain.sh" if stage == 1 else "finetune.sh"
    if shape == "one-process":  # no torchrun: what GPUS_PER_NODE=1 does, DeepSpeed included
        return [(script_command(script, config, overrides), {**env(), "GPUS_PER_NODE": "1"})]
    if shape == "two-nodes":  # two torchrun agents with one worker each, rendezvous on 127.0.0.1
        port = str(free_port())
        return [(script_command(script, config, overrides),
                 {**env(), "GPUS_PER_NODE": "1", "NNODES": "2", "NODE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": port}) for rank in (0, 1)]
    return [(torchrun_command(config, overrides), env())]


def per_step(summary: dict) -> dict[int, dict]:
    return {e["step"]: {k: v for k, v in e.items() if k == "loss" or k.startswith("lr/")}
            for e in summary["log_history"] if "loss" in e}


# (launch shape, stage, ZeRO stage or None for plain DDP, kill steps); with 3 steps per epoch,
# step 2 is inside epoch 0, step 3 the boundary, steps 4, 5 and 7 inside epochs 1 and 2. A run
# killed and resumed several times: test_resume.py's kills during a save, on the ZeRO-2 case's
# reference. The LoRA case keeps lora.dropout's default (0.05): its masks' generator is resumed
# too. The arm is ln_textnorm_gwc unless the case names a scaling arm (SCALE_ARMS).
CASES = {
    "zero2-stage2-epoch1": ("torchrun", 2, 2, [5]),
    "two-nodes-zero2-stage2-boundary": ("two-nodes", 2, 2, [3]),
    "ddp-stage1-epoch1": ("torchrun", 1, None, [4]),
    "zero3-scale_learned-stage2-epoch2": ("torchrun", 2, 3, [7]),
    "one-process-zero2-stage1-epoch1-bad-rows": ("one-process", 1, 2, [5]),
    "packed-fused-zero3-scale_fixed-stage2-epoch1": ("torchrun", 2, 3, [4]),
    "packed-fused-lora-zero2-stage2-epoch2": ("torchrun", 2, 2, [7]),
    "parquet-ddp-stage2-epoch1-bad-rows": ("torchrun", 2, None, [4]),
    "parquet-one-process-zero2-stage2-epoch0-bad-rows": ("one-process", 2, 2, [2]),
}
# The two modules' shares, so that pytest-xdist runs them side by side (one module per worker):
# test_resume_ddp_one_process.py takes these, test_resume.py the rest (DeepSpeed under torchrun,
# with the kills during a save that share its ZeRO-2 reference).
DDP_OR_ONE_PROCESS = [case for case, (shape, _, zero, _) in CASES.items() if shape == "one-process" or zero is None]
# Packed cases: 36 rows in 24 rows of at most 320 tokens, so 3 steps per epoch here too
# (asserted from each checkpoint's own record of micro-batches per epoch).
PACKED = ["data.packing=true", "data.pack_max_tokens=320", "train.loss=fused"]
LORA = ["lora.enabled=true", "lora.rank=4", "lora.alpha=8", "lora.vision_tower=frozen"]
# The scaling arms' one number under ZeRO-3, through a kill and resume: learned, a partitioned
# parameter of shape (1,) (DeepSpeed's start-up broadcast views every parameter as bytes, which a
# 0-dim tensor cannot be), starting from model.scale_value, that must move; fixed, a buffer that
# stage 2 takes from stage 1's projector file (the config's own value would be 1) and must keep.
SCALE_ARMS = {"scale_learned": 1.0, "scale_fixed": 2.5}
SCALE_KEY = "model.multi_modal_projector.norm.scale"


def stage1_projector(config: Path, overrides: list[str], value: float) -> Path:
    """The projector file stage 1 of the arm ``overrides`` name writes (llava_norm.train.final),
    its scale at ``value``: built here from the same backbones, with its origin recorded."""
    from llava_norm.config import load_config
    from llava_norm.layout import PROJECTOR_PREFIX
    from llava_norm.model.builder import ModelSpec, build_model
    from llava_norm.config_checks import projector_origin
    from llava_norm.train.final import save_with_sorted_metadata

    m = load_config(config, [*overrides, f"train.output_dir={config.parent}"], check_paths=False).model
    model = build_model(ModelSpec(m.vision_tower, m.llm, norm_alignment=m.norm_alignment, scale_value=value)).model
    path = config.parent / "stage1-projector.safetensors"
    save_with_sorted_metadata({k: v for k, v in model.state_dict().items() if k.startswith(PROJECTOR_PREFIX)}, path,
                              projector_origin(m, model.config.text_norm))
    return path


def scale_arm(case: str) -> str | None:
    return next((arm for arm in SCALE_ARMS if f"-{arm}-" in case), None)


def reference_store(tmp_path_factory):
    """Uninterrupted runs, one per key (stage, ZeRO, world size, bad rows, parquet, overrides): two
    torchrun agents of one worker each must give bit for bit what one agent with two workers
    gives, so they share one."""
    root, runs = tmp_path_factory.mktemp("references"), {}

    def get(key, launches_for):
        if key not in runs:
            out = root / "-".join(map(str, key))
            runs[key] = (out, run_launches(launches_for(out), out))
        return runs[key]

    return get


def killed_run_resumes_exactly(tmp_path, tiny_dir, references, case):
    """Kill where the case says, relaunch, and compare with the uninterrupted reference bit for bit."""
    shape, stage, zero, kills = CASES[case]
    world, bad = (1 if shape == "one-process" else 2), "bad-rows" in case
    packed, parquet = case.startswith("packed"), case.startswith("parquet")
    rows = 36 if packed else STEPS_PER_EPOCH * 2 * 2 * world
    config = config_file(tmp_path, tiny_dir, stage, rows, bad_rows=bad, parquet=parquet)
    common = [f"train.deepspeed={ZERO[zero]}"] if zero else []
    common += (PACKED if packed else []) + (LORA if "lora" in case else [])
    arm = scale_arm(case)
    if arm == "scale_learned":
        common += [f"model.norm_alignment={arm}", f"model.scale_value={SCALE_ARMS[arm]}"]
    elif arm == "scale_fixed":
        common += [f"model.norm_alignment={arm}"]
        common += [f"model.pretrained_projector={stage1_projector(config, common, SCALE_ARMS[arm])}"]
    ref_out, reference = references((stage, zero, world, bad, parquet, *common), lambda o: launches_of(
        "torchrun" if shape == "two-nodes" else shape, config, [f"train.output_dir={o}", *common], stage))
    out = tmp_path / "killed"
    assert sorted(per_step(reference)) == list(range(1, MAX_STEPS + 1))

    launches = launches_of(shape, config, [f"train.output_dir={out}", *common], stage)
    for step in kills:
        position = kill_at_checkpoint(launches, out, step)
        # Where the kill fell, from the checkpoint's own record: epoch and micro-batches consumed in it.
        assert (position["epoch"], position["batches_consumed"]) == (step // STEPS_PER_EPOCH,
                                                                     (step % STEPS_PER_EPOCH) * 2), position
        assert position["batches_per_epoch"] == STEPS_PER_EPOCH * 2
        assert (position["sampler"]["kind"] == "PackSampler") == packed
    resumed = run_launches(launches, out)
    assert resumed["resumed_from"] == str(out / f"checkpoint-{kills[-1]}")
    assert resumed["steps_this_launch"] == MAX_STEPS - kills[-1] > 0
    assert per_step(resumed) == per_step(reference)  # losses and every group's lr, bit-exact on CPU
    # with LoRA, the adapters and the model file beside them (the projector and norm train in full);
    # the model file last: ``final`` is its weights below
    for weights in (["model/adapter_model.safetensors"] if "lora" in case else []) + ["model/model.safetensors"]:
        final, expected = load_file(str(out / weights)), load_file(str(ref_out / weights))
        assert final.keys() == expected.keys() and all(torch.equal(final[k], expected[k]) for k in final), weights
    if arm:
        assert final[SCALE_KEY].shape == (1,)
        assert (final[SCALE_KEY] != SCALE_ARMS[arm]).all() if arm == "scale_learned" else \
            torch.equal(final[SCALE_KEY], torch.full((1,), SCALE_ARMS[arm]))

    skipped = (out / "skipped.jsonl").read_text()
    assert skipped == (ref_out / "skipped.jsonl").read_text()  # the same rows skipped, as often, across kills
    if bad:
        truncated = {("*", "shard_unreadable")} if parquet else set()
        assert {(r["row"], r["cause"]) for r in map(json.loads, skipped.splitlines())} == {
            ("s1", "image_corrupt"), ("broken", "bad_conversation"), *truncated}
        assert resumed["skipped_by_cause"] == {"bad_conversation": 1, "image_corrupt": 1,
                                               **({"shard_unreadable": 1} if parquet else {})}
    if parquet:  # one process read the data; the others, and every later launch, mapped its index
        assert (reference["data_index_builds"], reference["data_index_built_by"]) == (1, ["0"])
        assert resumed["data_index_builds"] == 0
    if case != next(iter(CASES)):
        return
    # Relaunching the finished run: exits 0 at once, trains nothing, writes nothing.
    before = snapshot(out)
    text = run_launches(launches, out, return_output=True)
    assert f"complete at step {MAX_STEPS}" in text
    assert snapshot(out) == before
