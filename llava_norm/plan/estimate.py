"""The plan of a run: what trains, what a GPU holds, what a step costs; computed before launch.

Owns ``make_plan`` (a RunConfig, a GPU count and a GPU memory -> ``Plan``), the peak-memory
model that joins the parts, and the alternatives tried when a config does not fit. Everything
comes from the configs and the meta-device model: no weights, no data, no GPU.

Peak memory per GPU = model states + activations of one micro-batch. With one micro-batch per
optimizer step the gradients build up while the activations are released, so the two overlap:

    peak = (states - gradients) + max(gradients, activations + backward transient)

With gradient accumulation the gradients of the earlier micro-batches are alive during the
next forward, so then ``peak = states + activations + backward transient``.

ZeRO-1/2's gradient buckets are counted with the model states (DeepSpeed holds them through each
backward, where the peak is, and frees them before the optimizer step). The figure leaves out the CUDA
context, other communication buffers and allocator fragmentation;
``FIT_FRACTION`` of the GPU's memory is what the plan lets it use.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from llava_norm.config_schema import ConfigError, RunConfig, effective_grad_accum, lora_vision_mode
from llava_norm.plan import flops as flops_model
from llava_norm.plan.backbones import SHIPPED_BACKBONES, meta_model
from llava_norm.plan.memory import (PLAN_ATTENTION, Activations, Component, States, count_parameters,
                                    largest_layer_params, model_states, peak_bytes, trace_activations,
                                    trace_loss_kinds)
from llava_norm.train import params

FIT_FRACTION = 0.90
SHIPPED_ZERO2 = SHIPPED_BACKBONES.parent / "deepspeed" / "zero2.json"
# Packed rows: an image every 1.25 x tokens_per_image tokens, i.e. samples that are mostly image
# tokens, the heavier case for the vision tower (a plan should not under-count).
PACKED_TOKENS_PER_IMAGE = 1.25


def _deepspeed_settings(config: RunConfig) -> dict:
    if not config.train.deepspeed:
        return {}
    path = Path(config.train.deepspeed).expanduser()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"key 'train.deepspeed': {path}: cannot read it as JSON ({error})") from None


def zero_layout(config: RunConfig, settings: dict) -> str:
    """zero2 | zero3 | ddp: how the configured launch lays out model states (``settings``: its
    DeepSpeed JSON, ``_deepspeed_settings``: empty without DeepSpeed, so stage 0, DDP)."""
    stage = settings.get("zero_optimization", {}).get("stage", 0)
    if not isinstance(stage, int):
        raise ConfigError(f"key 'train.deepspeed': {Path(config.train.deepspeed).expanduser()}: "
                          f"zero_optimization.stage is {stage!r}; the plan needs a number (0-3)")
    return "zero3" if stage == 3 else "zero2" if stage in (1, 2) else "ddp"


def gradient_bucket_bytes(settings: dict, hidden: int, precision: str) -> int:
    """ZeRO-1/2's gradient buckets on each GPU, which DeepSpeed's estimator leaves out:
    ``reduce_bucket_size`` elements (``auto``: the LLM's hidden size squared, as transformers fills it
    in; unset: DeepSpeed's 5e8), two of them with ``overlap_comm``, in the training precision."""
    zero = settings.get("zero_optimization", {})
    if not zero.get("contiguous_gradients", True):
        return 0
    size = zero.get("reduce_bucket_size", 500_000_000)
    size = hidden * hidden if size == "auto" else int(size)
    return size * (2 if zero.get("overlap_comm", False) else 1) * (4 if precision == "fp32" else 2)


@dataclass
class Plan:
    config: RunConfig
    gpus: int
    nodes: int
    gpu_memory_gib: float | None
    gpu_name: str | None
    sources: dict[str, str]
    components: list[Component]
    tokens_per_image: int
    batch: int
    seq: int
    images: int
    grad_accum: int
    layout: str  # the configured one
    states: dict[str, States]  # zero2, zero3 and the configured layout
    activations: Activations
    fused_activations: Activations | None = None  # the same batch with train.loss fused, when plain
    step_flops: flops_model.StepFlops | None = None
    alternatives: list[tuple[str, float]] = field(default_factory=list)  # (overrides, peak GiB) that fit

    @property
    def world(self) -> int:
        return self.gpus * self.nodes

    @property
    def trained(self) -> int:
        return sum(c.trained for c in self.components)

    @property
    def total_params(self) -> int:
        return sum(c.total for c in self.components)

    @property
    def checkpointing(self) -> bool:
        return self.config.train.gradient_checkpointing

    def host_memory_gib(self) -> float:
        """Host memory per node at start-up: each of the node's processes builds the whole model in
        fp32 on the CPU (4 bytes a parameter) before DeepSpeed partitions it (README, "Training on a
        cluster"). Data workers and the Python processes themselves come on top."""
        return self.gpus * 4 * self.total_params / 2 ** 30

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq * self.grad_accum * self.world

    def peak(self, layout: str | None = None, checkpointing: bool | None = None,
             activations: Activations | None = None) -> int:
        states = self.states[layout or self.layout]
        acts = activations or self.activations
        ckpt = self.checkpointing if checkpointing is None else checkpointing
        return peak_bytes(states, acts, ckpt, self.grad_accum)

    def fits(self, peak: int) -> bool | None:
        return None if self.gpu_memory_gib is None else peak <= FIT_FRACTION * self.gpu_memory_gib * 2 ** 30


def _sequence(config: RunConfig, tokens_per_image: int, seq_len: int | None, images: int | None) -> tuple[int, int]:
    d = config.data
    seq = seq_len or (d.pack_max_tokens if d.packing else d.max_length)
    if images is None:
        images = max(1, math.floor(seq / (PACKED_TOKENS_PER_IMAGE * tokens_per_image))) if d.packing else 1
    if images * tokens_per_image > seq:  # no row would hold its image: training would skip every one
        where = "--seq-len" if seq_len else f"key '{'data.pack_max_tokens' if d.packing else 'data.max_length'}'"
        raise ConfigError(f"{where}: {seq} tokens per row do not hold {images} image(s) of {tokens_per_image} tokens")
    return seq, images


def _freeze(model, config: RunConfig) -> None:
    """Training's own freezing, with its per-module log lines held back (training prints them).

    LoRA's adapters are made on the meta device, as the model is: peft builds each adapter's
    layers on the default device, initialises them and only then moves them to the base layer's
    device, which for a 7-8B model was about 2 CPU-s of random numbers that the plan never reads.
    peft skips adapters already on the meta device when it moves them, and with that their cast to
    the base layer's dtype, so that cast is done here.
    """
    level = params.log.level
    params.log.setLevel(logging.WARNING)
    try:
        if config.lora.enabled:
            with torch.device("meta"):
                params.freeze_for_lora(model, config.lora, lora_vision_mode(config))
            for module in model.modules():  # peft's own list of a layer's adapter parts
                if not (hasattr(module, "adapter_layer_names") and hasattr(module, "get_base_layer")):
                    continue
                weight = getattr(module.get_base_layer(), "weight", None)
                if weight is None or not weight.dtype.is_floating_point:  # peft casts to float dtypes only
                    continue
                for name in module.adapter_layer_names:
                    if isinstance(getattr(module, name, None), torch.nn.Module):
                        getattr(module, name).to(weight.dtype)
        else:
            params.freeze_backbones(model, config.train.stage, config.train.train_vision_tower)
    finally:
        params.log.setLevel(level)


def make_plan(config: RunConfig, gpus: int = 1, nodes: int = 1, gpu_memory_gib: float | None = None,
              gpu_name: str | None = None, seq_len: int | None = None, images: int | None = None,
              alternatives: bool = True) -> Plan:
    """The plan of ``config`` on ``nodes`` x ``gpus`` GPUs of ``gpu_memory_gib`` each."""
    t = config.train
    model, tokens_per_image, sources = meta_model(config.model, attn_implementation=PLAN_ATTENTION)
    _freeze(model, config)
    components = count_parameters(model)
    trained = sum(c.trained for c in components)
    frozen = sum(c.total for c in components) - trained
    largest = largest_layer_params(model)
    world = gpus * nodes
    settings = _deepspeed_settings(config)
    layout = zero_layout(config, settings)
    states = {name: model_states(trained, frozen, largest, name, gpus, nodes) for name in {"zero2", "zero3", layout}}
    # the zero2 row of a run configured otherwise is the shipped zero2.json's
    zero2 = settings if layout == "zero2" else json.loads(SHIPPED_ZERO2.read_text())
    buckets = gradient_bucket_bytes(zero2, model.config.text_config.hidden_size, t.precision)
    states["zero2"] = replace(states["zero2"], total=states["zero2"].total + buckets)
    seq, n_images_row = _sequence(config, tokens_per_image, seq_len, images)
    batch = t.per_device_batch_size
    # a plain-loss plan also gives the fused loss's figure (an alternative when it does not fit)
    kinds = (t.loss, "fused") if t.loss == "plain" else (t.loss,)
    traced = trace_loss_kinds(model, batch, seq, batch * n_images_row, tokens_per_image, kinds, t.fused_loss_softmax)
    acts = traced[0]
    accum = effective_grad_accum(t, world)
    c = model.config
    # a LoRA run's LLM is frozen apart from its adapters (negligible FLOPs): no weight gradients;
    # a tower with adapters or trained weights needs its backward
    llm_trained = any(p.trained for p in components if p.name in ("llm", "llm embeddings", "lm_head"))
    vision_trained = any(p.requires_grad for p in model.model.vision_tower.parameters())
    step = flops_model.train_flops(c.vision_config, c.text_config, seq, batch * accum * world,
                                   c.vision_feature_layer, images=batch * n_images_row * accum * world,
                                   llm_trained=llm_trained, vision_trained=vision_trained)
    plan = Plan(config, gpus, nodes, gpu_memory_gib, gpu_name, sources, components, tokens_per_image, batch, seq,
                n_images_row, accum, layout, states, acts, step_flops=step)
    if t.loss == "plain":
        plan.fused_activations = traced[1]
    if alternatives and plan.fits(plan.peak()) is False:
        plan.alternatives = _alternatives(plan, model, largest)
    return plan


def _alternatives(plan: Plan, model, largest: int) -> list[tuple[str, float]]:
    """Single changes to the config that make it fit, each with its peak (GiB)."""
    t, found = plan.config.train, []

    def consider(change: str, peak: int) -> None:
        if plan.fits(peak):
            found.append((change, peak / 2 ** 30))

    if not t.gradient_checkpointing:
        consider("train.gradient_checkpointing=true", plan.peak(checkpointing=True))
    if plan.layout != "zero3":
        consider("train.deepspeed=configs/deepspeed/zero3.json", plan.peak("zero3"))
    if plan.fused_activations is not None:
        consider("train.loss=fused", plan.peak(activations=plan.fused_activations))
    batch = plan.batch // 2
    while batch >= 1:
        acts = trace_activations(model, batch, plan.seq, batch * plan.images, plan.tokens_per_image, t.loss,
                                 t.fused_loss_softmax)
        # the same global batch in more micro-batches: accumulating changes how gradients and
        # activations overlap (peak_bytes), so the peak is that of the accumulation it takes
        try:
            accum = (effective_grad_accum(replace(t, per_device_batch_size=batch), plan.world)
                     if t.global_batch_size is not None else -(-plan.grad_accum * plan.batch // batch))
        except ConfigError:  # the global batch does not split into micro-batches of this size
            batch //= 2
            continue
        peak = replace(plan, grad_accum=accum).peak(activations=acts)
        if plan.fits(peak):
            consider(f"train.per_device_batch_size={batch} (grad_accum grows to keep the global batch)", peak)
            break
        batch //= 2
    trained, frozen = plan.trained, plan.total_params - plan.trained
    for factor in (2, 4, 8, 16):  # more GPUs: fill the node up to 8 first, then add nodes
        gpus = min(8, plan.gpus * factor) if plan.nodes == 1 else plan.gpus
        nodes = max(1, plan.world * factor // gpus)
        try:
            effective_grad_accum(t, gpus * nodes)  # the global batch must still divide
        except ConfigError:
            continue
        states = model_states(trained, frozen, largest, "zero3", gpus, nodes)
        peak = replace(plan, gpus=gpus, nodes=nodes, states={"zero3": states}).peak("zero3")
        if plan.fits(peak):
            consider(f"ZeRO-3 on {nodes} node(s) x {gpus} GPUs (--nodes {nodes} --gpus {gpus})", peak)
            break
    return found
