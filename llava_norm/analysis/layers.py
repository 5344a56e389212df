"""Per-layer norms and update rates of visual vs text tokens in the LLM (Fig. 3/4) and over training (App. F).

Owns: capturing the residual stream at every LLM layer boundary (the input of layer 0, then the
output of each decoder layer; transformers' own ``hidden_states[-1]`` has the final RMSNorm
applied and so is not a residual state), and the statistics over masked tokens: mean L2 norm
per boundary, and the mean over tokens of cos(h_l, h_{l+1}) (computed per token, then
averaged), separately for image and text positions. ``dynamics`` repeats the curves over the
``checkpoint-N`` dirs of one run. Each model is prompted with its training run's prompt
settings, so its inputs are exactly the ones ``llava-norm eval`` would give it.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from llava_norm.analysis.common import (Labeled, analysis_device, finite, labeled_inputs, load_analysis_bundle,
                                        prompt_settings, write_result)
from llava_norm.analysis.masks import interleave_prompts, prompt_batches
from llava_norm.analysis.plots import dynamics_figure, layers_figure
from llava_norm.analysis.samples import SampleSet
from llava_norm.data.prompts import PromptSettings
from llava_norm.layout import MODEL_DIR
from llava_norm.train.rundir import SUMMARY, complete_checkpoints

GROUPS = ("image", "text")


class LayerAccumulator:
    """Sums over masked tokens of per-boundary norms and per-transition cosines, in float64."""

    def __init__(self):
        self.norm_sums: dict[str, torch.Tensor] = {}
        self.cos_sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {g: 0 for g in GROUPS}

    @torch.no_grad()
    def add(self, states: list[torch.Tensor], masks: dict[str, torch.Tensor]) -> None:
        """states: L+1 tensors (B, S, D) at the layer boundaries; masks: group -> (B, S) bool."""
        for group, mask in masks.items():
            picked = [h[mask].double() for h in states]  # (N, D) per boundary
            norms = torch.stack([p.norm(dim=-1).sum() for p in picked])
            cos = torch.stack([F.cosine_similarity(a, b, dim=-1, eps=1e-12).sum() for a, b in zip(picked, picked[1:])])
            self.norm_sums[group] = self.norm_sums.get(group, 0) + norms.cpu()
            self.cos_sums[group] = self.cos_sums.get(group, 0) + cos.cpu()
            self.counts[group] += int(mask.sum())

    def result(self) -> dict:
        out = {}
        for group in GROUPS:
            n = self.counts[group]
            if not n:
                out[group] = {"tokens": 0, "norm": None, "cosine": None}
                continue
            out[group] = {"tokens": n, "norm": [finite(float(v) / n) for v in self.norm_sums[group]],
                          "cosine": [finite(float(v) / n) for v in self.cos_sums[group]]}
        return out


def layer_statistics(states: list[torch.Tensor], image_mask: torch.Tensor, text_mask: torch.Tensor) -> dict:
    """Norm and cosine curves of one set of hidden states (the core of Fig. 3/4)."""
    acc = LayerAccumulator()
    acc.add(states, {"image": image_mask, "text": text_mask})
    return acc.result()


def decoder_layers(model):
    layers = getattr(model.model.language_model, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model.model.language_model).__name__} has no .layers; cannot hook the residual stream")
    return layers


@contextmanager
def residual_stream(model):
    """Yields a list that fills with the L+1 residual states of the next forward pass."""
    layers = decoder_layers(model)
    states: list[torch.Tensor] = []

    def before_first(_module, args, kwargs):
        states.append(args[0] if args else kwargs["hidden_states"])

    def after(_module, _args, output):
        states.append(output[0] if isinstance(output, tuple) else output)

    handles = [layers[0].register_forward_pre_hook(before_first, with_kwargs=True)]
    handles += [layer.register_forward_hook(after) for layer in layers]
    try:
        yield states
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def bundle_layer_curves(bundle, samples: SampleSet, batch_size: int = 8, settings: PromptSettings | None = None,
                        desc: str = "layers") -> dict:
    """Curves for one model over image prompts and text-only prompts mixed in left-padded batches,
    built with ``settings`` (the model's training-run prompt settings; None: the training defaults)."""
    model = bundle.model.eval()
    prompts = interleave_prompts(samples.images, samples.prompts)
    acc = LayerAccumulator()
    batches = prompt_batches(bundle, prompts, batch_size, settings)
    for batch in tqdm(batches, total=-(-len(prompts) // batch_size), desc=desc, unit="batch", leave=False):
        with residual_stream(model) as states:
            model(**batch.inputs, use_cache=False)
        acc.add(states, {"image": batch.image_mask, "text": batch.text_mask})
    return {"layers": len(decoder_layers(model)), **acc.result()}


def collect_curves(models: list[Labeled], samples: SampleSet, batch_size: int = 8, prompt_format: str | None = None,
                   device: str | None = None) -> list[dict]:
    """Curves of each model, loaded one at a time (a 7B model and its copy need not fit together),
    each prompted as its training run prompts (``prompt_format`` overrides the format)."""
    curves = []
    for item in tqdm(models, desc="checkpoints", unit="model"):
        bundle = load_analysis_bundle(item.path, analysis_device(device))
        settings = prompt_settings(item.path, prompt_format)
        curves.append({"label": item.label, "path": str(item.path), "prompt": asdict(settings),
                       **bundle_layer_curves(bundle, samples, batch_size, settings, desc=item.label)})
        del bundle
    return curves


def layer_curves(models: list[Labeled], samples: SampleSet, out_dir: str | Path | None = None,
                 batch_size: int = 8, prompt_format: str | None = None, device: str | None = None) -> dict:
    """Fig. 3/4: norm and cosine curves of several checkpoints/arms, overlaid in one figure."""
    curves = collect_curves(models, samples, batch_size, prompt_format, device)
    result = {"analysis": "layers", "source": samples.source, "images": len(samples.images),
              "text_only_prompts": len(samples.prompts), "text_excludes_bos": True, "curves": curves}
    return write_result(result, out_dir, layers_figure(curves),
                        {"samples": samples.source, **labeled_inputs(models)})


def run_checkpoints(run_dir: str | Path, include_final: bool = True) -> list[Labeled]:
    """``checkpoint-N`` dirs of a run (oldest first; complete ones only), then its final ``model/``,
    unless the last checkpoint is of the step the run ended at (its summary's): the final model
    is those weights again, so that checkpoint is labelled final instead of being read twice."""
    run = Path(run_dir)
    found = [Labeled(f"step {re.sub(r'^checkpoint-', '', p.name)}", p) for p in complete_checkpoints(run)]
    if include_final and (run / MODEL_DIR / "config.json").is_file():
        try:
            ended_at = json.loads((run / SUMMARY).read_text()).get("global_step")
        except (OSError, ValueError):  # no summary (or one cut short): the final model is read as well
            ended_at = None
        if found and found[-1].path.name == f"checkpoint-{ended_at}":
            found[-1] = Labeled(f"{found[-1].label} (final)", found[-1].path)
        else:
            found.append(Labeled("final", run / MODEL_DIR))
    if not found:
        hint = f"; give the training run's folder, {run.parent}" if run.name == MODEL_DIR else ""  # RUN/model given
        raise FileNotFoundError(f"{run}: no complete checkpoint-N dirs and no {MODEL_DIR}/ dir{hint}")
    return found


def dynamics(run_dir: str | Path, samples: SampleSet, out_dir: str | Path | None = None, batch_size: int = 8,
             prompt_format: str | None = None, include_final: bool = True, device: str | None = None) -> dict:
    """App. F: the cosine curves of one run at each saved checkpoint, prompted as the run's
    evaluation prompts them (a stage-1 run in the 'plain' format reads each prompt's text where its
    training samples hold the caption: see ``PromptEncoder.reading_example``)."""
    checkpoints = run_checkpoints(run_dir, include_final)
    curves = collect_curves(checkpoints, samples, batch_size, prompt_format, device)
    result = {"analysis": "dynamics", "run_dir": str(run_dir), "source": samples.source, "curves": curves}
    return write_result(result, out_dir, dynamics_figure(curves),
                        {"samples": samples.source, **labeled_inputs(checkpoints)})
