"""Config checks against this machine: the files, folders, packages and model skeletons a
config names, read through headers and small JSON files only, never weights or data rows.

Owns ``check_paths``, which ``llava_norm.config.validate`` runs last, so a missing path or an
incompatible DeepSpeed file stops a run before any model or data loads, and ``check_inputs``,
the part of it that checks only the files a run reads as inputs (a reuse decision's).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
from pathlib import Path

from llava_norm.config_schema import (NORM_ARMS, ConfigError, RunConfig, effective_grad_accum, is_glob, is_hub_id,
                                      packing_llm_problem, world_size)
from llava_norm.layout import PROJECTOR_FILE, PROJECTOR_ORIGIN, PROJECTOR_PREFIX, TRAINER_STATE


def check_paths(config: RunConfig) -> None:
    """What the config names on this machine: files, directories, packages. Reads headers and
    small JSON files only, never weights or data rows. Raises the first problem found."""
    for check in PATH_CHECKS:
        check(config)


def check_inputs(config: RunConfig) -> None:
    """The files a run reads as its inputs (data, backbones, stage 1's projector, the DeepSpeed
    file: what its provenance record fingerprints), with no library imported. Raises the first
    problem found."""
    for check in INPUT_CHECKS:
        check(config)


def path_problems(config: RunConfig) -> list[str]:
    """Every problem ``check_paths`` would raise, one line each (``llava-norm check``)."""
    problems = []
    for check in PATH_CHECKS:
        try:
            check(config)
        except ConfigError as error:
            problems.append(str(error))
    return problems


def _data_paths(config: RunConfig) -> None:
    for i, source in enumerate(config.data.mixture):
        if source.hub and not source.path:  # resolved (and downloaded, when online) by the run itself
            continue
        if is_glob(source.path):  # parquet shards
            if not glob.glob(str(Path(source.path).expanduser()), recursive=True):
                raise ConfigError(f"key 'data.mixture[{i}].path': no file matches {source.path}")
        else:  # a .json/.jsonl file, or parquet: a shard or a folder of shards (data.sources reads which)
            _must_exist(source.path, f"data.mixture[{i}].path")
            found = Path(source.path).expanduser()
            if found.is_dir() and next(found.rglob("*.parquet"), None) is None:
                raise ConfigError(f"key 'data.mixture[{i}].path': the folder {source.path} holds no .parquet shards")
            if found.is_file() and found.suffix not in (".json", ".jsonl", ".parquet"):
                raise ConfigError(f"key 'data.mixture[{i}].path': {source.path} is not .json, .jsonl or .parquet")
        if source.image_folder:
            _must_exist(source.image_folder, f"data.mixture[{i}].image_folder", kind="dir")


def _backbone_dirs(config: RunConfig) -> None:
    m = config.model
    for key in ("vision_tower", "llm"):
        if _looks_local(getattr(m, key)):
            _must_exist(getattr(m, key), f"model.{key}", kind="dir")
            if not (Path(getattr(m, key)).expanduser() / "config.json").is_file():
                raise ConfigError(f"key 'model.{key}': {getattr(m, key)} has no config.json (not a model directory)")
            _backbone_kind(getattr(m, key), key)


def _backbone_kind(folder: str, key: str) -> None:
    """A vision tower where the LLM belongs, or the other way round: said from config.json (the
    plan and the model builder would fail on a missing attribute, naming no key)."""
    try:
        found = json.loads((Path(folder).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return  # for the loader to report
    if not isinstance(found, dict):
        return
    vision = "vision_config" in found or "image_size" in found
    kind = found.get("model_type", "unknown")
    if key == "vision_tower" and not vision:
        raise ConfigError(f"key 'model.vision_tower': {folder} holds a {kind} model, not a vision tower (its "
                          "config.json has neither vision_config nor image_size)")
    if key == "llm" and vision and "vocab_size" not in found:
        raise ConfigError(f"key 'model.llm': {folder} holds a {kind} model, one with a vision_config, not a "
                          "text-only causal LM")


def _attention(config: RunConfig) -> None:
    if config.model.attn_implementation == "flash_attention_2":
        from transformers.utils import is_flash_attn_2_available

        if not is_flash_attn_2_available():
            raise ConfigError("key 'model.attn_implementation': flash_attention_2 needs the flash-attn package "
                              "and a CUDA GPU; use sdpa")


def _report_to(config: RunConfig) -> None:
    # transformers' own names for its integrations, which differ between its versions
    report_to = config.train.report_to
    if report_to in ([], ["none"]):
        return
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK as known
    from transformers.integrations.integration_utils import get_available_reporting_integrations

    if report_to == ["all"]:  # what TrainingArguments resolves it to: wandb among them when installed
        report_to = get_available_reporting_integrations()
    if [name for name in report_to if name not in known]:
        raise ConfigError(f"key 'train.report_to': {report_to} has a name not among transformers' {list(known)}")
    # azure_ml counts as available only without mlflow, so its absence there proves nothing.
    absent = [n for n in report_to if n != "azure_ml" and n not in get_available_reporting_integrations()]
    if absent:
        raise ConfigError(f"key 'train.report_to': {absent} not installed (install it, or report_to: [])")
    if "wandb" in report_to and not _wandb_can_log():  # else wandb.init stops the run after the model loaded
        raise ConfigError("key 'train.report_to': wandb has no API key here (no WANDB_API_KEY, no netrc entry for "
                          f"{_wandb_host()}): run `wandb login`, set WANDB_API_KEY, or set WANDB_MODE=offline")


def _wandb_host() -> str:
    from urllib.parse import urlparse

    return urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"


def _wandb_can_log() -> bool:
    """Whether ``wandb.init`` finds what it needs without a prompt: W&B off or offline, an API key
    in the environment, an identity token file, or a netrc entry for its host (what `wandb login`
    writes)."""
    import netrc

    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return True
    if os.environ.get("WANDB_DISABLED", "").lower() in ("true", "1", "yes"):
        return True
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc")).expanduser()
    try:
        return path.is_file() and netrc.netrc(path).authenticators(_wandb_host()) is not None
    except (netrc.NetrcParseError, OSError):
        return False  # wandb.init would not read it either


# train.fused_loss_kernel's GPU kernels: the distribution each needs (llava_norm.model.loss imports it;
# liger-kernel is in requirements-gpu.txt)
FUSED_LOSS_DISTRIBUTIONS = {"liger": "liger-kernel", "cce": "cut-cross-entropy"}


def _fused_loss_kernel(config: RunConfig) -> None:
    t = config.train
    needed = FUSED_LOSS_DISTRIBUTIONS.get(t.fused_loss_kernel) if t.loss == "fused" else None
    if needed:
        from importlib.metadata import PackageNotFoundError, version

        try:
            version(needed)
        except PackageNotFoundError:
            raise ConfigError(f"key 'train.fused_loss_kernel': {t.fused_loss_kernel} needs the {needed} package "
                              f"(pip install {needed}); torch needs none") from None


def _compile(config: RunConfig) -> None:
    if config.train.compile:
        import torch._dynamo

        backends = torch._dynamo.list_backends(exclude_tags=())
        if config.train.compile_backend not in backends:
            raise ConfigError(f"key 'train.compile_backend': {config.train.compile_backend!r} is not a torch.compile "
                              f"backend here; known: {', '.join(backends)}")


def _chat_template(config: RunConfig) -> None:
    m = config.model
    if config.data.prompt_format == "chat" and _looks_local(m.llm) and not _has_chat_template(Path(m.llm).expanduser()):
        raise ConfigError(f"key 'data.prompt_format': 'chat' needs a chat template, but the tokenizer in {m.llm} "
                          "has none; use 'plain' or a chat model")


def _packing_family(config: RunConfig) -> None:
    m = config.model
    if config.data.packing and _looks_local(m.llm):
        try:
            model_type = json.loads((Path(m.llm).expanduser() / "config.json").read_text()).get("model_type", "")
        except (OSError, ValueError, AttributeError):
            model_type = None  # unreadable: the model load reports it; the run checks the type again
        problem = packing_llm_problem(model_type) if model_type is not None else None
        if problem:
            raise ConfigError(problem)


def _projector(config: RunConfig) -> None:
    if config.model.pretrained_projector:
        _check_projector(config)


def _deepspeed(config: RunConfig) -> None:
    if config.train.deepspeed:
        _check_deepspeed(config)


def _deepspeed_file(config: RunConfig) -> None:
    if config.train.deepspeed:
        _must_exist(config.train.deepspeed, "train.deepspeed", kind="file")


def _resume_and_output(config: RunConfig) -> None:
    t = config.train
    if t.resume not in ("auto", "none"):
        _must_exist(t.resume, "train.resume", kind="dir")
        if not (Path(t.resume).expanduser() / TRAINER_STATE).is_file():
            raise ConfigError(f"key 'train.resume': {t.resume} is not a checkpoint-N dir (no {TRAINER_STATE}); "
                              "use auto, none or a checkpoint dir")
    problem = output_dir_problem(t.output_dir)
    if problem:
        raise ConfigError(problem)


def output_dir_problem(output_dir: str | Path, key: str = "key 'train.output_dir'") -> str | None:
    """Why ``train.output_dir`` (or the folder ``key`` names) cannot be a folder the run writes in:
    a file, or under a file or a folder this user cannot write in (the nearest one that exists,
    where the folders would be made)."""
    out = Path(output_dir).expanduser().resolve()  # as the launch makes it: a symbolic link followed
    blocked = False
    for there in (out, *out.parents):
        try:
            if there.exists():
                break
        except OSError:  # inside a folder this user may not enter
            blocked = True
    if blocked:
        return f"{key}: {output_dir} cannot be made: {there} is not open to this user"
    if there == out and not out.is_dir():
        return f"{key}: {output_dir} exists and is not a directory"
    if not there.is_dir():
        return f"{key}: {output_dir} cannot be made: {there} is a file"
    if not os.access(there, os.W_OK | os.X_OK):
        made = "is not writable" if there == out else f"cannot be made: {there} is not writable"
        return f"{key}: {output_dir} {made}"
    return None


def _lora_targets(config: RunConfig) -> None:
    lora = config.lora
    if lora.enabled and (lora.lm_head or lora.target_modules) and _looks_local(config.model.llm):
        _check_lora_targets(config)


def _has_chat_template(llm: Path) -> bool:
    # Any of the places transformers reads a template from; without one ChatTemplateFormat fails after the load.
    if any((llm / f).exists() for f in ("chat_template.jinja", "chat_template.json", "additional_chat_templates")):
        return True
    try:
        return bool(json.loads((llm / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return True  # no or an unreadable tokenizer config: for the tokenizer to report


def _check_projector(config: RunConfig) -> None:
    """The stage-1 file must hold this arm's projector: the tensors ``load_projector`` expects."""
    path, key, m = config.model.pretrained_projector, "model.pretrained_projector", config.model
    if Path(path).expanduser().is_dir():  # the stage-1 run's folder, say: name the file in it
        inside = Path(path).expanduser() / PROJECTOR_FILE
        raise ConfigError(f"key '{key}': {path} is a folder; give stage 1's projector file"
                          + (f", {inside}" if inside.is_file() else f" ({PROJECTOR_FILE} in its run folder)"))
    _must_exist(path, key, kind="file")
    try:  # safetensors: an 8-byte little-endian header length, then the header as JSON
        with open(Path(path).expanduser(), "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size)) if 0 < size < 100_000_000 else None
    except (OSError, ValueError):
        header = None
    if not isinstance(header, dict):
        raise ConfigError(f"key '{key}': {path} is not a safetensors file")
    # the tensors' bytes follow the header: a file cut short (a copy that stopped) holds fewer
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets") or ()) == 2]
    whole = 8 + size + max(ends, default=0)
    actual = Path(path).expanduser().stat().st_size
    if actual < whole:
        raise ConfigError(f"key '{key}': {path} is cut short: its header says {whole:,} bytes, the file has "
                          f"{actual:,} (copy it again from stage 1's run)")
    found = {name.removeprefix(PROJECTOR_PREFIX).split(".")[0] for name in header} - {"__metadata__"}
    want = {"linear_1", *(["linear_2"] if m.projector_type == "mlp2x_gelu" else []),
            *(["norm"] if NORM_ARMS[m.norm_alignment].has_tensors else [])}
    if found != want:
        raise ConfigError(f"key '{key}': {path} holds projector modules {sorted(found)}, but projector_type "
                          f"{m.projector_type!r} with norm_alignment {m.norm_alignment!r} needs {sorted(want)} "
                          + ("(a whole model's weights? give stage 1's projector file)" if "model" in found else
                             "(use the stage-1 run of the same arm)"))
    if m.allow_projector_mismatch:
        return
    recorded = header.get("__metadata__") or {}
    if not all(name in recorded for name in PROJECTOR_ORIGIN[:4]):
        raise ConfigError(f"key '{key}': {path} does not record the arm and backbones it was trained with (not "
                          "written by a llava-norm stage 1); set model.allow_projector_mismatch=true to use it anyway")
    ours = projector_origin(m)
    differ = [f"{name} {recorded[name]!r} (projector) vs {ours[name]!r} (this config)" for name in PROJECTOR_ORIGIN[:4]
              if recorded[name] != ours[name]]
    if differ:
        raise ConfigError(f"key '{key}': {path} was trained for another run: " + "; ".join(differ) +
                          ". Point it at the stage-1 run of this arm and backbones, or set "
                          "model.allow_projector_mismatch=true to use it anyway")


def projector_origin(m, text_norm: float | None = None) -> dict[str, str]:
    """What a projector file records of the run that wrote it (``model`` config ``m``; the LLM's
    T once the model is built: ``llava_norm.train.final``), and what stage 2's check above
    compares with its own config (all but T)."""
    origin = {"norm_alignment": m.norm_alignment, "projector_type": m.projector_type,
              "vision_tower": backbone_name(m.vision_tower), "llm": backbone_name(m.llm)}
    if text_norm is not None:
        origin["text_norm"] = repr(float(text_norm))
    return {key: origin[key] for key in PROJECTOR_ORIGIN if key in origin}


def backbone_name(value: str) -> str:
    """A backbone as a projector file records it: a hub id as given, a local folder as its
    absolute path (the same folder named two ways is one backbone)."""
    return str(Path(value).expanduser().resolve()) if _looks_local(value) else value


def _check_deepspeed(config: RunConfig) -> None:
    t, key = config.train, "train.deepspeed"
    _must_exist(t.deepspeed, key, kind="file")
    try:
        settings = json.loads(Path(t.deepspeed).expanduser().read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"key '{key}': {t.deepspeed} is not valid JSON ({error})") from None
    if not isinstance(settings, dict):
        raise ConfigError(f"key '{key}': {t.deepspeed} must hold a JSON object, got {type(settings).__name__}")
    for section in ("optimizer", "scheduler"):  # DeepSpeed's would replace the per-module AdamW groups / schedule
        if section in settings:
            raise ConfigError(f"key '{key}': {t.deepspeed} has an '{section}' section; remove it, optim.* sets it")
    zero = settings.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    if not isinstance(zero, dict) or stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        # DeepSpeed's own check fails only once the model is loaded, in a pydantic traceback
        raise ConfigError(f"key '{key}': {t.deepspeed} sets zero_optimization "
                          f"{'stage ' + repr(stage) if isinstance(zero, dict) else 'to ' + repr(zero)}; it must be an "
                          "object whose stage is 0, 1, 2 or 3")
    if importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(f"key '{key}': the deepspeed package is not installed")
    # transformers fills "auto" from the run and rejects any other differing value, but only once
    # training starts; these are the values it compares.
    accum, micro = effective_grad_accum(t, world_size()), t.per_device_batch_size
    expected = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
                "train_batch_size": micro * accum * world_size(), "gradient_clipping": config.optim.max_grad_norm,
                "fp16.enabled": False, **({"bf16.enabled": t.precision == "bf16"} if t.precision != "auto" else {})}
    for dotted, want in expected.items():
        section, _, name = dotted.rpartition(".")
        node = settings.get(section, {}) if section else settings
        got = node.get(name, "auto") if isinstance(node, dict) else "auto"
        if got != "auto" and got != want:
            raise ConfigError(f"key '{key}': {t.deepspeed} sets {dotted}={got!r}, but this config gives {want!r} "
                              "(or use \"auto\")")


