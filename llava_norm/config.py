"""Typed run configuration: dataclasses, YAML with inheritance, dotted command-line overrides.

Owns the schema of every YAML under ``configs/`` and its validation. ``load_config`` merges
``base:`` parents (paths relative to the child file), then the child, then ``key=value``
overrides, through OmegaConf structured configs, so an unknown key or a wrong type stops the
run before any model loads with a message that names the key. Paths are checked the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    pass


@dataclass
class ModelConfig:
    vision_tower: str = MISSING  # hub id or local dir
    llm: str = MISSING
    norm_alignment: str = "none"  # none | ln_default | ln_textnorm | ln_textnorm_gwc
    projector_type: str = "mlp2x_gelu"  # mlp2x_gelu | linear
    vision_feature_layer: int = -2
    vision_feature_select_strategy: Optional[str] = None  # default (drop CLS) | full | null: from the tower
    gwc_clamp: float = 1e-6
    attn_implementation: str = "sdpa"  # sdpa | flash_attention_2 | eager
    trust_remote_code: bool = False
    pretrained_projector: Optional[str] = None  # stage 2: projector.safetensors written by stage 1


@dataclass
class DataSource:
    path: str = MISSING  # LLaVA-format .json or .jsonl
    image_folder: Optional[str] = None
    take: str = "all"  # all | first:N | first:P%


@dataclass
class DataConfig:
    mixture: list[DataSource] = field(default_factory=list)
    prompt_format: str = "chat"  # plain (stage 1) | chat (the tokenizer's own chat template)
    template_kwargs: dict[str, str] = field(default_factory=lambda: {"date_string": "26 Jul 2024"})
    system_prompt: Optional[str] = None
    image_aspect: str = "resize"  # resize | pad (LLaVA-1.5 pad-to-square)
    max_length: int = 2048
    on_bad_sample: str = "skip"  # skip | error
    group_by_modality_length: bool = True
    length_estimate: str = "tokens"  # what the grouped sampler sorts by: tokens | words (see data.dataset)
    num_workers: int = 2


@dataclass
class OptimConfig:
    lr: float = 1e-5  # the LLM's
    lr_vision_tower: float = 2e-6
    lr_projector: Optional[float] = None  # null: same as lr
    lr_norm: Optional[float] = None  # null: same as the projector
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    scheduler: str = "cosine"
    max_grad_norm: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    # LoRA adapters (LLM and, if adapted, vision tower). LLaVA-1.5 uses 2e-4; users have found
    # >1e-4 unstable in some setups, so lower it first if the loss spikes.
    lr_lora: float = 2e-4


@dataclass
class TrainConfig:
    stage: int = 1  # 1: projector (+norm) only; 2: full model
    train_vision_tower: bool = True  # stage 2 only
    output_dir: str = MISSING
    seed: int = 42
    epochs: float = 1.0
    max_steps: int = -1
    per_device_batch_size: int = 2
    grad_accum: int = 2
    # If set, grad_accum is derived at launch: global / (per_device_batch_size x world size).
    global_batch_size: Optional[int] = None
    gradient_checkpointing: bool = False
    precision: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32
    deepspeed: Optional[str] = None  # path to a DeepSpeed JSON (configs/deepspeed/zero{2,3}.json)
    save_steps: int = 500
    save_total_limit: int = 2
    resume: str = "auto"  # auto | none | a checkpoint dir
    logging_steps: int = 1
    norm_stats_steps: int = 50
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    run_name: Optional[str] = None


@dataclass
class LoraSettings:
    """Stage 2 with LoRA adapters on the LLM (peft); projector and norm layer stay fully trainable."""

    enabled: bool = False
    rank: int = 128  # LLaVA-1.5's LoRA recipe: r 128, alpha 256
    alpha: float = 256.0
    dropout: float = 0.05
    # Module-name suffixes inside the LLM (peft semantics, e.g. [q_proj, v_proj]); null: every linear layer.
    target_modules: Optional[list[str]] = None
    lm_head: bool = False  # also adapt the output projection
    # frozen | full | lora; null: full if train.train_vision_tower else frozen.
    vision_tower: Optional[str] = None


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    lora: LoraSettings = field(default_factory=LoraSettings)


CHOICES = {
    "model.norm_alignment": ("none", "ln_default", "ln_textnorm", "ln_textnorm_gwc"),
    "model.projector_type": ("mlp2x_gelu", "linear"),
    "model.attn_implementation": ("sdpa", "flash_attention_2", "eager"),
    "data.prompt_format": ("plain", "chat"),
    "data.image_aspect": ("resize", "pad"),
    "data.on_bad_sample": ("skip", "error"),
    "data.length_estimate": ("tokens", "words"),
    "optim.scheduler": ("cosine", "linear", "constant_with_warmup"),
    "train.precision": ("auto", "bf16", "fp32"),
}


def _read_yaml_chain(path: Path, seen: tuple[Path, ...] = ()) -> list:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: circular 'base:' chain")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    node = OmegaConf.load(path)
    bases = node.pop("base", None) or []
    bases = [bases] if isinstance(bases, str) else list(bases)
    chain = []
    for base in bases:
        chain += _read_yaml_chain(path.parent / base, seen + (path,))
    return chain + [(path, node)]


def load_config(path: str | Path, overrides: list[str] = (), check_paths: bool = True) -> RunConfig:
    merged = OmegaConf.structured(RunConfig)
    for source, node in _read_yaml_chain(Path(path)):
        try:
            merged = OmegaConf.merge(merged, node)
        except OmegaConfBaseException as error:
            raise ConfigError(f"{source}: {_describe(error)}") from None
    try:
        try:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        except TypeError:  # omegaconf's message for "list.0.key=..." is unhelpful
            raise ConfigError(f"overrides {list(overrides)}: a list (e.g. data.mixture) can only be replaced "
                              "whole, e.g. 'data.mixture=[{path: a.json}]'") from None
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(f"{path}: required key(s) not set: {', '.join(missing)}")
        config: RunConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        raise ConfigError(f"{path} (with overrides {list(overrides)}): {_describe(error)}") from None
    validate(config, check_paths)
    return config


def _describe(error: OmegaConfBaseException) -> str:
    key = getattr(error, "full_key", None)
    message = str(error).splitlines()[0]
    return f"key '{key}': {message}" if key else message


def validate(config: RunConfig, check_paths: bool = True) -> None:
    tree = OmegaConf.structured(config)
    for dotted, allowed in CHOICES.items():
        value = OmegaConf.select(tree, dotted)
        if value not in allowed:
            raise ConfigError(f"key '{dotted}': {value!r} is not one of {list(allowed)}")
    if config.train.stage not in (1, 2):
        raise ConfigError(f"key 'train.stage': must be 1 or 2, got {config.train.stage}")
    if not config.data.mixture:
        raise ConfigError("key 'data.mixture': list at least one data file")
    for i, source in enumerate(config.data.mixture):
        parse_take(source.take, f"data.mixture[{i}].take")
    if config.lora.enabled:
        _validate_lora(config)
    if not check_paths:
        return
    for i, source in enumerate(config.data.mixture):
        _must_exist(source.path, f"data.mixture[{i}].path")
        if source.image_folder:
            _must_exist(source.image_folder, f"data.mixture[{i}].image_folder")
    for key in ("vision_tower", "llm"):
        value = getattr(config.model, key)
        if _looks_local(value):
            _must_exist(value, f"model.{key}")
    if config.model.pretrained_projector:
        _must_exist(config.model.pretrained_projector, "model.pretrained_projector")
    if config.train.deepspeed:
        _must_exist(config.train.deepspeed, "train.deepspeed")


LORA_VISION_MODES = ("frozen", "full", "lora")


def _validate_lora(config: RunConfig) -> None:
    lora = config.lora
    if config.train.stage != 2:
        raise ConfigError(f"key 'lora.enabled': LoRA applies to stage 2 only, but train.stage is {config.train.stage}")
    if lora.rank < 1:
        raise ConfigError(f"key 'lora.rank': must be a positive integer, got {lora.rank}")
    if lora.alpha <= 0:
        raise ConfigError(f"key 'lora.alpha': must be positive, got {lora.alpha}")
    if not 0 <= lora.dropout < 1:
        raise ConfigError(f"key 'lora.dropout': must be in [0, 1), got {lora.dropout}")
    if lora.target_modules is not None and not lora.target_modules:
        raise ConfigError("key 'lora.target_modules': empty list; use null for every linear layer of the LLM")
    if lora.vision_tower is not None and lora.vision_tower not in LORA_VISION_MODES:
        raise ConfigError(f"key 'lora.vision_tower': {lora.vision_tower!r} is not one of {list(LORA_VISION_MODES)}")
    if lora.vision_tower in ("full", "lora") and not config.train.train_vision_tower:
        raise ConfigError(f"key 'lora.vision_tower': {lora.vision_tower!r} trains the vision tower, "
                          "but train.train_vision_tower is false")
    if config.optim.lr_lora <= 0:
        raise ConfigError(f"key 'optim.lr_lora': must be positive, got {config.optim.lr_lora}")


def lora_vision_mode(config: RunConfig) -> str:
    """frozen | full | lora: ``lora.vision_tower``, or what ``train.train_vision_tower`` implies."""
    if config.lora.vision_tower is not None:
        return config.lora.vision_tower
    return "full" if config.train.train_vision_tower else "frozen"


def effective_grad_accum(train: TrainConfig, world_size: int) -> int:
    """The accumulation that gives ``global_batch_size`` on this many processes (or ``grad_accum``)."""
    if train.global_batch_size is None:
        return train.grad_accum
    per_step = train.per_device_batch_size * world_size
    if train.global_batch_size % per_step:
        raise ConfigError(
            f"key 'train.global_batch_size': {train.global_batch_size} is not a multiple of per_device_batch_size "
            f"{train.per_device_batch_size} x {world_size} processes"
        )
    return train.global_batch_size // per_step


def _looks_local(value: str) -> bool:
    # A hub id is "org/name"; anything absolute, relative with ./, or existing locally is a path.
    return value.startswith(("/", ".", "~")) or Path(value).exists() or value.count("/") != 1


def _must_exist(path: str, key: str) -> None:
    if not Path(path).expanduser().exists():
        raise ConfigError(f"key '{key}': path does not exist: {path}")


def parse_take(take: str, key: str) -> tuple[str, float]:
    """'all' -> ('all', 0); 'first:N' -> ('count', N); 'first:P%' -> ('percent', P)."""
    if take == "all":
        return "all", 0
    if take.startswith("first:"):
        amount = take[len("first:"):]
        try:
            if amount.endswith("%"):
                value = float(amount[:-1])
                if 0 < value <= 100:
                    return "percent", value
            elif int(amount) > 0:
                return "count", int(amount)
        except ValueError:
            pass
    raise ConfigError(f"key '{key}': {take!r} is not 'all', 'first:N' or 'first:P%'")


def to_yaml(config: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))
