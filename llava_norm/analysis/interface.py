"""Norms at the vision-language interface (paper Tables 1 and 2) and the top-norm embedding rows (App. C).

Owns: selecting the vision features exactly as the model feeds them to the projector (feature
layer, CLS drop), per-token L2 norms at each stage (vision output, projector output before the
norm layer, norm-layer output), the text-embedding target T, the norms of the prompts' text
token embeddings, and the k highest-norm rows of an input-embedding matrix with their tokens.
Works on a llava-norm checkpoint or on any vision tower id + LLM id (no projector then).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from llava_norm.analysis.common import analysis_device, analysis_dtype, finite, model_device, write_result
from llava_norm.analysis.plots import interface_figure, top_rows_figure
from llava_norm.analysis.samples import SampleSet
from llava_norm.data.images import preprocess
from llava_norm.model.builder import load_tokenizer, load_vision_tower, select_strategy, torch_dtype
from llava_norm.model.norm_align import text_embedding_norm


@dataclass
class NormStats:
    """Running mean and (population) std of per-token L2 norms, in float64."""

    total: float = 0.0
    total_sq: float = 0.0
    count: int = 0

    def add(self, vectors: torch.Tensor) -> None:
        norms = vectors.detach().double().norm(dim=-1).flatten()
        self.total += float(norms.sum())
        self.total_sq += float((norms * norms).sum())
        self.count += norms.numel()

    def summary(self) -> dict:
        if not self.count:
            return {"mean": None, "std": None, "tokens": 0}
        mean = self.total / self.count
        var = max(self.total_sq / self.count - mean * mean, 0.0)
        return {"mean": finite(mean), "std": finite(var ** 0.5), "tokens": self.count}


def select_features(tower, pixel_values: torch.Tensor, feature_layer, strategy: str) -> torch.Tensor:
    """The tower's hidden states the projector sees, selected as transformers' Llava does."""
    out = tower(pixel_values, output_hidden_states=True, return_dict=True)
    layers = [feature_layer] if isinstance(feature_layer, int) else list(feature_layer)
    picked = [out.hidden_states[layer] for layer in layers]
    if strategy == "default":  # drop the CLS token
        picked = [h[:, 1:] for h in picked]
    return torch.cat(picked, dim=-1)


def projector_pre_norm(projector, features: torch.Tensor) -> torch.Tensor:
    """The projector's output before its norm-alignment layer."""
    hidden = projector.linear_1(features)
    if projector.linear_2 is not None:
        hidden = projector.linear_2(projector.act(hidden))
    return hidden


def text_token_norms(embedding: torch.Tensor, tokenizer, prompts: list[str]) -> dict:
    stats = NormStats()
    for prompt in prompts:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        stats.add(embedding[torch.tensor(ids, device=embedding.device)])
    return stats.summary()


def _pixel_batches(images, image_processor, batch_size: int, device, dtype, desc: str):
    for start in tqdm(range(0, len(images), batch_size), desc=desc, unit="batch", leave=False):
        yield preprocess(images[start:start + batch_size], image_processor).to(device, dtype)


@torch.no_grad()
def checkpoint_interface_norms(bundle, samples: SampleSet, label: str = "model", batch_size: int = 8) -> dict:
    """One row of Table 2 for a llava-norm bundle: norms before/after projector and norm layer, T, text."""
    model = bundle.model.eval()
    cfg = model.config
    device = model_device(model)
    stages = {"vision_output": NormStats(), "projector_output": NormStats(), "norm_output": NormStats()}
    projector = model.model.multi_modal_projector
    for pixels in _pixel_batches(samples.images, bundle.image_processor, batch_size, device, model.dtype, label):
        features = select_features(model.model.vision_tower, pixels, cfg.vision_feature_layer,
                                   cfg.vision_feature_select_strategy)
        stages["vision_output"].add(features)
        pre = projector_pre_norm(projector, features)
        stages["projector_output"].add(pre)
        if projector.norm is not None:
            stages["norm_output"].add(projector.norm(pre))
    embedding = model.get_input_embeddings().weight
    row = {"label": label, "norm_alignment": cfg.norm_alignment, **{k: v.summary() for k, v in stages.items()},
           "text_norm_T": text_embedding_norm(embedding), "text_norm_T_at_build": cfg.text_norm,
           "text_tokens": text_token_norms(embedding, bundle.tokenizer, samples.prompts)}
    if projector.norm is None:
        row["norm_output"] = None
    return row


