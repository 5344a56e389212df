"""The backbones' configs without their weights, and the model built from them on the meta device.

Owns where a plan's architecture facts come from: a local directory; the hub cache; the
config-only folders shipped under ``configs/backbones/<hub id>/`` (the published
``config.json`` of each backbone the shipped YAMLs name: facts, no weights, no tokenizer); or,
last, the hub. Offline, a shipped backbone therefore plans without any download. Also owns
``meta_model``: the full LlavaNorm model with every tensor on the meta device (shapes and dtypes,
no storage), built by the same config path as training, in well under a second for 8B.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, PretrainedConfig

from llava_norm.config_schema import ConfigError, ModelConfig
from llava_norm.model.builder import llava_norm_config, select_strategy
from llava_norm.model.modeling import LlavaNormForConditionalGeneration

SHIPPED_BACKBONES = Path(__file__).resolve().parents[2] / "configs" / "backbones"


@dataclass(frozen=True)
class BackboneConfig:
    config: PretrainedConfig
    source: str  # where it was read: "local dir", "hub cache", "shipped configs/backbones/...", "hub"


def backbone_config(name: str, key: str, trust_remote_code: bool = False) -> BackboneConfig:
    """The config of a backbone named by ``key`` (``model.llm`` or ``model.vision_tower``)."""
    if Path(name).is_dir():
        return BackboneConfig(_load(name, key, trust_remote_code), f"local dir {name}")
    try:
        return BackboneConfig(AutoConfig.from_pretrained(name, local_files_only=True,
                                                         trust_remote_code=trust_remote_code), "hub cache")
    except (OSError, ValueError):
        pass
    shipped = SHIPPED_BACKBONES / name
    if (shipped / "config.json").is_file():
        return BackboneConfig(_load(shipped, key, False), f"shipped {shipped.relative_to(SHIPPED_BACKBONES.parents[1])}")
    try:
        return BackboneConfig(AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code), "hub")
    except (OSError, ValueError) as error:
        said = str(error).splitlines()[0]
        # a compute node without internet: huggingface_hub retried for half a minute before saying so
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        way = (f"; HF_HUB_OFFLINE is set, so the hub was not asked: download it (hf download {name}) into the cache "
               "this machine reads (HF_HOME)") if offline else \
            (f"; without internet here, download it where there is (hf download {name}) into the cache this "
             "machine reads (HF_HOME) and set HF_HUB_OFFLINE=1") if "couldn't connect" in said else ""
        raise ConfigError(f"key '{key}': {name!r} is not a local directory, not in the hub cache, not shipped under "
                          f"{SHIPPED_BACKBONES} and the hub did not answer ({said}){way}") from None


def _load(path, key: str, trust_remote_code: bool) -> PretrainedConfig:
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise ConfigError(f"key '{key}': {path}: no readable config.json ({str(error).splitlines()[0]})") from None


def vision_part(config: PretrainedConfig) -> PretrainedConfig:
    """The vision half of a dual encoder's config (SigLIP, CLIP), or the config itself."""
    return getattr(config, "vision_config", config)


def meta_model(model: ModelConfig, attn_implementation: str | None = None, dtype: torch.dtype = torch.bfloat16,
               device: str = "meta"):
    """(LlavaNorm model on the meta device, tokens per image, sources of the two configs). Any other
    ``device`` gives the same model with real, randomly initialised tensors (what the tests hold
    the plan's trace against)."""
    vision = backbone_config(model.vision_tower, "model.vision_tower", model.trust_remote_code)
    llm = backbone_config(model.llm, "model.llm", model.trust_remote_code)
    attn = attn_implementation or model.attn_implementation
    vision_config, text_config = vision_part(vision.config), llm.config
    vision_config._attn_implementation = text_config._attn_implementation = attn
    with torch.device(device):
        tower = AutoModel.from_config(vision_config, trust_remote_code=model.trust_remote_code).to(dtype)
        strategy, tokens_per_image = select_strategy(tower, model.vision_feature_select_strategy)
        config = llava_norm_config(model, tower.config, text_config, image_token_id=0,
                                   tokens_per_image=tokens_per_image, strategy=strategy, text_norm=1.0)
        config._attn_implementation = attn
        built = LlavaNormForConditionalGeneration(config).to(dtype)
    return built, tokens_per_image, {"vision_tower": vision.source, "llm": llm.source}