def _check_lora_targets(config: RunConfig) -> None:
    """lora.lm_head and lora.target_modules against the local LLM, built on the meta device (no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    lora, remote = config.lora, config.model.trust_remote_code
    try:
        llm_config = AutoConfig.from_pretrained(config.model.llm, trust_remote_code=remote)
        with torch.device("meta"):
            decoder = AutoModelForCausalLM.from_config(llm_config, trust_remote_code=remote).get_decoder()
    except (OSError, ValueError, KeyError, TypeError):
        return  # a directory transformers cannot read: the model load reports it, with its own message
    linear = [n for n, mod in decoder.named_modules() if isinstance(mod, torch.nn.Linear)]
    problem = lora_target_problem(lora.target_modules, lora.lm_head, getattr(llm_config, "tie_word_embeddings", False),
                                  linear)
    if problem:
        raise ConfigError(problem)


def lora_target_problem(target_modules: list[str] | None, lm_head: bool, tied: bool, linear: list[str]) -> str | None:
    """What is wrong with ``lora.target_modules`` / ``lora.lm_head`` for an LLM with these linear
    layer names, or None. One rule for the check before any weights load and for ``model.lora``."""
    if lm_head and tied:
        # The adapted lm_head's base weight would be the input embeddings under a new name,
        # which transformers refuses to save (and merging would silently change the inputs too).
        return ("key 'lora.lm_head': this LLM ties lm_head to its input embeddings "
                "(tie_word_embeddings); adapting it is not supported")
    for suffix in target_modules or []:
        if not any(n == suffix or n.endswith(f".{suffix}") for n in linear):
            return (f"key 'lora.target_modules': {suffix!r} matches no linear layer of the LLM "
                    f"(its linear layers end in {sorted({n.rsplit('.', 1)[-1] for n in linear})})")
    return None


def _looks_local(value: str) -> bool:
    # anything existing locally, or not shaped as a hub id ("org/name"), is a path
    return Path(value).exists() or not is_hub_id(value)


def _must_exist(path: str, key: str, kind: str = "") -> None:
    # Relative paths are relative to the working directory, as every module that opens them reads them.
    found = Path(path).expanduser()
    if not found.exists():
        raise ConfigError(f"key '{key}': path does not exist: {path}")
    if kind == "file" and not found.is_file() or kind == "dir" and not found.is_dir():
        raise ConfigError(f"key '{key}': not a {'directory' if kind == 'dir' else 'file'}: {path}")


# check_paths' steps, in order; each raises its own ConfigError
PATH_CHECKS = (_data_paths, _backbone_dirs, _attention, _report_to, _fused_loss_kernel, _compile, _chat_template,
               _packing_family, _projector, _deepspeed, _resume_and_output, _lora_targets)
# check_inputs': one per input a training record fingerprints (llava_norm.train.relaunch.INPUT_KEYS and
# the data mixture), run where a reuse decision is made, without the machine's checks above
INPUT_CHECKS = (_data_paths, _backbone_dirs, _projector, _deepspeed_file)
