"""A run's final model and projector, written after its last step, or by a relaunch from the last
step's checkpoint when a kill cut the first writing short.

Owns ``output_dir/model/`` (safetensors, JSON and tokenizer files; with LoRA the base model plus
``adapter_*`` files, layout in ``llava_norm.model.lora``) and ``output_dir/projector.safetensors``
(projector and norm layer with the run's origin as metadata, what stage 2 starts from). The same
weights give the same bytes, so a run finished from its last checkpoint equals an uninterrupted
one file for file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save
from transformers.utils import SAFE_WEIGHTS_NAME

from llava_norm.config import RunConfig
from llava_norm.config_checks import projector_origin
from llava_norm.files import write_atomically
from llava_norm.layout import MODEL_DIR, PROJECTOR_FILE, PROJECTOR_PREFIX
from llava_norm.model.builder import Bundle
from llava_norm.model.lora import split_saved_model


def save_with_sorted_metadata(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """safetensors' file, its header's metadata in sorted key order, written whole or not at all.

    Why: safetensors writes the metadata from a Rust HashMap, in an order drawn anew by each
    process, so two runs that trained identical weights wrote different bytes. The header is
    JSON after its 8-byte length and the tensors' offsets count from its end, so re-serialising
    it changes nothing else; it is padded with spaces to 8 bytes, as safetensors pads it.
    """
    data = save(tensors, metadata=metadata)
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    write_atomically(path, len(text).to_bytes(8, "little") + text + data[8 + length:])


def save_final(trainer, bundle: Bundle, config: RunConfig) -> Path:
    """Every rank calls it (ZeRO-3 gathers the shards); the main process writes."""
    out = Path(config.train.output_dir)
    model_dir = out / MODEL_DIR
    trainer.save_model(str(model_dir))  # gathers ZeRO-3 shards into safetensors
    if trainer.args.should_save:
        (model_dir / "training_args.bin").unlink(missing_ok=True)  # a pickle: never part of an exported model
        if config.lora.enabled:
            split_saved_model(model_dir, bundle.model)
        bundle.tokenizer.save_pretrained(model_dir)
        bundle.image_processor.save_pretrained(model_dir)
        state = load_file(str(model_dir / SAFE_WEIGHTS_NAME))
        save_with_sorted_metadata({k: v for k, v in state.items() if k.startswith(PROJECTOR_PREFIX)},
                                  out / PROJECTOR_FILE, projector_origin(config.model, bundle.model.config.text_norm))
    return model_dir
