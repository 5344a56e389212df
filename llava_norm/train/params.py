"""What trains in each stage, and at which learning rate.

Owns ``freeze_backbones(model, stage)`` (logged per module, as prismatic-vlms does) and the
optimizer's parameter groups: LLM, vision tower, projector, norm layer, each with its own
learning rate, so the YAML's ``optim.lr*`` keys are exactly what the optimizer carries.
"""

from __future__ import annotations

import logging


from llava_norm.config import OptimConfig
from llava_norm.model.modeling import blank_image

log = logging.getLogger(__name__)


def module_of(name: str) -> str:
    """Which of the four learning-rate groups a parameter name belongs to."""
    if ".vision_tower." in f".{name}":
        return "vision_tower"
    if ".multi_modal_projector.norm." in f".{name}":
        return "norm"
    if ".multi_modal_projector." in f".{name}":
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


def learning_rates(optim: OptimConfig) -> dict[str, float]:
    projector = optim.lr_projector if optim.lr_projector is not None else optim.lr
    return {
        "llm": optim.lr,
        "vision_tower": optim.lr_vision_tower,
        "projector": projector,
        "norm": optim.lr_norm if optim.lr_norm is not None else projector,
    }


def parameter_groups(model, optim: OptimConfig) -> list[dict]:
    """One optimizer group per module (and per decay/no-decay), each named for logging."""
    rates = learning_rates(optim)
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
