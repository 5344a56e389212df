"""Gradient flow through the norm-alignment layer: one batch, one backward pass per arm.

Owns measuring how much gradient reaches the projector output, the projector's linear layers
and the vision tower. With the text-norm init (every g_i = T/sqrt(d), ~0.02 for real LLMs) the
gradient through x_hat is scaled by g and vanishes; GWC divides it by s = max(mean|g|, clamp)
(METHOD.md), so at the same weights the ratio without/with GWC must equal s. Every arm is built
from the same backbones and seed, so their projector weights and forward passes match where
the arms agree. Dropout is off (eval mode) so the arms' numbers are comparable; only the norm
layer runs in training mode, since GWC acts in training only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from llava_norm.analysis.common import analysis_device, analysis_dtype, write_result
from llava_norm.analysis.plots import gradients_figure
from llava_norm.config import DataSource
from llava_norm.config_schema import NORM_ARMS
from llava_norm.data.collate import collate
from llava_norm.data.dataset import SupervisedDataset
from llava_norm.data.prompts import PromptSettings
from llava_norm.model.builder import ModelSpec, build_model

DEFAULT_ARMS = tuple(NORM_ARMS)


def training_batch(bundle, data: str | Path, image_folder: str | Path | None = None, batch_size: int = 4,
                   settings: PromptSettings | None = None) -> dict:
    """The first ``batch_size`` samples of a LLaVA json, tokenised and collated as training does,
    with ``settings`` (a checkpoint's training-run prompt settings; None: the training defaults)."""
    source = DataSource(path=str(data), image_folder=str(image_folder) if image_folder else None)
    dataset = SupervisedDataset.from_settings([source], bundle, settings or PromptSettings(), max_length=4096,
                                              length_estimate="words")  # a few samples: no token counts needed
    return collate([dataset[i] for i in range(min(batch_size, len(dataset)))], bundle.tokenizer.pad_token_id)


def _grad_norm(params) -> float | None:
    grads = [p.grad.detach().float() for p in params if p.grad is not None]
    if not grads:
        return None
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def measure_gradients(bundle, batch: dict) -> dict:
    """Loss and gradient norms of one forward/backward pass with every parameter trainable."""
    model = bundle.model
    model.eval()
    model.requires_grad_(True)
    model.zero_grad(set_to_none=True)
    projector = model.model.multi_modal_projector
    if projector.norm is not None:
        projector.norm.train()
    device = next(model.parameters()).device
    inputs = {k: v.to(device, model.dtype) if k == "pixel_values" else v.to(device)
              for k, v in batch.items() if isinstance(v, torch.Tensor)}
    captured = {}
    last_linear = projector.linear_2 if projector.linear_2 is not None else projector.linear_1

    def keep_output_grad(_module, _args, output):
        output.register_hook(lambda grad: captured.__setitem__("grad", grad.detach().float()))

    handle = last_linear.register_forward_hook(keep_output_grad)
    try:
        loss = model(**inputs).loss
        loss.backward()
    finally:
        handle.remove()
    own = list(projector.norm.parameters()) if projector.norm is not None else []
    norms = {
        "projector_output": float(captured["grad"].norm()),
        "projector_linear_1": _grad_norm(projector.linear_1.parameters()),
        "projector_linear_2": _grad_norm(projector.linear_2.parameters()) if projector.linear_2 is not None else None,
        "projector_linears": _grad_norm([p for n, p in projector.named_parameters() if not n.startswith("norm.")]),
        "vision_tower": _grad_norm(model.model.vision_tower.parameters()),
        # the alignment layer's own parameters: a gain (norm arms), a scalar (scale_learned), or none
        "norm_gain": _grad_norm(own) if own else None,
        "language_model": _grad_norm(model.model.language_model.parameters()),
    }
    stats = projector.norm.gain_statistics() if projector.norm is not None else None
    model.zero_grad(set_to_none=True)
    return {"loss": float(loss.detach()), "grad_norms": norms, "norm_alignment": model.config.norm_alignment,
            "gain": stats, "gwc_scale": projector.norm.compensation_scale()
            if getattr(projector.norm, "compensate", False) else None}


def arm_bundles(vision: str, llm: str, arms: tuple[str, ...] = DEFAULT_ARMS, seed: int = 42,
                device: str | None = None) -> Iterator[tuple[str, object]]:
    """Freshly built models, one arm at a time, from the same backbones and seed."""
    dev = analysis_device(device)
    for arm in arms:
        bundle = build_model(ModelSpec(vision, llm, norm_alignment=arm, seed=seed, dtype=analysis_dtype(dev)))
        bundle.model.to(dev)
        yield arm, bundle


def gwc_check(rows: list[dict]) -> dict | None:
    """Observed (without GWC / with GWC) gradient ratios next to the ratio METHOD.md predicts, mean|g|."""
    by_arm = {r["norm_alignment"]: r for r in rows}
    if "ln_textnorm" not in by_arm or "ln_textnorm_gwc" not in by_arm:
        return None
    plain, gwc = by_arm["ln_textnorm"], by_arm["ln_textnorm_gwc"]
    observed = {k: plain["grad_norms"][k] / gwc["grad_norms"][k]
                for k in ("projector_output", "projector_linears", "vision_tower")
                if plain["grad_norms"][k] and gwc["grad_norms"][k]}
    return {"predicted_ratio_mean_abs_g": gwc["gwc_scale"], "observed_ratio": observed,
            "note": "valid when both arms share weights (fresh builds from one seed)"}


def gradient_flow(models: Iterator[tuple[str, object]], batch_for, out_dir: str | Path | None = None,
                  inputs: dict | None = None) -> dict:
    """Gradient norms per arm/checkpoint; ``batch_for(bundle)`` makes the (shared) batch;
    ``inputs``: the checkpoints or backbones and the data read, for the provenance record."""
    rows, batch = [], None
    for label, bundle in tqdm(models, desc="gradient flow", unit="model"):
        batch = batch if batch is not None else batch_for(bundle)
        rows.append({"label": label, **measure_gradients(bundle, batch)})
        del bundle
    check = gwc_check(rows)
    result = {"analysis": "gradient_flow", "batch_size": int(batch["input_ids"].shape[0]) if batch else 0,
              "rows": rows, "gwc_check": check}
    return write_result(result, out_dir, gradients_figure(rows, check), inputs)
