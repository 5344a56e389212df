"""The run configuration's schema: typed sections, allowed values and ranges, and the facts
derived from them (accumulation for a global batch, the vision tower's LoRA mode).

Owns what a key may hold; ``llava_norm.config`` owns reading YAML into it and validating it,
``llava_norm.config_checks`` what it names on this machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, OmegaConf


class ConfigError(ValueError):
    """``file``: the YAML the error is in, where that is not the config named on the command line."""

    def __init__(self, message: str, file: str | Path | None = None):
        super().__init__(message)
        self.file = file


@dataclass
class ModelConfig:
    vision_tower: str = MISSING  # hub id or local dir
    llm: str = MISSING
    norm_alignment: str = "none"  # a name in NORM_ARMS (below)
    projector_type: str = "mlp2x_gelu"  # mlp2x_gelu | linear
    vision_feature_layer: int = -2
    vision_feature_select_strategy: Optional[str] = None  # default (drop CLS) | full | null: from the tower
    gwc_clamp: float = 1e-6
    # scale_fixed / scale_learned: the factor c, a number or "auto" (T over the mean norm of the
    # projected visual tokens of a calibration batch, measured at the start of stage 1)
    scale_value: Any = "auto"
    attn_implementation: str = "sdpa"  # sdpa | flash_attention_2 | eager
    trust_remote_code: bool = False
    pretrained_projector: Optional[str] = None  # stage 2: projector.safetensors written by stage 1
    # Stage 2 refuses a projector whose recorded arm, projector type or backbones differ from this
    # config's (a mis-pointed path would silently mislabel an ablation); true accepts it anyway.
    allow_projector_mismatch: bool = False


def is_glob(path: str) -> bool:
    """Whether a data path is a glob: it holds *, ? or [ and names no existing file or folder
    (an existing path is itself, brackets and all)."""
    return any(ch in str(path) for ch in "*?[") and not Path(path).expanduser().exists()


def is_hub_id(name: str) -> bool:
    """Whether a model or data name is read as a Hugging Face hub id (``organisation/name``) rather
    than a local path: one slash, and no leading ``.``, ``/`` or ``~``."""
    return str(name).count("/") == 1 and not str(name).startswith((".", "/", "~"))


@dataclass
class DataSource:
    """One mixture entry (data.sources): ``path`` or ``hub``, never both."""
    # A LLaVA .json/.jsonl file (its images under image_folder), or parquet shards in the hub's
    # layout with images embedded: a .parquet file, a folder (searched recursively) or a glob.
    path: Optional[str] = None
    image_folder: Optional[str] = None
    hub: Optional[str] = None  # a hub dataset id (parquet layout), read from the local cache
    revision: Optional[str] = None  # a branch, tag or commit of ``hub``; null: main
    config: Optional[str] = None  # a config of ``hub``'s card; null: its default
    split: str = "train"
    take: str = "all"  # all | first:N | first:P%


# Llama-3's chat template otherwise stamps today's date into every system header, so the same
# sample would tokenise differently from day to day; this is the date the template falls back to.
# Templates ignore the keys they do not read, so one default serves every backbone.
TEMPLATE_KWARGS = {"date_string": "26 Jul 2024"}


@dataclass
class DataConfig:
    mixture: list[DataSource] = field(default_factory=list)
    prompt_format: str = "chat"  # plain (stage 1) | chat (the tokenizer's own chat template)
    # Values keep their YAML type: Qwen3's template tests `enable_thinking is false`, which a
    # str-typed dict would fail silently (false would arrive as the string "False").
    template_kwargs: dict[str, Any] = field(default_factory=lambda: dict(TEMPLATE_KWARGS))
    system_prompt: Optional[str] = None
    # front: a row's '<image>' moves to the start of its turn, then a newline, as LLaVA's
    # training code does (data/README.md); keep: where the data puts it
    image_placement: str = "front"
    image_aspect: str = "resize"  # resize | pad (LLaVA-1.5 pad-to-square)
    max_length: int = 2048
    on_bad_sample: str = "skip"  # skip | error
    group_by_modality_length: bool = True
    length_estimate: str = "tokens"  # what the grouped sampler sorts by: tokens | words (see data.dataset)
    num_workers: int = 2
    # Several samples per row, each isolated (data.packing); a row holds at most pack_max_tokens
    # tokens, and a longer sample is cut as max_length cuts (at min(max_length, pack_max_tokens)).
    # Twice the stage-2 max_length: rows of exactly max_length fill ~90% (bench/packing.py).
    # Packed runs shuffle whole rows: group_by_modality_length and length_estimate do not apply,
    # and train.per_device_batch_size / global_batch_size count rows, not samples.
    packing: bool = False
    pack_max_tokens: int = 8192


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
    adam_epsilon: float = 1e-8  # AdamW's eps, as transformers' and LLaVA's default
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
    # torch.compile each decoder layer of the LLM and each encoder layer of the vision tower
    # (llava_norm.model.compile): fuses the elementwise work between the GEMMs, the largest
    # share of an eager stage-2 step on a GPU (bench/RESULTS.md). The first step pays the compile.
    compile: bool = False
    compile_backend: str = "inductor"  # any torch._dynamo backend; aot_eager traces without code generation
    # sdpa's cuDNN kernels on CUDA, which torch picks on an H100 or H200: false (the default) keeps
    # sdpa on torch's own flash and memory-efficient kernels, null leaves torch's choice. With cuDNN,
    # some steps of the 3B trainer stalled for seconds, and run side by side on one machine the
    # steps between them were slower too (bench/RESULTS.md).
    cudnn_attention: Optional[bool] = False
    precision: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32
    # plain: transformers' loss on the full logits; fused: the same loss without the logits tensor
    # (llava_norm.model.loss), by fused_loss_kernel: torch (chunked, the fastest measured on a GPU),
    # or on CUDA liger / cce (Liger Kernel, Cut Cross-Entropy: more memory saved, more time).
    loss: str = "plain"
    fused_loss_kernel: str = "torch"
    # the torch kernel's softmax: auto (one compiled kernel per chunk on CUDA, eager fp32 blocks
    # elsewhere) | compiled (inductor, also on a CPU) | eager
    fused_loss_softmax: str = "auto"
    deepspeed: Optional[str] = None  # path to a DeepSpeed JSON (configs/deepspeed/zero{2,3}.json)
    save_steps: int = 500  # 0: no checkpoint at all, the final model only (a killed run starts over)
    save_total_limit: int = 2
    resume: str = "auto"  # auto | none | a checkpoint dir
    # A relaunch on an output_dir that already holds a run (llava_norm.train.relaunch): a finished
    # run is left as it is unless `extend` (continue to a larger max_steps/epochs) or `restart`
    # (delete its outputs, start over); a checkpoint saved under another config is refused unless
    # `allow_config_change`.
    restart: bool = False
    extend: bool = False
    allow_config_change: bool = False
    logging_steps: int = 1
    norm_stats_steps: int = 50
    # [first, last]: torch.profiler over these global steps on the main process, written to
    # output_dir/profile/ (llava_norm.train.profile)
    profile_steps: Optional[list[int]] = None
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


PROMPT_FORMATS = ("plain", "chat")  # data.conversation: bare text (stage 1), or the tokenizer's chat template
IMAGE_ASPECTS = ("resize", "pad")  # data.images: plain resize, or LLaVA-1.5 pad-to-square
IMAGE_PLACEMENTS = ("front", "keep")  # data.image_placement (data.rows says what each does)
# How the length-grouped sampler measures a row (data.dataset): "tokens" tokenises every row once, when
# the sampler first asks (batched calls; ~0.1 ms per row on one core), "words" counts whitespace words
# (free, but words per token vary between rows, so batches grouped by them carry more padding:
# bench/padding.py measures both, the README quotes its figures).
LENGTH_ESTIMATES = ("tokens", "words")


@dataclass(frozen=True)
class NormArm:
    """One row of the ablation table: what a value of ``model.norm_alignment`` builds
    (``model.norm_align.build_alignment`` turns it into a layer; the config accepts exactly
    these names). A new arm that combines existing layer kinds is one more row here; a new kind
    of layer also needs its class in ``model.norm_align`` (README, "The arms")."""

    name: str
    layer: str  # one of LAYER_KINDS
    text_norm_init: bool = False  # norm layers: gain g_i = T / sqrt(d), so a token leaves with norm ~T
    gwc: bool = False  # norm layers: Global Weight Compensation of the gradient into the projector

    @property
    def has_norm(self) -> bool:
        """Whether the projector ends in an alignment layer (every arm but ``none``)."""
        return self.layer != "none"

    @property
    def normalises(self) -> bool:
        """Whether the layer is a norm with a learned gain (LayerNorm or RMSNorm, Table 5's subject)."""
        return self.layer in ("layernorm", "rmsnorm")

    @property
    def has_tensors(self) -> bool:
        """Whether the layer holds tensors that stage 1 saves (scale_to_t has none)."""
        return self.layer not in ("none", "scale_to_t")

    @property
    def learns(self) -> bool:
        """Whether the layer has weights that train (``optim.lr_norm`` reaches it): a norm's gain
        (and LayerNorm's bias), scale_learned's scale; scale_fixed's is a frozen buffer."""
        return self.layer in ("layernorm", "rmsnorm", "scale_learned")

    @property
    def scale_calibrated(self) -> bool:
        """Whether ``model.scale_value`` (a number, or ``auto``: calibrated at stage 1) sets it."""
        return self.layer in ("scale_fixed", "scale_learned")


# none: nothing after the projector; layernorm / rmsnorm: a norm layer with a learned gain;
# scale_to_t: every token rescaled to norm T; scale_fixed: x c, c frozen; scale_learned: x s, s learned.
LAYER_KINDS = ("none", "layernorm", "rmsnorm", "scale_to_t", "scale_fixed", "scale_learned")
NORM_ARMS: dict[str, NormArm] = {
    arm.name: arm
    for arm in (
        NormArm("none", "none"),
        NormArm("ln_default", "layernorm"),
        NormArm("ln_textnorm", "layernorm", text_norm_init=True),
        NormArm("ln_textnorm_gwc", "layernorm", text_norm_init=True, gwc=True),
        NormArm("rms_textnorm", "rmsnorm", text_norm_init=True),
        NormArm("rms_textnorm_gwc", "rmsnorm", text_norm_init=True, gwc=True),
        NormArm("scale_to_t", "scale_to_t"),
        NormArm("scale_fixed", "scale_fixed"),
        NormArm("scale_learned", "scale_learned"),
    )
}
assert all(arm.layer in LAYER_KINDS for arm in NORM_ARMS.values())


# LLM families whose packed rows are isolated, as tests/test_packing.py checks: transformers
# masks their attention per sample from position ids. Others may not (a hybrid model's recurrent
# layers carry state from one sample into the next), so packing refuses them.
PACKING_LLM_TYPES = ("llama", "qwen2", "qwen3")


def packing_llm_problem(model_type: str) -> str | None:
    """Why ``data.packing`` cannot be used with an LLM of this ``model_type`` (None: it can)."""
    if model_type in PACKING_LLM_TYPES:
        return None
    return (f"key 'data.packing': the LLM is a {model_type!r} model; packed samples are only known to be "
            f"isolated for {list(PACKING_LLM_TYPES)} (tests/test_packing.py), so packing is refused for it")


def scale_value_problem(value: Any) -> str | None:
    """What is wrong with a ``model.scale_value`` (None: nothing)."""
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return f"must be 'auto' or a positive number, got {value!r}"
    return None


PROJECTOR_TYPES = ("mlp2x_gelu", "linear")  # model.projector
# Only transformers schedulers that need no extra arguments (cosine_with_min_lr,
# warmup_stable_decay, reduce_lr_on_plateau need lr_scheduler_kwargs or an eval loop).
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
              "inverse_sqrt")
CHOICES = {
    "model.norm_alignment": tuple(NORM_ARMS),
    "model.projector_type": PROJECTOR_TYPES,
    "model.attn_implementation": ("sdpa", "flash_attention_2", "eager"),
    "model.vision_feature_select_strategy": (None, "default", "full"),
    "data.prompt_format": PROMPT_FORMATS,
    "data.image_aspect": IMAGE_ASPECTS,
    "data.image_placement": IMAGE_PLACEMENTS,
    "data.on_bad_sample": ("skip", "error"),
    "data.length_estimate": LENGTH_ESTIMATES,
    "optim.scheduler": SCHEDULERS,
    "train.precision": ("auto", "bf16", "fp32"),
    "train.loss": ("plain", "fused"),
    "train.fused_loss_kernel": ("torch", "liger", "cce"),
    "train.fused_loss_softmax": ("auto", "compiled", "eager"),
}
# Ranges ("> x", ">= x" or "[low, high)"); checked here because the Trainer, DataLoader, peft or
# the norm layer would reject them only after the model has loaded, or silently accept them.
RANGES = {
    "model.gwc_clamp": "> 0", "data.max_length": ">= 1", "data.pack_max_tokens": ">= 1", "data.num_workers": ">= 0",
    "optim.lr": ">= 0", "optim.lr_vision_tower": ">= 0", "optim.lr_projector": ">= 0", "optim.lr_norm": ">= 0",
    "optim.lr_lora": "> 0", "optim.weight_decay": ">= 0", "optim.max_grad_norm": ">= 0",
    "optim.warmup_ratio": "[0, 1)",  # transformers reads a warmup >= 1 as a number of steps
    "optim.adam_beta1": "[0, 1)", "optim.adam_beta2": "[0, 1)", "optim.adam_epsilon": "> 0",
    "train.per_device_batch_size": ">= 1", "train.grad_accum": ">= 1", "train.global_batch_size": ">= 1",
    "train.save_steps": ">= 0", "train.logging_steps": ">= 1", "train.norm_stats_steps": ">= 0",
    # 0 would let checkpoint pruning delete the newest complete checkpoint, leaving nothing to resume.
    "train.save_total_limit": ">= 1",
    "lora.rank": ">= 1", "lora.alpha": "> 0", "lora.dropout": "[0, 1)",
}
LORA_VISION_MODES = ("frozen", "full", "lora")


def resolve_dtype(name: str, device) -> str:
    """A dtype setting's name for a device (a ``torch.device`` or its type): ``auto`` -> bf16 on
    an accelerator (what the models train in), fp32 on CPU (bf16 matmuls are slow there); any
    other name is returned as given."""
    if name == "auto":
        return "bfloat16" if getattr(device, "type", device) == "cuda" else "float32"
    return name


def world_size() -> int:
    """Processes in this launch: torchrun and the deepspeed launcher export WORLD_SIZE to every worker."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def lora_vision_mode(config: RunConfig) -> str:
    """frozen | full | lora: ``lora.vision_tower``, or what ``train.train_vision_tower`` implies."""
    if config.lora.vision_tower is not None:
        return config.lora.vision_tower
    return "full" if config.train.train_vision_tower else "frozen"


def effective_grad_accum(train: TrainConfig, world_size: int) -> int:
    """The accumulation that gives ``global_batch_size`` on this many processes (or ``grad_accum``)."""
    if train.global_batch_size is None:
        return train.grad_accum
    if train.global_batch_size % train.per_device_batch_size:  # on no number of processes
        raise ConfigError(f"key 'train.global_batch_size': {train.global_batch_size} is not a multiple of "
                          f"per_device_batch_size {train.per_device_batch_size}, so no number of processes splits it")
    per_step = train.per_device_batch_size * world_size
    if train.global_batch_size % per_step:
        raise ConfigError(
            f"key 'train.global_batch_size': {train.global_batch_size} is not a multiple of per_device_batch_size "
            f"{train.per_device_batch_size} x {world_size} processes; world sizes that work: "
            f"{world_sizes_that_split(train)}"
        )
    return train.global_batch_size // per_step


def world_sizes_that_split(train: TrainConfig) -> list[int]:
    """Every number of processes ``train.global_batch_size`` splits over, up to one row-batch each."""
    most = train.global_batch_size // train.per_device_batch_size
    return [w for w in range(1, most + 1) if train.global_batch_size % (train.per_device_batch_size * w) == 0]


def parse_take(take: str, key: str) -> tuple[str, float]:
    """'all' -> ('all', 0); 'first:N' -> ('count', N); 'first:P%' -> ('percent', P)."""
    if take == "all":
        return "all", 0
    if take.startswith("first:"):
        amount = take[len("first:"):]
        try:
            value = float(amount[:-1]) if amount.endswith("%") else int(amount)
        except ValueError:
            value = None
        if value is not None:
            if amount.endswith("%"):
                if 0 < value <= 100:
                    return "percent", value
                raise ConfigError(f"key '{key}': {take!r}: a share must be above 0% and at most 100%")
            if value > 0:
                return "count", value
            raise ConfigError(f"key '{key}': {take!r}: a count must be at least 1")
    raise ConfigError(f"key '{key}': {take!r} is not 'all', 'first:N' or 'first:P%'")


def take_count(total: int, take: str, key: str) -> int:
    """How many of a source's ``total`` rows (in file order) its ``take`` share uses."""
    kind, amount = parse_take(take, key)
    if kind == "count":
        return min(total, int(amount))
    if kind == "percent":
        return int(total * amount / 100)
    return total


def take_beyond_rows(take: str, total: int, key: str) -> str | None:
    """What to say of a ``first:N`` beyond a source's ``total`` rows: the run takes them all (as
    LLaVA-NeXT's loader does), which a mixture's proportions may not have meant. Nothing for a
    source without a row: what is wrong there is said apart."""
    kind, amount = parse_take(take, key)
    if kind == "count" and amount > total > 0:
        return f"key '{key}': {take!r} asks for more rows than the source's {total}: the run takes all {total}"
    return None


def take_takes_nothing(take: str, total: int, key: str) -> str:
    return f"key '{key}': {take!r} of {total} rows is no row: this source would add nothing (take more, or drop it)"


def to_yaml(config: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))