@torch.no_grad()
def backbone_interface_norms(vision: str, llm: str, samples: SampleSet, vision_feature_layer: int = -2,
                             strategy: str | None = None, batch_size: int = 8, device: str | None = None) -> dict:
    """One row of Table 1 for any vision tower id and LLM id: vision output norm, T, text tokens."""
    from transformers import AutoModelForCausalLM


    dev = analysis_device(device)
    dtype = torch_dtype(analysis_dtype(dev))
    tower, processor = load_vision_tower(vision, dtype)
    tower.to(dev).eval()
    strategy, _ = select_strategy(tower, strategy)
    stats = NormStats()
    for pixels in _pixel_batches(samples.images, processor, batch_size, dev, dtype, Path(vision).name):
        stats.add(select_features(tower, pixels, vision_feature_layer, strategy))
    del tower
    embedding = AutoModelForCausalLM.from_pretrained(llm, dtype=dtype).get_input_embeddings().weight
    tokenizer = load_tokenizer(llm)
    return {"label": f"{vision} + {llm}", "vision_feature_layer": vision_feature_layer, "strategy": strategy,
            "vision_output": stats.summary(), "projector_output": None, "norm_output": None,
            "text_norm_T": text_embedding_norm(embedding),
            "text_tokens": text_token_norms(embedding, tokenizer, samples.prompts)}


def interface_norms(rows: list[dict], samples: SampleSet, out_dir: str | Path | None = None,
                    inputs: dict | None = None) -> dict:
    """Collect rows (from the two functions above) into the Table 1/2 result and figure;
    ``inputs``: label -> the checkpoint or backbone each row read, for the provenance record."""
    result = {"analysis": "interface_norms", "images": len(samples.images), "prompts": samples.prompts,
              "source": samples.source, "rows": rows}
    return write_result(result, out_dir, interface_figure(rows), {"samples": samples.source, **(inputs or {})})


@torch.no_grad()
def top_norm_rows(embedding_weight: torch.Tensor, tokenizer, k: int = 10) -> dict:
    """The k highest-norm rows of the input-embedding matrix, decoded, next to T and the norm spread."""
    norms = embedding_weight.detach().float().norm(dim=-1)
    values, ids = norms.topk(min(k, norms.numel()))
    rows = [{"rank": r + 1, "token_id": int(i), "token": tokenizer.convert_ids_to_tokens(int(i)),
             "decoded": tokenizer.decode([int(i)]), "norm": float(v)}
            for r, (v, i) in enumerate(zip(values.tolist(), ids.tolist()))]
    nonzero = norms[norms > 0]
    return {"rows": rows, "text_norm_T": text_embedding_norm(embedding_weight),
            "median_norm": float(nonzero.median()), "max_norm": float(nonzero.max()),
            "min_nonzero_norm": float(nonzero.min()), "vocab_rows": int(norms.numel()),
            "zero_rows": int((norms == 0).sum())}


def top_norm_result(embedding_weight: torch.Tensor, tokenizer, label: str, k: int = 10,
                    out_dir: str | Path | None = None, inputs: dict | None = None) -> dict:
    """``inputs``: the checkpoint or LLM the embedding matrix was read from, for the provenance record."""
    result = {"analysis": "top_norm_rows", "label": label, "k": k, **top_norm_rows(embedding_weight, tokenizer, k)}
    return write_result(result, out_dir, top_rows_figure(result, embedding_weight), inputs)
