"""Local backbone folders at the real backbones' widths: the published config (configs/backbones),
random weights, and a tokenizer with the real special tokens and chat template.

Owns what ``gpu_kit.py``'s training run and ``dry_run.py`` load through ``from_pretrained`` exactly
as a hub id would be loaded: ``config.json`` + safetensors weights + tokenizer (LLMs) or image
processor (vision towers). ``layers`` truncates the depth (never the width), so a 7B LLM fits a
CPU machine's memory. The tokenizers are the demo's (byte-level BPE trained on a small built-in
corpus, the real special tokens and chat template), so their vocabulary is small; the model keeps
the real vocabulary size (rows past the tokenizer are never looked up).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from _harness import REPO_ROOT  # noqa: F401  (puts this checkout on sys.path)
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from llava_norm.plan.backbones import SHIPPED_BACKBONES, vision_part
from llava_norm_demo.tiny import builtin_corpus, make_llama3_tokenizer, make_qwen25_tokenizer

TOKENIZERS = {"llama": make_llama3_tokenizer, "qwen2": make_qwen25_tokenizer}
TOKENIZER_VOCAB = 2000


def write_backbone(hub_id: str, out_dir: str | Path, layers: int | None = None, dtype=torch.bfloat16,
                   seed: int = 0, device: str = "cpu") -> Path:
    """Write ``hub_id``'s shipped config with random weights (and a tokenizer or image processor) to
    ``out_dir``. ``device`` draws the weights there (a GPU does a 3B model's in seconds)."""
    out, source = Path(out_dir), SHIPPED_BACKBONES / hub_id
    out.mkdir(parents=True, exist_ok=True)
    config = AutoConfig.from_pretrained(source)
    torch.manual_seed(seed)
    if (source / "preprocessor_config.json").is_file():  # a vision tower: its vision half alone, as LLaVA uses
        config = vision_part(config)
        if layers:
            config.num_hidden_layers = layers
        with torch.device(device):
            model = AutoModel.from_config(config, dtype=dtype)
        shutil.copy(source / "preprocessor_config.json", out / "preprocessor_config.json")
    else:
        if config.model_type not in TOKENIZERS:
            raise ValueError(f"{hub_id}: no tokenizer recipe for model_type {config.model_type!r}")
        if layers:
            config.num_hidden_layers = layers
            if getattr(config, "max_window_layers", None):
                config.max_window_layers = min(config.max_window_layers, layers)
            if getattr(config, "layer_types", None):  # one entry per layer (Qwen2's sliding/full)
                config.layer_types = config.layer_types[:layers]
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        TOKENIZERS[config.model_type](builtin_corpus(seed), TOKENIZER_VOCAB).save_pretrained(out)
    model.save_pretrained(out, safe_serialization=True)
    return out
