"""LoRA adapters (peft) on a LlavaNorm model: targets, injection, the on-disk layout, merging.

Owns which modules get adapters, injecting them *into* the LlavaNorm model (peft's
``inject_adapter_in_model``, so the model keeps its class and the Trainer, DeepSpeed and our
atomic checkpoints treat it exactly like full training), and the layout of a LoRA run's final
``model/`` directory:

- ``config.json`` + ``model.safetensors``: the complete LlavaNorm model *without* the LoRA
  deltas, in the normal save format: frozen LLM weights, the trained projector and norm layer,
  and the vision tower (trained in full, or frozen);
- ``adapter_config.json`` + ``adapter_model.safetensors``: the LoRA adapter in peft's format
  (keys ``base_model.model.<module>.lora_{A,B}.weight``);
- tokenizer and image processor files.

The directory is self-contained. transformers' Auto classes load it with the adapter applied
(unmerged: they detect ``adapter_config.json`` next to ``config.json``); ``load_bundle`` merges
by default, and ``llava-norm merge-lora`` writes a plain merged model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from peft import LoraConfig
from peft.functional import get_peft_model_state_dict, inject_adapter_in_model
from peft.tuners.tuners_utils import BaseTunerLayer
from safetensors.torch import load_file, save_file
from transformers.utils import SAFE_WEIGHTS_NAME

from llava_norm.config_checks import lora_target_problem

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_NAME = "default"
PEFT_PREFIX = "base_model.model."  # what PeftModel and transformers' load_adapter expect
LLM_PREFIX = "model.language_model."
VISION_PREFIX = "model.vision_tower."
log = logging.getLogger(__name__)


def is_lora_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def is_lora_parameter(name: str) -> bool:
    """Adapter weights: ``...q_proj.lora_A.default.weight`` (and peft's other ``lora_*`` tensors)."""
    return ".lora_" in name


def _linear_names(model, prefix: str) -> list[str]:
    return [n for n, m in model.named_modules() if n.startswith(prefix) and isinstance(m, torch.nn.Linear)]


def lora_targets(model, target_modules: list[str] | None = None, lm_head: bool = False,
                 vision: bool = False, vision_unused: set[str] = frozenset()) -> list[str]:
    """Full module names to adapt: the LLM's linear layers (or those ending in ``target_modules``),
    ``lm_head`` if asked, and with ``vision`` the vision tower's linear layers whose weights the
    feature layer reaches (``vision_unused`` holds parameter names that get no gradient). Never the
    projector: it trains in full."""
    llm = _linear_names(model, LLM_PREFIX)
    problem = lora_target_problem(target_modules, lm_head, model.config.tie_word_embeddings, llm)
    if problem:
        raise ValueError(problem)
    chosen = llm if target_modules is None else []
    for suffix in target_modules or []:
        chosen += [n for n in llm if (n == suffix or n.endswith(f".{suffix}")) and n not in chosen]
    if lm_head:
        chosen.append("lm_head")
    if vision:
        chosen += [n for n in _linear_names(model, VISION_PREFIX) if f"{n}.weight" not in vision_unused]
    return chosen


def apply_lora(model, targets: list[str], rank: int, alpha: float, dropout: float) -> LoraConfig:
    """Inject LoRA layers in place (B = 0, so the model's outputs are unchanged at step 0)."""
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")
    inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    log.info("LoRA r=%d alpha=%g dropout=%g on %d modules", rank, alpha, dropout, len(targets))
    return config


def base_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model without adapters: drop ``lora_*`` tensors, un-nest ``<module>.base_layer.*``."""
    return {k.replace(".base_layer.", "."): v for k, v in state.items() if not is_lora_parameter(k)}


def split_saved_model(model_dir: str | Path, model) -> None:
    """Rewrite a model dir saved from a LoRA-injected model into the layout above.

    ``model`` is the (unwrapped) injected model: it carries the peft config; the tensors come
    from the saved file, so this also holds after a ZeRO-3 save that gathered the shards.
    """
    model_dir = Path(model_dir)
    weights = model_dir / SAFE_WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: expected one safetensors file from the final save")
    state = load_file(str(weights))
    adapter = get_peft_model_state_dict(model, state_dict=state, adapter_name=ADAPTER_NAME,
                                        save_embedding_layers=False)
    if not adapter:
        raise ValueError(f"{weights}: no LoRA tensors found; was the adapter injected before training?")
    peft_config = model.peft_config[ADAPTER_NAME]
    peft_config.base_model_name_or_path = None  # the base is this directory itself
    peft_config.save_pretrained(str(model_dir))
    save_file({PEFT_PREFIX + k: v.contiguous() for k, v in adapter.items()}, str(model_dir / ADAPTER_WEIGHTS))
    save_file({k: v.contiguous() for k, v in base_state(state).items()}, str(weights), metadata={"format": "pt"})


@torch.no_grad()
def merge_lora(model):
    """Fold every LoRA layer into its base layer, in place, and drop the adapter bookkeeping,
    so ``save_pretrained`` writes a plain model. Returns the model."""
    tuned = [(n, m) for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)]
    if not tuned:
        raise ValueError("merge_lora: the model has no LoRA layers")
    for name, module in tuned:
        module.merge(safe_merge=True)  # safe_merge: fail on NaN/inf instead of writing them
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, module.get_base_layer())
    # transformers' PEFT integration (which loaded the adapter) leaves two marks that would make
    # save_pretrained write adapter-only, with "base_model.model." key renames: clear both, so the
    # merged model saves like a freshly built one.
    model._hf_peft_config_loaded = False
    for attribute in ("peft_config", "_weight_conversions"):
        if attribute in model.__dict__:
            delattr(model, attribute)
    return model
