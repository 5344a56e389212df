"""Memory per GPU of a training step: parameters, model states and activations.

Owns three estimates, each from the meta-device model (no weights, no data):
- ``count_parameters``: parameters per component and which of them train, after the same
  ``freeze_backbones`` / ``freeze_for_lora`` that training calls;
- ``model_states``: weights, gradients and optimizer states per GPU. Under DeepSpeed the
  trained parameters' figure is DeepSpeed's own estimator; frozen weights add their bf16 copy
  (replicated under ZeRO-2, partitioned under ZeRO-3);
- ``trace_activations``: one forward of a batch of the configured shape, recording every tensor
  autograd saves for the backward (torch's saved-tensor hooks), less the parameters themselves
  (``trace_loss_kinds``: one per loss kind, sharing the vision tower's trace).
  Attention is recorded as a fused kernel keeps it (q, k, v, output and the fp32 row
  log-sum-exp; no score matrix), which is what sdpa and flash-attention run on a GPU.
  Checkpointed layers keep only their input, and one layer's activations are rebuilt at a time.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import torch
import torch.fx.experimental._config as fx_config
from transformers import AttentionInterface
from transformers.modeling_layers import GradientCheckpointingLayer

from llava_norm.model.loss import fused_held_bytes
from llava_norm.train.params import module_of

PLAN_ATTENTION = "llava_norm_plan"


class _FusedAttention(torch.autograd.Function):
    """What a fused attention kernel saves for its backward; the values are never computed."""

    @staticmethod
    def forward(ctx, query, key, value):
        out = torch.empty_like(query)
        lse = torch.empty(query.shape[:3], dtype=torch.float32, device=query.device)
        ctx.save_for_backward(query, key, value, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        query, key, value, _, _ = ctx.saved_tensors
        return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _plan_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    return _FusedAttention.apply(query, key, value).transpose(1, 2).contiguous(), None


# transformers' own registry of attention functions; an implementation with no mask function
# registered builds no mask, which on the meta device could not be built (it reads values).
AttentionInterface.register(PLAN_ATTENTION, _plan_attention)


@dataclass(frozen=True)
class Component:
    name: str
    total: int
    trained: int


def count_parameters(model) -> list[Component]:
    """Parameters per component (tied weights once), and how many of each train."""
    totals, trained, seen = Counter(), Counter(), set()
    for name, param in model.named_parameters(remove_duplicate=True):
        if id(param) in seen:
            continue
        seen.add(id(param))
        group = module_of(name)
        if group == "llm":
            group = "llm embeddings" if "embed_tokens" in name else "lm_head" if name.startswith("lm_head") else "llm"
        totals[group] += param.numel()
        if param.requires_grad:
            trained[group] += param.numel()
    order = ["vision_tower", "projector", "norm", "llm embeddings", "llm", "lm_head", "lora"]
    return [Component(g, totals[g], trained[g]) for g in order if totals[g]]


def largest_layer_params(model) -> int:
    """The most parameters any one module holds directly (ZeRO-3 gathers one at a time)."""
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())


@dataclass(frozen=True)
class States:
    """Model-state bytes per GPU; ``gradients`` is the part that builds up during the backward."""

    layout: str
    total: int
    gradients: int


def model_states(trained: int, frozen: int, largest: int, layout: str, gpus: int, nodes: int = 1) -> States:
    """Per-GPU bytes of weights, gradients and Adam states. ``layout``: zero2 | zero3 (DeepSpeed,
    bf16 with fp32 master weights), ddp (no DeepSpeed: fp32 weights and gradients under autocast, and
    DDP's gradient buckets, a second fp32 copy of the gradients when several processes run),
    bf16_adamw (bf16 weights, gradients and Adam moments, as bench/gpu_step.py trains)."""
    world = gpus * nodes
    if layout in ("zero2", "zero3") and not torch.cuda.is_available():
        # a plan made on a machine without a GPU: DeepSpeed would warn that it found none
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if layout == "zero2":
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        _, gpu = estimate_zero2_model_states_mem_needs(trained, gpus, nodes, cpu_offload=False)
        return States(layout, gpu + 2 * frozen, 2 * trained // world)
    if layout == "zero3":
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        _, gpu, _ = estimate_zero3_model_states_mem_needs(trained, largest, gpus, nodes, cpu_offload=False,
                                                         cpu_offload_params=False)
        return States(layout, gpu + 2 * frozen // world, 2 * trained // world)
    if layout == "ddp":
        buckets = 4 * trained if world > 1 else 0
        return States(layout, 16 * trained + 4 * frozen + buckets, 4 * trained)
    if layout == "bf16_adamw":
        return States(layout, 8 * trained + 2 * frozen, 2 * trained)
    raise ValueError(f"unknown layout {layout!r}")


@dataclass(frozen=True)
class Activations:
    """Bytes autograd keeps for the backward of one micro-batch."""

    outside_layers: int  # embeddings, projector, final norm, logits and loss
    layers: tuple[tuple[int, int], ...]  # per checkpointable layer: (saved bytes, its input's bytes)
    largest_tensor: int

    def total(self, checkpointing: bool) -> int:
        if not checkpointing:
            return self.outside_layers + sum(saved for saved, _ in self.layers)
        # kept: each layer's input; during its backward, one layer's activations rebuilt
        return self.outside_layers + sum(kept for _, kept in self.layers) + max(saved for saved, _ in self.layers)

    @property
    def transient(self) -> int:
        """The backward of the op that saved the largest tensor makes gradients of about its size
        while it is alive: the logits' gradients (fp32, then bf16) with the plain loss."""
        return 2 * self.largest_tensor


def peak_bytes(states: States, acts: Activations, checkpointing: bool, grad_accum: int) -> int:
    """Peak memory per GPU (``llava_norm.plan.estimate`` says why): the gradients overlap the
    activations' release, unless accumulation keeps earlier micro-batches' gradients alive."""
    held = acts.total(checkpointing) + acts.transient
    if grad_accum > 1:
        return states.total + held
    return states.total - states.gradients + max(states.gradients, held)


def trace_activations(model, batch: int, seq: int, images: int, tokens_per_image: int, loss_kind: str = "plain",
                      softmax: str = "auto") -> Activations:
    """Run one training forward of ``model`` (on the meta device for a plan; any device works) over ``batch`` rows of ``seq``
    tokens holding ``images`` images in all; every position is a label (the most loss memory).
    ``softmax``: train.fused_loss_softmax, as a GPU runs it (eager: the fp32 blocks counted too)."""
    return trace_loss_kinds(model, batch, seq, images, tokens_per_image, (loss_kind,), softmax)[0]


def trace_loss_kinds(model, batch: int, seq: int, images: int, tokens_per_image: int, loss_kinds: tuple[str, ...],
                     softmax: str = "auto") -> list[Activations]:
    """``trace_activations`` once per loss kind, the vision tower traced once for all of them: its
    forward is the same whatever loss follows (the plan's plain run and its fused alternative).
    Each kind's forward starts from what the tower's left recorded, as if traced alone."""
    vision, device = model.config.vision_config, model.device
    pixels = torch.zeros(images, vision.num_channels, vision.image_size, vision.image_size,
                         dtype=model.dtype, device=device)
    hidden = model.config.text_config.hidden_size
    image_slots = images * tokens_per_image
    if image_slots > batch * seq:
        raise ValueError(f"{images} images of {tokens_per_image} tokens do not fit {batch} rows of {seq} tokens")
    param_storages = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}
    owner: dict[int, int | None] = {}
    inputs: dict[int, int] = {}
    stack: list[int] = []

    def enter(module, args, kwargs):
        stack.append(id(module))
        first = args[0] if args else kwargs.get("hidden_states")
        inputs.setdefault(id(module), first.numel() * first.element_size())

    def leave(module, args, output):
        stack.pop()

    hooks = [m.register_forward_pre_hook(enter, with_kwargs=True) for m in model.modules()
             if isinstance(m, GradientCheckpointingLayer)]
    hooks += [m.register_forward_hook(leave) for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]

    alive = []  # every saved tensor stays referenced, so no storage address is reused mid-trace

    def pack(tensor):
        alive.append(tensor)
        key = tensor.untyped_storage()._cdata
        if key not in param_storages and key not in saved:
            saved[key] = tensor.untyped_storage().nbytes()
            owner[key] = stack[-1] if stack else None
        return tensor

    traced = []
    was_training = model.training
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            features = model.model.get_image_features(pixel_values=pixels)
            features = features.pooler_output if hasattr(features, "pooler_output") else features
            features = torch.cat([f.reshape(-1, hidden) for f in features])
            after_tower = dict(saved), dict(owner), dict(inputs)
            for loss_kind in loss_kinds:
                for record, at_tower in zip((saved, owner, inputs), after_tower):
                    record.clear()
                    record.update(at_tower)
                embeds = model.get_input_embeddings()(torch.zeros(batch, seq, dtype=torch.long, device=device))
                # the image features replace the first image_slots positions (values never matter here)
                flat = embeds.reshape(-1, hidden)
                embeds = torch.cat([features.to(embeds.dtype), flat[image_slots:]]).reshape(batch, seq, hidden)
                labels = torch.zeros(batch, seq, dtype=torch.long, device=device)
                # every position a label: the fused loss keeps all rows (meta cannot count them). Set and
                # restored by hand: torch's config.patch() makes a new ContextVar per call, and those pile
                # up in the process's context (one per plan, for the life of a test session).
                assume_nonzero = fx_config.meta_nonzero_assume_all_nonzero
                fx_config.meta_nonzero_assume_all_nonzero = True
                try:
                    model(inputs_embeds=embeds, labels=labels, use_cache=False, loss_kind=loss_kind)
                finally:
                    fx_config.meta_nonzero_assume_all_nonzero = assume_nonzero
                traced.append(_activations(model, saved, owner, inputs, batch * seq, hidden, loss_kind, softmax))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return traced


def _activations(model, saved: dict[int, int], owner: dict[int, int | None], inputs: dict[int, int], tokens: int,
                 hidden: int, loss_kind: str, softmax: str) -> Activations:
    """One traced forward's record, summed per checkpointed layer."""
    per_layer = Counter()
    outside = 0
    for key, size in saved.items():
        if owner[key] is None:
            outside += size
        else:
            per_layer[owner[key]] += size
    if loss_kind == "fused":
        head = model.lm_head.weight
        outside += fused_held_bytes(tokens, hidden, head.shape[0], head.element_size(), head.requires_grad,
                                    compiled=softmax != "eager")
    layers = tuple((per_layer[layer], inputs[layer]) for layer in inputs)
    return Activations(outside, layers, max(saved.values(), default=0))
