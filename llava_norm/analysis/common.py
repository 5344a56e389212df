"""Shared plumbing of the diagnostics: device and dtype, loading any checkpoint dir, writing results.

Owns the conventions every analysis follows: bf16 on a GPU and fp32 on CPU; a model directory
may be a saved bundle (``<run>/model``) or a Trainer ``checkpoint-N`` dir, which holds weights and
config but no tokenizer or image processor (those are taken from the run's ``model/`` dir or
rebuilt from the run's ``config.yaml``); a model's prompts are built with its training run's
prompt settings, read as evaluation reads them; each analysis writes ``<out>/<kind>.json`` and
``<out>/<kind>.png``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from llava_norm.data.prompts import PromptSettings, training_prompt_settings
from llava_norm.files import write_atomically
from llava_norm.layout import CONFIG_FILE, MODEL_DIR
from llava_norm.config_schema import is_hub_id, resolve_dtype
from llava_norm.model.builder import Bundle, load_bundle, load_tokenizer, torch_dtype
from llava_norm.provenance import make_record
from llava_norm.saved_model import check_model_kind


def analysis_device(device: str | None = None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def analysis_dtype(device: torch.device) -> str:
    """bf16 on an accelerator (what the models train in), fp32 on CPU (bf16 matmuls there are slow)."""
    return resolve_dtype("auto", device)


@dataclass
class Labeled:
    """A model directory with the label it gets in tables and legends."""

    label: str
    path: Path


def parse_labeled(specs: list[str]) -> list[Labeled]:
    """``LABEL=PATH`` or plain ``PATH``, labelled by the path's last two parts (``stage2/model``),
    or by as many more as tell the plain paths apart (``none/stage2/model``). Two models under one
    label are refused: their rows and bars could not be told apart."""
    given = [(label, Path(path)) if sep else (None, Path(spec))
             for spec in specs for label, sep, path in [spec.partition("=")]]
    plain = {path for label, path in given if label is None}
    parts = 2
    while parts < max((len(p.parts) for p in plain), default=0) and len({p.parts[-parts:] for p in plain}) < len(plain):
        parts += 1
    out = [Labeled("/".join(path.parts[-parts:]) if label is None else label, path) for label, path in given]
    seen = {}
    for item in out:
        if seen.setdefault(item.label, item.path) != item.path:
            raise ValueError(f"two models under the label {item.label!r}: {seen[item.label]} and {item.path}; "
                             "name them with LABEL=PATH")
    return out


def prompt_settings(path: str | Path | None, prompt_format: str | None = None) -> PromptSettings:
    """The prompt settings of the model dir's training run, exactly as ``llava-norm eval`` reads
    them (the training defaults for a fresh build, ``path`` None); ``prompt_format`` overrides the
    format, as eval's ``--prompt-format`` does."""
    settings = training_prompt_settings(path) if path is not None else PromptSettings()
    if prompt_format:
        settings.prompt_format = prompt_format
    return settings


def saved_model_config(path: str | Path) -> dict:
    """The ``config.json`` of a saved model dir or a ``checkpoint-N`` dir; FileNotFoundError naming
    the folder where there is none."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such folder (from {Path.cwd()}); expected a saved model dir, RUN/{MODEL_DIR}, "
                                "or a checkpoint-N dir")
    if not (path / "config.json").is_file() and (path / MODEL_DIR / "config.json").is_file():
        raise FileNotFoundError(f"{path} is a training run's folder: give its model, {path / MODEL_DIR}, or one of "
                                "its checkpoint-N dirs")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json; expected a saved model dir or a checkpoint-N dir")
    check_model_kind(path)  # a backbone's config.json has no text_config, no norm layer
    return json.loads((path / "config.json").read_text())


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer_config.json").is_file()


def load_analysis_bundle(path: str | Path, device: torch.device | None = None, attn_implementation: str = "sdpa"):
    """A Bundle from a saved model dir or a ``checkpoint-N`` dir, moved to the device in eval mode."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer


    path = Path(path)
    device = device or analysis_device()
    dtype = analysis_dtype(device)
    saved_model_config(path)
    if _has_tokenizer(path):
        bundle = load_bundle(path, dtype=dtype, attn_implementation=attn_implementation)
    else:
        if not any(path.glob("model*.safetensors")):
            raise FileNotFoundError(
                f"{path}: no model*.safetensors (a ZeRO-3 checkpoint saved without "
                "stage3_gather_16bit_weights_on_model_save holds only DeepSpeed shards)"
            )
        model = AutoModelForImageTextToText.from_pretrained(
            path, dtype=torch_dtype(dtype), attn_implementation=attn_implementation
        )
        run_dir = path.parent
        if _has_tokenizer(run_dir / MODEL_DIR):
            tokenizer = AutoTokenizer.from_pretrained(run_dir / MODEL_DIR)
            tokenizer.padding_side = "right"
            processor = AutoImageProcessor.from_pretrained(run_dir / MODEL_DIR)
        elif (run_dir / CONFIG_FILE).is_file():
            from omegaconf import OmegaConf

            run = OmegaConf.load(run_dir / CONFIG_FILE)
            tokenizer = load_tokenizer(run.model.llm, bool(run.model.get("trust_remote_code", False)))
            processor = AutoImageProcessor.from_pretrained(run.model.vision_tower)
        else:
            raise FileNotFoundError(
                f"{path}: checkpoint dir without a tokenizer, and neither {run_dir / MODEL_DIR} nor "
                f"{run_dir / CONFIG_FILE} exists to take one from"
            )
        bundle = Bundle(model=model, tokenizer=tokenizer, image_processor=processor)
    bundle.model.to(device).eval()
    return bundle


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def finite(value: float) -> float | None:
    """JSON has no NaN/inf; such values are written as null."""
    return value if math.isfinite(value) else None


def labeled_inputs(models: list[Labeled]) -> dict[str, Path]:
    """label -> path for a provenance record; a label given twice keeps both inputs (``label #2``)."""
    out: dict[str, Path] = {}
    for model in models:
        key, n = model.label, 1
        while key in out:
            n += 1
            key = f"{model.label} #{n}"
        out[key] = model.path
    return out


def write_result(result: dict, out_dir: str | Path | None, figure, inputs: dict | None = None) -> dict:
    """Save ``<kind>.json`` and the matplotlib figure as ``<kind>.png``; returns the result with its paths.

    The JSON carries a provenance record (``llava_norm.provenance``): the fingerprints of
    ``inputs`` (label -> checkpoint, run, image or sample path, or a backbone's hub id; names that
    are neither, such as backbones built in memory, are left out), the code and library versions,
    and the date."""
    import matplotlib.pyplot as plt

    if out_dir is None:
        plt.close(figure)
        return result
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kind = result["analysis"]
    figure.savefig(out / f"{kind}.png", dpi=120, bbox_inches="tight")
    plt.close(figure)
    result["figure"] = f"{kind}.png"
    paths = {label: path for label, path in (inputs or {}).items()
             if path and (Path(path).exists() or is_hub_id(str(path)))}  # a hub id by its revision
    record = make_record(f"analysis:{kind}", {}, paths)
    record.complete = True  # written with the result it describes
    result["provenance"] = asdict(record)
    write_atomically(out / f"{kind}.json", json.dumps(result, indent=2))  # whole: the report reads it
    return result
