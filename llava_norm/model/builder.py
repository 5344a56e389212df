"""Assemble a LlavaNorm model from a vision-tower id and an LLM id (hub ids or local dirs).

Owns the one place where backbones are loaded and glued: tokenizer + ``<image>`` token,
text-norm target T (measured before any embedding resize), the vision feature selection
defaults, the freshly initialised projector, and saving/loading the whole bundle
(model + tokenizer + image processor) in one directory.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoTokenizer,
)

from llava_norm.data.conversation import IMAGE_PLACEHOLDER
from llava_norm.data.prompts import run_config_file
from llava_norm.layout import CONFIG_FILE, MODEL_DIR
from llava_norm.model.lora import is_lora_dir, merge_lora
from llava_norm.model.modeling import LlavaNormConfig, LlavaNormForConditionalGeneration, blank_image
from llava_norm.model.norm_align import get_arm, text_embedding_norm
from llava_norm.model.projector import NormAlignedProjector
from llava_norm.saved_model import check_model_kind

log = logging.getLogger(__name__)


@dataclass
class ModelSpec:
    """What to build; mirrors the ``model:`` section of the YAML configs."""

    vision_tower: str
    llm: str
    norm_alignment: str = "none"
    projector_type: str = "mlp2x_gelu"
    vision_feature_layer: int = -2
    # "default" drops a CLS token, "full" keeps every token; None: decided from the tower's output.
    vision_feature_select_strategy: str | None = None
    gwc_clamp: float = 1e-6
    scale_value: float | str = "auto"  # scale_fixed / scale_learned: c, or "auto" (calibrated at stage 1)
    attn_implementation: str = "sdpa"
    dtype: str = "float32"
    trust_remote_code: bool = False
    seed: int = 42


@dataclass
class Bundle:
    """A model with the tokenizer and image processor it was built or saved with."""

    model: LlavaNormForConditionalGeneration
    tokenizer: object
    image_processor: object

    def save(self, out_dir: str | Path) -> None:
        self.model.save_pretrained(out_dir, safe_serialization=True)
        self.tokenizer.save_pretrained(out_dir)
        self.image_processor.save_pretrained(out_dir)


def torch_dtype(name: str) -> torch.dtype:
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"dtype must be one of {sorted(dtypes)}, got {name!r}")
    return dtypes[name]


def load_tokenizer(llm: str, trust_remote_code: bool = False):
    """The LLM's tokenizer with ``<image>`` added and a pad token that is never a real eos."""
    tokenizer = AutoTokenizer.from_pretrained(llm, trust_remote_code=trust_remote_code)
    if IMAGE_PLACEHOLDER not in tokenizer.get_vocab():
        tokenizer.add_tokens([IMAGE_PLACEHOLDER], special_tokens=True)
    if tokenizer.pad_token is None:
        # Llama-3 ships no pad token; its reserved right-pad token exists for exactly this.
        candidates = [t for t in ("<|finetune_right_pad_id|>", "<|end_of_text|>") if t in tokenizer.get_vocab()]
        tokenizer.pad_token = candidates[0] if candidates else tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def load_vision_tower(vision: str, dtype: torch.dtype, trust_remote_code: bool = False):
    """Loads the vision half of a dual encoder (SigLIP, CLIP) or a plain vision model."""
    config = AutoConfig.from_pretrained(vision, trust_remote_code=trust_remote_code)
    vision_config = getattr(config, "vision_config", config)
    tower = AutoModel.from_pretrained(vision, config=vision_config, dtype=dtype, trust_remote_code=trust_remote_code)
    processor = AutoImageProcessor.from_pretrained(vision, trust_remote_code=trust_remote_code)
    return tower, processor


