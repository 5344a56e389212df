"""The GPU kit's trainer runs: which stage-2 runs ``llava-norm train`` makes, their configs over
the demo's synthetic world and random-weight backbones at real width, and the figures read back
from each run's own log beside the plan for the same config.

Owns the plan-against-DeepSpeed comparison: the plan's peak for the run's widest micro-batch
against ``torch.cuda.max_memory_allocated`` as the trainer logs it (``peak_memory_gib``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from _repo import REPO_ROOT

STEPS = 20
PROFILED_STEPS = 3  # the runs' last steps, under train.profile_steps: left out of their tokens/s
WORLD_TEXT_TOKENS = 320  # above the longest text of the demo's synthetic stage-2 rows
PLAN_TOLERANCE = 0.15


@dataclass(frozen=True)
class TrainRun:
    name: str
    vision: str
    llm: str
    zero: int
    batch: int
    checkpointing: bool
    why: str
    compile: bool = False  # train.compile: the decoder and encoder layers under torch.compile
    default: bool = True  # in PART=2; the others by --train-runs (a half's 460 s holds one 3B run)
    loss: str = "plain"  # train.loss


TRAIN_RUNS = [
    TrainRun("qwen0.5b_zero2", "google/siglip-base-patch16-224", "Qwen/Qwen2.5-0.5B-Instruct", 2, 32, False,
             "activations above the model states: a 152K vocabulary's logits at 32 rows, no checkpointing"),
    TrainRun("llama3b_zero2", "google/siglip-so400m-patch14-384", "meta-llama/Llama-3.2-3B-Instruct", 2, 4, True,
             "the paper's Llama-3.2-3B stack under ZeRO-2"),
    TrainRun("llama3b_zero2_compiled", "google/siglip-so400m-patch14-384", "meta-llama/Llama-3.2-3B-Instruct", 2, 4,
             True, "the same with train.compile, the setting behind gpu_step.py's MFU", compile=True, default=False),
    TrainRun("llama3b_zero2_fused", "google/siglip-so400m-patch14-384", "meta-llama/Llama-3.2-3B-Instruct", 2, 4,
             True, "the same with train.loss fused: the chunked loss's compiled softmax inside a GPU training run",
             default=False, loss="fused"),
    TrainRun("qwen7b_zero3", "google/siglip-so400m-patch14-384", "Qwen/Qwen2.5-7B-Instruct", 3, 2, True,
             "the paper's Qwen2.5-7B stack under ZeRO-3"),
]


def _backbone(hub_id: str, work: Path) -> Path:
    import multiprocessing

    import torch
    from real_width import write_backbone

    folder = work / "backbones" / hub_id.split("/")[-1].lower()
    if not (folder / "config.json").is_file():
        # drawn on the GPU (on its host a 3B model's weights take minutes), in a process of its own:
        # the kit's would otherwise keep the weights' memory cached while the trainer runs
        device = "cuda" if torch.cuda.is_available() else "cpu"
        child = multiprocessing.get_context("spawn").Process(target=write_backbone, args=(hub_id, folder),
                                                             kwargs={"device": device})
        child.start()
        child.join()
        if child.exitcode:
            raise RuntimeError(f"writing the {hub_id} backbone failed (exit {child.exitcode})")
    return folder


def _world(work: Path) -> Path:
    from llava_norm_demo.synth import build_world

    world = work / "world"
    if not (world / "manifest.json").is_file():
        build_world(world, n_pretrain=0, n_instruct=400, n_text=0, n_bench=0)
    return world


def _config_text(run: TrainRun, vision: Path, llm: Path, world: Path, work: Path, base: str, steps: int) -> str:
    # save_steps 0: no checkpoint. A 3B run's (about 58 GB with its optimizer states) filled the GPU
    # machine's 64 GiB disk beside the backbones (bench/RESULTS.md); the final model is still written.
    return (f"base: [{REPO_ROOT}/configs/_base/{base}]\n"
            f"model: {{vision_tower: {vision}, llm: {llm}, norm_alignment: ln_textnorm_gwc}}\n"
            f"data: {{mixture: [{{path: {world}/instruct/synth_instruct.json, image_folder: {world}/images}}], "
            f"num_workers: 2}}\n"
            f"train: {{output_dir: {work}/runs/{run.name}, max_steps: {steps}, per_device_batch_size: {run.batch}, "
            f"global_batch_size: {run.batch}, grad_accum: 1, gradient_checkpointing: {str(run.checkpointing).lower()}, "
            f"compile: {str(run.compile).lower()}, loss: {run.loss}, "
            f"save_steps: 0, report_to: [], restart: true, "
            # the last steps profiled: the table lands in the run's log, which the kit returns
            f"profile_steps: {f'[{steps - PROFILED_STEPS + 1}, {steps}]' if steps > PROFILED_STEPS else 'null'}, "
            f"deepspeed: {REPO_ROOT}/configs/deepspeed/zero{run.zero}.json}}\n")


def train_setup(run: TrainRun, work: Path, toy: bool, overrides: tuple[str, ...] = ()) -> tuple[Path, str | None]:
    """(the run's YAML, why it is skipped or None). A run the plan says cannot fit this GPU is skipped.
    ``overrides``: the ones ``llava-norm train`` gets, planned with (``train.deepspeed=null`` plans DDP)."""
    world = _world(work)
    if toy:
        from llava_norm_demo.tiny import make_tiny

        if not (work / "tiny" / "qwen2").is_dir():
            make_tiny(work / "tiny", seed=0)
        vision, llm, base, steps = work / "tiny" / "siglip", work / "tiny" / "qwen2", "tiny_stage2.yaml", 2
        run = dataclasses.replace(run, vision="", llm="", batch=2)
    else:  # planned from the shipped configs first: a run that cannot fit writes no backbone
        vision, llm, base, steps = run.vision, run.llm, "stage2.yaml", STEPS
    config = work / f"{run.name}.yaml"
    config.write_text(_config_text(run, vision, llm, world, work, base, steps))
    # the synthetic world's rows are the image's tokens and at most a few hundred more, not
    # data.max_length: the fit is judged there (the comparison after the run uses the longest row seen)
    plan = _plan(config, _plan(config, None, overrides).tokens_per_image + WORLD_TEXT_TOKENS, overrides)
    if plan.fits(plan.peak()) is False:
        return config, (f"the plan's peak {plan.peak() / 2 ** 30:.1f} GiB does not fit this GPU's "
                        f"{plan.gpu_memory_gib:.0f} GiB (llava-norm plan {config.name} --gpus 1)")
    if not toy:  # printed with the time taken: a run cut short at its limit says where the time went
        started = time.monotonic()
        config.write_text(_config_text(run, _backbone(run.vision, work), _backbone(run.llm, work), world, work, base,
                                       steps))
        print(f"[train] {run.name}: backbones written or found in {time.monotonic() - started:.0f} s", flush=True)
    return config, None


def _plan(config: Path, seq_len: int | None, overrides: tuple[str, ...] = ()):
    import torch

    from llava_norm.config import load_config
    from llava_norm.plan import make_plan

    memory = torch.cuda.get_device_properties(0).total_memory / 2 ** 30 if torch.cuda.is_available() else None
    return make_plan(load_config(config, list(overrides), check_paths=False), 1, 1, memory, seq_len=seq_len,
                     alternatives=False)


def figures_after(run: TrainRun, config: Path, code: int, overrides: tuple[str, ...] = (),
                  launched: float = 0.0) -> dict:
    """The run's figures, or why there are none. A run stopped at its limit (124) after writing its
    complete summary (the limit came while the process shut down, as on the H200 in
    bench/RESULTS.md) keeps them, when the summary was written after ``launched`` (a time.time()):
    a run stopped before its launch cleared the folder would find an earlier run's."""
    from llava_norm.config import load_config

    path = Path(load_config(config, list(overrides), check_paths=False).train.output_dir) / "train_summary.json"
    try:
        summary, written = json.loads(path.read_text()), path.stat().st_mtime
    except (OSError, ValueError):
        summary, written = {}, 0.0
    if code == 124 and summary.get("complete") is True and written >= launched:
        return {**train_figures(run, config, summary, overrides),
                "note": "stopped at its limit after writing its complete summary"}
    return train_figures(run, config, summary, overrides) if code == 0 else {"error": f"exit {code}"}


def train_figures(run: TrainRun, config: Path, summary: dict, overrides: tuple[str, ...] = ()) -> dict:
    """Tokens/s and peak memory from the run's own log (``summary``: its train_summary.json), against
    the plan at its widest micro-batch."""
    import torch

    history = summary["log_history"]
    steps = [h for h in history if "tokens_per_second" in h]
    # the first steps carry warm-up (kernel choice, the allocator's growth), the last the profiler
    later = [h for h in steps[3:] if h.get("step", 0) <= STEPS - PROFILED_STEPS] or steps
    longest = max(h.get("longest_row", 0) for h in steps)  # rows are padded to their batch's longest
    plan = _plan(config, longest, overrides)
    peaks = [h["peak_memory_gib"] for h in steps if "peak_memory_gib" in h]
    ckpt = plan.checkpointing
    figures = {"why": run.why, "steps_logged": len(steps), "longest_row": longest, "rows": plan.batch,
               "planned_layout": plan.layout,
               # the window's tokens over its time: a median of per-step rates weighs a 500-token step
               # like a 4,000-token one
               "tokens_per_s": sum(h["tokens"] for h in later) / sum(h["tokens"] / h["tokens_per_second"]
                                                                    for h in later),
               "planned_peak_gib": plan.peak() / 2 ** 30,
               "planned_states_gib": plan.states[plan.layout].total / 2 ** 30,
               "planned_activations_gib": plan.activations.total(ckpt) / 2 ** 30,
               "measured_peak_gib": max(peaks) if peaks else None,
               # the allocator's free-everything-and-retry count over the run (each a device-wide sync)
               "alloc_retries": steps[-1].get("alloc_retries") if steps else None}
    if peaks:
        figures["measured_over_plan"] = max(peaks) / figures["planned_peak_gib"] - 1
        figures["meets"] = abs(figures["measured_over_plan"]) <= PLAN_TOLERANCE
    elif torch.cuda.is_available():  # a planned number with nothing measured beside it is a failure
        figures["error"] = "the trainer logged no peak_memory_gib: the plan has nothing to be held against"
    return figures
