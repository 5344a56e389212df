"""The plan as a person reads it, and the GPUs it knows by name.

Owns ``GPU_MEMORY_GIB`` (the memory ``--gpu NAME`` stands for) and ``format_plan``: parameters
per component and what trains, model states under ZeRO-2 and ZeRO-3, activations with and
without checkpointing, the peak per GPU against the GPU's memory, tokens and FLOPs per step,
and what to change when it does not fit.
"""

from __future__ import annotations

from llava_norm.plan.estimate import FIT_FRACTION, Plan

# Memory as the driver reports it (nvidia-smi's total) where seen on such a card; else the
# vendor's nominal figure.
GPU_MEMORY_GIB = {
    "a10g-24gb": 24.0, "rtx4090-24gb": 24.0, "l40s-48gb": 48.0, "a6000-48gb": 48.0,
    "a100-40gb": 40.0, "a100-80gb": 80.0,
    "h100-80gb": 81559 / 1024,  # NVIDIA H100 80GB HBM3, driver 580 (bench/RESULTS.md's machine)
    "h100-94gb": 94.0, "h200-141gb": 143771 / 1024,  # NVIDIA H200, driver 580
}


def gpu_memory(name: str) -> float:
    """GiB of a GPU named as in ``GPU_MEMORY_GIB``; an unknown name is a ValueError listing the known ones."""
    key = name.lower()
    if key not in GPU_MEMORY_GIB:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(GPU_MEMORY_GIB))} "
                         "(or give --gpu-memory GiB)")
    return GPU_MEMORY_GIB[key]


def memory_text(n: float) -> str:
    """Bytes in GiB, or in MiB below one GiB (a tiny model's figures)."""
    return f"{n / 2 ** 30:.1f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB"


def _n(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 'es' if noun.endswith('s') else 's'}"


def _count(n: int) -> str:
    return f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n / 1e6:.2f}M" if n >= 1e4 else str(n)


def verdict(plan: Plan) -> str:
    peak = plan.peak()
    fits = plan.fits(peak)
    if fits is None:
        return f"peak {memory_text(peak)} per GPU (no GPU memory given: --gpu NAME or --gpu-memory GiB)"
    budget = FIT_FRACTION * plan.gpu_memory_gib
    word = "FITS" if fits else "DOES NOT FIT"
    return (f"{word}: peak {memory_text(peak)} per GPU against {budget:.1f} GiB usable "
            f"({FIT_FRACTION:.0%} of {plan.gpu_memory_gib:.1f} GiB{f', {plan.gpu_name}' if plan.gpu_name else ''})")


def format_plan(plan: Plan, config_name: str = "") -> str:
    t, m = plan.config.train, plan.config.model
    lines = [f"plan for {config_name or 'the config'}: stage {t.stage}{' (LoRA)' if plan.config.lora.enabled else ''}, "
             f"arm {m.norm_alignment}, {_n(plan.nodes, 'node')} x {_n(plan.gpus, 'GPU')}",
             f"  backbones: vision {m.vision_tower} ({plan.sources['vision_tower']}); "
             f"llm {m.llm} ({plan.sources['llm']})",
             "  parameters                total       trained"]
    for c in plan.components:
        lines.append(f"    {c.name:20s} {_count(c.total):>10s}  {_count(c.trained):>10s}")
    lines.append(f"    {'all':20s} {_count(plan.total_params):>10s}  {_count(plan.trained):>10s}")
    lines.append(f"  micro-batch: {_n(plan.batch, 'row')} x {plan.seq} tokens, {_n(plan.images, 'image')} of "
                 f"{plan.tokens_per_image} tokens per row; grad_accum {plan.grad_accum}; {_n(plan.world, 'process')}")
    acts = plan.activations
    lines.append(f"  activations of a micro-batch: {memory_text(acts.total(False))} (checkpointing off), "
                 f"{memory_text(acts.total(True))} (on), and {memory_text(acts.transient)} more while the backward "
                 f"starts (the gradient of the largest one)")
    overlap = "the gradients overlap the activations' release" if plan.grad_accum == 1 else \
        "accumulated gradients stay alive through each micro-batch"
    lines.append(f"  memory per GPU           model states     peak, ckpt off / on   ({overlap})")
    for layout in sorted(plan.states):
        s = plan.states[layout]
        mark = "  <- configured" if layout == plan.layout else ""
        lines.append(f"    {layout:20s} {memory_text(s.total):>10s}      {memory_text(plan.peak(layout, False)):>9s} / "
                     f"{memory_text(plan.peak(layout, True))}{mark}")
    if plan.fused_activations is not None:
        lines.append(f"    with train.loss=fused: peak {memory_text(plan.peak(activations=plan.fused_activations))} "
                     f"(configured layout and checkpointing)")
    lines.append(f"  configured: {plan.layout}, gradient checkpointing {'on' if plan.checkpointing else 'off'}, "
                 f"loss {t.loss}")
    flops = plan.step_flops
    scale, unit = (1e15, "PFLOP") if flops.total >= 1e13 else (1e9, "GFLOP")  # a tiny model's step in GFLOP
    lines.append(f"  per optimizer step: {plan.tokens_per_step:,} token slots (rows padded to {plan.seq}), "
                 f"{flops.total / scale:.2f} {unit} of model FLOPs (vision {flops.vision / scale:.2f}, "
                 f"projector {flops.projector / scale:.3f}, llm {flops.llm / scale:.2f})")
    host = memory_text(plan.host_memory_gib() * 2 ** 30)
    lines.append(f"  host memory per node at start-up: {host} (each of the node's {_n(plan.gpus, 'process')} holds "
                 "the fp32 model before DeepSpeed partitions it)")
    lines.append("  " + verdict(plan))
    if plan.fits(plan.peak()) is False:
        if plan.alternatives:
            lines.append("  each of these alone makes it fit:")
            lines += [f"    {change}: peak {peak:.1f} GiB" for change, peak in plan.alternatives]
        else:
            lines.append("  no single change tried (checkpointing, ZeRO-3, fused loss, a smaller micro-batch, up to "
                         "8x the nodes) makes it fit; combine them, or use a GPU with more memory")
    return "\n".join(lines)


def plan_dict(plan: Plan) -> dict:
    """The plan's numbers (bytes, counts, FLOPs) for scripts: ``llava-norm plan --json``."""
    return {
        "gpus": plan.gpus, "nodes": plan.nodes, "gpu_memory_gib": plan.gpu_memory_gib, "sources": plan.sources,
        "parameters": {c.name: {"total": c.total, "trained": c.trained} for c in plan.components},
        "micro_batch": {"rows": plan.batch, "tokens": plan.seq, "images_per_row": plan.images,
                        "tokens_per_image": plan.tokens_per_image, "grad_accum": plan.grad_accum},
        "layout": plan.layout, "checkpointing": plan.checkpointing,
        "states_bytes": {name: s.total for name, s in plan.states.items()},
        "activations_bytes": {"off": plan.activations.total(False), "on": plan.activations.total(True)},
        "peak_bytes": {f"{layout}/ckpt_{'on' if ckpt else 'off'}": plan.peak(layout, ckpt)
                       for layout in plan.states for ckpt in (False, True)},
        "configured_peak_bytes": plan.peak(), "fits": plan.fits(plan.peak()),
        "tokens_per_step": plan.tokens_per_step, "model_flops_per_step": plan.step_flops.total,
        "alternatives": [{"change": change, "peak_gib": peak} for change, peak in plan.alternatives],
        "host_memory_gib_per_node": plan.host_memory_gib(),
    }