@torch.no_grad()
def tower_layout(tower) -> tuple[int, int]:
    """(tokens the tower emits per image, patch tokens per image), measured with one blank image."""
    cfg = tower.config
    emitted = tower(pixel_values=blank_image(tower)).last_hidden_state.shape[1]
    return emitted, (cfg.image_size // cfg.patch_size) ** 2


def select_strategy(tower, requested: str | None) -> tuple[str, int]:
    """Feature strategy and tokens per image; a tower without a CLS token keeps every patch."""
    emitted, patches = tower_layout(tower)
    has_cls = emitted == patches + 1
    strategy = requested or ("default" if has_cls else "full")
    if strategy == "default" and not has_cls:
        raise ValueError(
            f"vision_feature_select_strategy 'default' drops a CLS token, but this tower emits {emitted} tokens "
            f"for {patches} patches (no CLS); use 'full'"
        )
    return strategy, emitted - 1 if strategy == "default" else emitted


def llava_norm_config(spec, vision_config, text_config, image_token_id: int, tokens_per_image: int, strategy: str,
                      text_norm: float) -> LlavaNormConfig:
    """The composite config of a ``ModelSpec`` (or the YAML's ``model:`` section, which has the same
    keys) over the two backbones' configs: the one place both the builder and the plan make it."""
    return LlavaNormConfig(
        vision_config=vision_config, text_config=text_config, image_token_id=image_token_id,
        image_seq_length=tokens_per_image, vision_feature_layer=spec.vision_feature_layer,
        vision_feature_select_strategy=strategy, norm_alignment=spec.norm_alignment, text_norm=text_norm,
        gwc_clamp=spec.gwc_clamp, projector_type=spec.projector_type, scale_value=spec.scale_value,
        tie_word_embeddings=text_config.tie_word_embeddings,
    )


def build_model(spec: ModelSpec) -> Bundle:
    """Pretrained vision tower + pretrained LLM + new projector (with the arm's norm layer)."""
    get_arm(spec.norm_alignment)
    dtype = torch_dtype(spec.dtype)
    tokenizer = load_tokenizer(spec.llm, spec.trust_remote_code)
    llm = AutoModelForCausalLM.from_pretrained(
        spec.llm, dtype=dtype, attn_implementation=spec.attn_implementation,
        trust_remote_code=spec.trust_remote_code,
    )
    tower, image_processor = load_vision_tower(spec.vision_tower, dtype, spec.trust_remote_code)
    strategy, tokens_per_image = select_strategy(tower, spec.vision_feature_select_strategy)

    text_norm = text_embedding_norm(llm.get_input_embeddings().weight)  # before the <image> row exists
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER)
    old_rows = llm.get_input_embeddings().num_embeddings
    if image_token_id >= old_rows:
        # Zero rows, like Qwen's padding: <image> is never an input embedding (features replace it)
        # nor a label, and zero rows keep builds bit-reproducible and T unchanged.
        llm.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64, mean_resizing=False)
        with torch.no_grad():
            llm.get_input_embeddings().weight[old_rows:] = 0
            if not llm.config.tie_word_embeddings:
                llm.get_output_embeddings().weight[old_rows:] = 0

    config = llava_norm_config(spec, tower.config, llm.config, image_token_id, tokens_per_image, strategy, text_norm)
    config._attn_implementation = spec.attn_implementation
    # Build the shell on the meta device: the backbones already hold their weights, so
    # initialising a second random copy of a 7B LLM would cost minutes and twice the memory.
    with torch.device("meta"):
        model = LlavaNormForConditionalGeneration(config)
    model.model.vision_tower = tower
    model.model.language_model = llm.get_decoder()
    model.lm_head = llm.get_output_embeddings()
    torch.manual_seed(spec.seed)
    # torch's default Linear init, as LLaVA-1.5 builds its projector.
    model.model.multi_modal_projector = NormAlignedProjector(config).to(dtype)
    model.generation_config = llm.generation_config
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return Bundle(model=model, tokenizer=tokenizer, image_processor=image_processor)


def load_bundle(path: str | Path, dtype: str = "float32", attn_implementation: str = "sdpa",
                trust_remote_code: bool = False, merge_lora_adapter: bool = True) -> Bundle:
    """Load a saved LlavaNorm directory through the Auto classes (no remote code needed).

    A LoRA run's ``model/`` dir (``adapter_config.json`` beside ``config.json``, see
    ``llava_norm.model.lora``) loads with its adapter, merged unless ``merge_lora_adapter`` is False.
    """
    check_model_kind(path)  # a backbone: named, before transformers' own error
    # transformers applies an adapter that sits next to config.json by itself (unmerged).
    model = AutoModelForImageTextToText.from_pretrained(
        path, dtype=torch_dtype(dtype), attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )
    if not isinstance(model, LlavaNormForConditionalGeneration):
        raise ValueError(f"{path} holds a {type(model).__name__}, not a llava_norm checkpoint")
    if is_lora_dir(path) and merge_lora_adapter:
        merge_lora(model)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "right"
    image_processor = AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    return Bundle(model=model, tokenizer=tokenizer, image_processor=image_processor)


def merge_lora_dir(in_dir: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write a LoRA run's model dir (or its run dir) as one merged model in the normal save format,
    with the run's config.yaml beside its weights: evaluation and chat read the prompt settings it
    was trained with (chat template options, system prompt, image aspect) from there."""
    in_dir = Path(in_dir)
    if not is_lora_dir(in_dir) and is_lora_dir(in_dir / MODEL_DIR):
        in_dir = in_dir / MODEL_DIR
    if not is_lora_dir(in_dir):
        raise FileNotFoundError(f"{in_dir}: no adapter_config.json; not a LoRA model dir (nor a run dir with one)")
    out = Path(out_dir).resolve()
    lora = in_dir.resolve()
    run = lora.parent if lora.name == MODEL_DIR else lora  # the run holding the LoRA model, where it is one
    if out == lora or out in lora.parents or run in out.parents:  # the run's folder, the model's, or inside either
        raise ValueError(f"{out_dir}: write the merged model to a new directory, not over or inside the LoRA dir or "
                         "the run holding it")
    if out.is_dir() and any(out.iterdir()):  # another model's files would be mixed with this one's
        raise ValueError(f"{out_dir}: already holds files; give a new or empty directory for the merged model")
    load_bundle(in_dir, dtype=dtype).save(out_dir)
    settings = run_config_file(in_dir)
    if settings is not None:
        shutil.copyfile(settings, Path(out_dir) / CONFIG_FILE)
    return Path(out_dir)
