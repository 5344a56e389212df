"""What trains in each stage, and at which learning rate.

Owns ``freeze_backbones(model, stage)`` (logged per module, as prismatic-vlms does), its LoRA
counterpart ``freeze_for_lora`` and the optimizer's parameter groups: LLM, vision tower,
projector, norm layer and LoRA adapters, each with its own learning rate, so the YAML's
``optim.lr*`` keys are exactly what the optimizer carries.
"""

from __future__ import annotations

import logging

from llava_norm.config import LoraSettings, OptimConfig
from llava_norm.layout import PROJECTOR_MODULE
from llava_norm.model.lora import apply_lora, is_lora_parameter, lora_targets
from llava_norm.model.modeling import blank_image

log = logging.getLogger(__name__)


def module_of(name: str) -> str:
    """Which of the learning-rate groups a parameter name belongs to (adapters first: they sit inside
    the LLM's and vision tower's modules, while their frozen ``base_layer`` weights keep their module's group)."""
    if is_lora_parameter(name):
        return "lora"
    if ".vision_tower." in f".{name}":
        return "vision_tower"
    if f".{PROJECTOR_MODULE}.norm." in f".{name}":
        return "norm"
    if f".{PROJECTOR_MODULE}." in f".{name}":
        return "projector"
    return "llm"  # language_model.* and lm_head.*


def unused_vision_parameters(model) -> set[str]:
    """Vision-tower parameters that the selected feature layer never reaches (later layers, heads).

    Found with one blank image and a backward pass, not by layer names, so it holds for any tower.
    They are kept frozen: a trainable parameter with no gradient breaks DDP and wastes optimizer state.
    """
    tower = model.model.vision_tower
    saved = {n: p.requires_grad for n, p in tower.named_parameters()}
    for p in tower.parameters():
        p.requires_grad_(True)
        p.grad = None
    features = model.model.get_image_features(pixel_values=blank_image(tower)).pooler_output[0]
    model.model.multi_modal_projector.zero_grad(set_to_none=True)
    features.float().sum().backward()
    unused = {f"model.vision_tower.{n}" for n, p in tower.named_parameters() if p.grad is None}
    for n, p in tower.named_parameters():
        p.grad = None
        p.requires_grad_(saved[n])
    model.zero_grad(set_to_none=True)
    return unused


def freeze_backbones(model, stage: int, train_vision_tower: bool = True) -> dict[str, bool]:
    """Stage 1: only projector and norm train. Stage 2: everything (vision tower optional)."""
    trainable = {"projector": True, "norm": True, "llm": stage == 2, "vision_tower": stage == 2 and train_vision_tower}
    unused = unused_vision_parameters(model) if trainable["vision_tower"] else set()
    for name, param in model.named_parameters():
        param.requires_grad_(trainable[module_of(name)] and name not in unused)
    for group, on in trainable.items():
        log.info("stage %d: %-12s %s", stage, group, "TRAINABLE" if on else "frozen")
    if unused:
        log.info("vision tower: %d parameters past the feature layer stay frozen", len(unused))
    return trainable


def freeze_for_lora(model, lora: LoraSettings, vision_tower: str) -> dict[str, bool]:
    """Stage 2 with LoRA: inject adapters, then train them, the projector and the norm layer; the
    LLM's own weights stay frozen; the vision tower is ``frozen``, ``full`` or ``lora``."""
    unused = unused_vision_parameters(model) if vision_tower != "frozen" else set()  # before injection renames
    targets = lora_targets(model, lora.target_modules, lora.lm_head, vision_tower == "lora", unused)
    apply_lora(model, targets, lora.rank, lora.alpha, lora.dropout)
    trainable = {"projector": True, "norm": True, "lora": True, "llm": False, "vision_tower": vision_tower == "full"}
    for name, param in model.named_parameters():
        param.requires_grad_(trainable[module_of(name)] and name not in unused)
    for group, on in trainable.items():
        log.info("stage 2 (LoRA, vision tower %s): %-12s %s", vision_tower, group, "TRAINABLE" if on else "frozen")
    return trainable


def learning_rates(optim: OptimConfig, lora: bool = False) -> dict[str, float]:
    projector = optim.lr_projector if optim.lr_projector is not None else optim.lr
    rates = {
        "llm": optim.lr,
        "vision_tower": optim.lr_vision_tower,
        "projector": projector,
        "norm": optim.lr_norm if optim.lr_norm is not None else projector,
    }
    return {**rates, "lora": optim.lr_lora} if lora else rates


def parameter_groups(model, optim: OptimConfig) -> list[dict]:
    """One optimizer group per module (and per decay/no-decay), each named for logging."""
    rates = learning_rates(optim, lora=True)  # only groups with trainable parameters are created
    groups: dict[tuple[str, bool], list] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decay = optim.weight_decay > 0 and param.ndim >= 2
        groups.setdefault((module_of(name), decay), []).append(param)
    return [
        {"params": params, "lr": rates[group], "weight_decay": optim.weight_decay if decay else 0.0,
         "name": group if not decay else f"{group}_decay"}
        for (group, decay), params in sorted(groups.items())
    ]


def make_optimizer(model, optim: OptimConfig, device):
    """AdamW over ``parameter_groups``; fused on CUDA. The default (foreach) update makes
    parameter-sized fp32 temporaries: under ZeRO-2 one sqrt of a whole flat partition, 12 GiB at
    a 3B model, which ran the kit's Llama-3.2-3B stage-2 step out of memory on an 80 GB H100
    (bench/RESULTS.md); the fused kernel updates in place. CPU keeps the default path."""
    import torch

    return torch.optim.AdamW(parameter_groups(model, optim), betas=(optim.adam_beta1, optim.adam_beta2),
                             eps=optim.adam_epsilon, fused=True if device.type == "cuda" else None)
