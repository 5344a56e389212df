"""Typed run configuration: YAML with inheritance, dotted command-line overrides, validation.

Owns reading every YAML under ``configs/`` into the schema (``llava_norm.config_schema``, whose
names are re-exported here) and its validation. ``load_config`` merges
``base:`` parents (paths relative to the child file), then the child, then ``key=value``
overrides, through OmegaConf structured configs, then ``validate`` checks values, settings that
contradict each other and (``check_paths``) what the config names on this machine. So every
config mistake stops the run before any model or data loads, as one line:
``<config file>: key '<dotted.key>': <what is wrong>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from llava_norm.config_checks import check_paths as _check_paths
from llava_norm.config_schema import (CHOICES, LORA_VISION_MODES, RANGES, SCHEDULERS, ConfigError, DataConfig,
                                      DataSource, LoraSettings, ModelConfig, OptimConfig, RunConfig, TrainConfig,
                                      effective_grad_accum, lora_vision_mode, parse_take, scale_value_problem, to_yaml,
                                      world_size)

__all__ = ["CHOICES", "LORA_VISION_MODES", "RANGES", "SCHEDULERS", "ConfigError", "DataConfig", "DataSource",
           "LoraSettings", "ModelConfig", "OptimConfig", "RunConfig", "TrainConfig", "effective_grad_accum",
           "load_config", "lora_vision_mode", "parse_take", "to_yaml", "validate", "world_size"]


def _read_yaml_chain(path: Path, seen: tuple[Path, ...] = ()) -> list:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"key 'base': circular chain through {path}", file=seen[-1])
    if not path.is_file():
        raise ConfigError(f"key 'base': config file not found: {path}" if seen else "config file not found",
                          file=seen[-1] if seen else path)
    try:
        node = OmegaConf.load(path)
    except yaml.YAMLError as error:
        raise ConfigError(_yaml_problem(error), file=path) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read the file ({error})", file=path) from None
    if not isinstance(node, DictConfig):
        raise ConfigError("the top level must be a mapping of sections (model, data, optim, train, lora)", file=path)
    bases = node.pop("base", None)
    bases = [] if bases is None else bases  # (not `or []`: a base of 0, false, {} or '' is refused, not dropped)
    if not isinstance(bases, (str, list, ListConfig)) or bases == "":  # list() would take a mapping apart
        raise ConfigError(f"key 'base': {OmegaConf.to_container(bases) if isinstance(bases, DictConfig) else bases!r} "
                          "is not a file name or a list of them", file=path)
    bases = [bases] if isinstance(bases, str) else list(bases)
    chain = []
    for base in bases:
        if not isinstance(base, str):
            raise ConfigError(f"key 'base': {base!r} is not a file name", file=path)
        chain += _read_yaml_chain(path.parent / base, seen + (path,))
    return chain + [(path, node)]


def load_config(path: str | Path, overrides: list[str] = (), check_paths: bool = True) -> RunConfig:
    """The merged, validated config. Every error is a one-line ConfigError naming the file and key.

    ``check_paths``: also check what the config refers to on this machine (files, directories,
    the DeepSpeed JSON, installed packages, the local backbones' files), still before any load.
    """
    with naming_the_file(path):
        return _load(Path(path), list(overrides), check_paths)


def stage_problem(path: str | Path, config: RunConfig, stage: int) -> str | None:
    """A config that trains another stage than the one it is launched as (by scripts/pretrain.sh
    or finetune.sh, or as a grid's ``stage{N}.yaml``), named by its file and key; None if it agrees."""
    if config.train.stage == stage:
        return None
    return f"{path}: key 'train.stage': the config trains stage {config.train.stage}, not stage {stage}"


def _named(error: ConfigError, path: str | Path) -> str:
    """The error in one line naming the file (its own, else ``path``), whatever a library put in its message."""
    return f"{error.file or path}: {' '.join(str(error).splitlines())}"


@contextlib.contextmanager
def naming_the_file(path: str | Path):
    """A ConfigError raised in the block comes out as one line naming the file (``_named``)."""
    try:
        yield
    except ConfigError as error:
        raise ConfigError(_named(error, path)) from None


def _mixture_keys(node, file: Path | None = None) -> None:
    """An unknown key inside a ``data.mixture`` entry, named with its place in the list (OmegaConf
    names only the key itself)."""
    mixture = OmegaConf.select(node, "data.mixture", default=None) if isinstance(node, DictConfig) else None
    if not isinstance(mixture, ListConfig):
        return
    known = {f.name for f in dataclasses.fields(DataSource)}
    for i, entry in enumerate(mixture):
        unknown = sorted(set(entry) - known) if isinstance(entry, DictConfig) else []
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"key 'data.mixture[{i}].{unknown[0]}': not a mixture entry key (known: "
                              f"{', '.join(sorted(known))}){hint}", file=file)


def _merge_files(path: Path, refused: list[ConfigError] | None = None) -> DictConfig:
    """The config's files merged onto the schema; the first key the schema refuses raises. With
    ``refused``, each refused key the file sets is recorded there instead, set aside, and the merge
    tried again."""
    merged = OmegaConf.structured(RunConfig)
    for source, node in _read_yaml_chain(path):
        _mixture_keys(node, source)
        while True:
            try:
                merged = OmegaConf.merge(merged, _checked_shapes(merged, node, source))
                break
            except (OmegaConfBaseException, ConfigError) as error:
                if isinstance(error, ConfigError):  # a value of the wrong shape (_checked_shapes)
                    problem, key = error, re.match(r"key '([^']+)'", str(error)).group(1)
                else:
                    problem, key = ConfigError(_describe(error), file=source), getattr(error, "full_key", None) or ""
                parent = OmegaConf.select(node, key.rpartition(".")[0]) if "." in key else node
                if refused is None or not isinstance(parent, DictConfig) or key.rpartition(".")[2] not in parent:
                    raise problem from None  # (with refused: not a key this file sets, nothing to set aside)
                refused.append(problem)
                del parent[key.rpartition(".")[2]]
    return merged


def _shape(node) -> str:
    return "a mapping" if OmegaConf.is_dict(node) else "a list" if OmegaConf.is_list(node) else "a single value"


def _checked_shapes(schema: DictConfig, node, file: Path, prefix: str = ""):
    """``node``, once every key it sets holds the shape the schema has there (a mapping, a list or
    a single value; unset optional values aside). Why: OmegaConf refuses a list given for a
    mapping, or a mapping for a list, with a TypeError that names neither the key nor the file."""
    if not isinstance(node, DictConfig) or not isinstance(schema, DictConfig):
        return node
    for key in node:
        if key not in schema:
            continue  # an unknown key: the merge names it, with the keys it could have meant
        want, got = schema._get_node(key), node._get_node(key)
        if got._is_none() or got._is_missing() or got._is_interpolation():
            continue
        if _shape(want) != _shape(got):
            # a lone value where a list goes (report_to=wandb, which transformers would take): its list form
            hint = f": write [{got._value()}]" if OmegaConf.is_list(want) and _shape(got) == "a single value" else ""
            raise ConfigError(f"key '{prefix}{key}': expected {_shape(want)}, got {_shape(got)}{hint}", file=file)
        if OmegaConf.is_dict(want) and not want._is_none():
            _checked_shapes(want, got, file, f"{prefix}{key}.")
    return node


def _load(path: Path, overrides: list[str], check_paths: bool) -> RunConfig:
    merged = _merge_files(path)
    for override in overrides:
        if not override.partition("=")[0] or "=" not in override:
            raise ConfigError(f"key '{override}': a command-line override must be KEY=VALUE")
    indexed = [k for k, _, _ in map(lambda o: o.partition("="), overrides) if re.search(r"\.\d+(\.|$)", k)]
    try:
        try:
            dotlist = OmegaConf.from_dotlist(overrides)
            _mixture_keys(dotlist)
            if not indexed:  # (an indexed key reads as a mapping where the list is: said below)
                try:
                    _checked_shapes(merged, dotlist, None)
                except ConfigError as error:
                    raise ConfigError(_from_overrides(str(error), overrides, theirs=True)) from None
            merged = OmegaConf.merge(merged, dotlist)
        except TypeError:  # omegaconf's message for "list.0.key=..." is unhelpful
            raise ConfigError(f"key '{(indexed or overrides)[0]}': a list (e.g. data.mixture) can only be replaced "
                              "whole, e.g. 'data.mixture=[{path: a.json}]'") from None
        except yaml.YAMLError as error:  # the value of one override: named, or it reads as the file's own
            said = _override_yaml_problem(overrides) or _from_overrides(_yaml_problem(error), overrides, theirs=True)
            raise ConfigError(said) from None
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            more = f" (also not set: {', '.join(missing[1:])})" if missing[1:] else ""
            raise ConfigError(f"key '{missing[0]}': required, but not set{more}")
        config: RunConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        raise ConfigError(_from_overrides(_describe(error), overrides, theirs=True)) from None
    try:
        validate(config, check_paths)
    except ConfigError as error:  # a value the command line gave is not the file's to answer for
        raise ConfigError(_from_overrides(str(error), overrides), file=error.file) from None
    return config


def _from_overrides(message: str, overrides: list[str], theirs: bool = False) -> str:
    """``message`` naming the command-line override that set its key (the last, as it wins), or
    every override where none did and the error is theirs (``theirs``: it came from merging them
    onto a file that merged; or it names no key); as it is without any."""
    if not overrides:
        return message
    key = re.match(r"key '([^'\[]+)", message)

    def section(override: str) -> str:  # data.mixture[0].path or data.mixture.0.path: data.mixture
        return re.split(r"\[|\.\d", override.partition("=")[0])[0]

    given = [o for o in overrides if key and (key.group(1) == section(o) or key.group(1).startswith(section(o) + ".")
                                              or section(o).startswith(key.group(1) + "."))]
    if given:
        return f"{message} (the command line's {given[-1]})"
    return f"{message} (command-line overrides {overrides})" if theirs or not key else message


def file_problems(path: str | Path, overrides: list[str] = ()) -> tuple[list[str], list[str]]:
    """(every key of the config's files that the schema refuses, every value outside its key's
    choices or range), each as load_config says it, not only the first. A refused key (an unknown
    key, a value of the wrong type or shape) is set aside and the merge tried again (a key shared
    through a base file is said once; a bad key inside a ``data.mixture`` entry ends the list);
    the values are those of what merged, with the ``overrides`` that merge. What the overrides or
    the checks between keys may still refuse is load_config's to say."""
    refused, values = [], []
    try:
        values = [ConfigError(problem) for problem in _value_problems_of(_merge_files(Path(path), refused), overrides)]
    except ConfigError as error:
        refused.append(error)
    return tuple(list(dict.fromkeys(_named(error, path) for error in errors)) for errors in (refused, values))


def each_config_error(path: str | Path, overrides: list[str], first: ConfigError) -> list[str]:
    """Every key the config's files refuse; once they merge, every value outside its key's choices
    or range (the file's and the overrides'), then every override the config refuses, not only
    the first: overrides are taken on the file one at a time, and the refused ones are tried
    again on those taken until none more is: one valid only beside another (``lora.enabled=true``
    before ``train.stage=2``, or a key the file lacks set after it) is no problem, and a clash
    between two is reported once, at one of them."""
    def error_of(tried: list[str]) -> str | None:
        try:
            load_config(path, tried, check_paths=False)
        except ConfigError as error:
            return str(error)
        return None

    # every value with the overrides that merge (a file's value the launch replaces is not said)
    in_the_file, found = file_problems(path, overrides)
    if in_the_file:  # the overrides are checked on a file that merges
        return in_the_file + found
    # a key given twice is set by its last value, as load_config sets it: the earlier ones are not tried
    keys = [o.partition("=")[0] for o in overrides]
    taken, refused, more = [], [o for i, o in enumerate(overrides) if keys[i] not in keys[i + 1:]], True
    while more:
        more = False
        for override in list(refused):
            if error_of([*taken, override]) is None:
                taken.append(override)
                refused.remove(override)
                more = True
    for override in refused:
        error = error_of([*taken, override])
        if error not in found:
            found.append(error)
    return found or [str(first)]


def _value_problems_of(merged: DictConfig, overrides: list[str]) -> list[str]:
    """``value_problems`` of ``merged`` with ``overrides``; none where those do not merge or leave a
    required key unset (load_config says so once the keys are fixed)."""
    for override in overrides:  # one at a time: one that does not merge leaves the others
        try:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([override]))
        except (OmegaConfBaseException, TypeError, yaml.YAMLError):
            continue
    try:
        if OmegaConf.missing_keys(merged):
            return []
        return [_from_overrides(problem, overrides) for problem in value_problems(OmegaConf.to_object(merged))]
    except OmegaConfBaseException:
        return []


def _describe(error: OmegaConfBaseException) -> str:
    key = getattr(error, "full_key", None)
    message = str(error).splitlines()[0]
    if isinstance(error, ConfigKeyError) and key:  # a key put in the wrong section: say where it lives
        section, _, name = key.partition(".")
        homes = [f"'{f.name}.{name}'" for f in dataclasses.fields(RunConfig) if f.name != section and
                 name in {g.name for g in dataclasses.fields(f.default_factory)}]
        message += f"; the key is {' or '.join(homes)}" if homes else ""
    return f"key '{key}': {message}" if key else message


def _override_yaml_problem(overrides: list[str]) -> str | None:
    """The first override whose value is not YAML, named by its key (None: none alone is)."""
    for override in overrides:
        try:
            OmegaConf.from_dotlist([override])
        except yaml.YAMLError as error:
            key, _, value = override.partition("=")
            problem = getattr(error, "problem", None) or error
            return f"key '{key}': the command-line value {value!r} is not valid YAML: {problem}"
    return None


def _yaml_problem(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"invalid YAML{at}: {getattr(error, 'problem', None) or error}"


def _get(config: RunConfig, dotted: str):
    value = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def value_problems(config: RunConfig) -> list[str]:
    """Every key whose value is not among its choices (CHOICES) or outside its range (RANGES),
    one line each; validate raises the first."""
    problems = [f"key '{dotted}': {_get(config, dotted)!r} is not one of {list(allowed)}"
                for dotted, allowed in CHOICES.items() if _get(config, dotted) not in allowed]
    for dotted, spec in RANGES.items():
        value = _get(config, dotted)
        if value is not None and not _in_range(value, spec):
            finite = "" if math.isfinite(value) else "a finite number "
            problems.append(f"key '{dotted}': must be {finite}{spec}, got {value}")
    return problems


def validate(config: RunConfig, check_paths: bool = True) -> None:
    """Raise ConfigError ("key '<dotted.key>': <what is wrong>") for anything a run would reject
    later. The checks in the modules that use these values stay as a second line of defence."""
    problems = value_problems(config)
    if problems:
        raise ConfigError(problems[0])
    problem = scale_value_problem(config.model.scale_value)
    if problem:
        raise ConfigError(f"key 'model.scale_value': {problem}")
    t, lora = config.train, config.lora
    if t.stage not in (1, 2):
        raise ConfigError(f"key 'train.stage': must be 1 or 2, got {t.stage}")
    if not (t.max_steps == -1 or t.max_steps > 0):
        raise ConfigError(f"key 'train.max_steps': must be -1 (run train.epochs) or positive, got {t.max_steps}")
    if t.max_steps == -1 and t.epochs <= 0:
        raise ConfigError(f"key 'train.epochs': must be positive when train.max_steps is -1, got {t.epochs}")
    if t.restart and (t.extend or t.resume not in ("auto", "none")):  # restart deletes what they would continue
        raise ConfigError(f"key 'train.restart': starts over, but train.extend is {t.extend} and train.resume "
                          f"is {t.resume!r}")
    effective_grad_accum(t, world_size())  # global batch divisible by per-device batch x processes
    # which names transformers knows, and which are installed, depends on the machine: config_checks
    if ("none" in t.report_to or "all" in t.report_to) and len(t.report_to) > 1:
        raise ConfigError(f"key 'train.report_to': 'none' and 'all' stand alone, got {list(t.report_to)}")
    if not config.data.mixture:
        raise ConfigError("key 'data.mixture': list at least one data file")
    for i, source in enumerate(config.data.mixture):
        parse_take(source.take, f"data.mixture[{i}].take")
        if bool(source.path) == bool(source.hub):
            raise ConfigError(f"key 'data.mixture[{i}]': give exactly one of 'path' (a .json/.jsonl file, or parquet "
                              "shards: a file, folder or glob) and 'hub' (a dataset id)")
    if lora.enabled and t.stage != 2:
        raise ConfigError(f"key 'lora.enabled': LoRA applies to stage 2 only, but train.stage is {t.stage}")
    if lora.target_modules is not None and not lora.target_modules:
        raise ConfigError("key 'lora.target_modules': empty list; use null for every linear layer of the LLM")
    if lora.vision_tower not in (None, *LORA_VISION_MODES):
        raise ConfigError(f"key 'lora.vision_tower': {lora.vision_tower!r} is not one of {list(LORA_VISION_MODES)}")
    if lora.enabled and lora.vision_tower in ("full", "lora") and not t.train_vision_tower:
        raise ConfigError(f"key 'lora.vision_tower': {lora.vision_tower!r} trains the vision tower, "
                          "but train.train_vision_tower is false")
    if config.data.packing and config.model.trust_remote_code:
        # Isolation rests on transformers' own masking (position ids restart per sample, no mask,
        # no cache); a model's own code may attend across the samples of a row.
        raise ConfigError("key 'model.trust_remote_code': data.packing needs the LLM's attention from "
                          "transformers, which builds per-sample masks from position ids; remote modelling code "
                          "may let packed samples attend to each other")
    window = t.profile_steps
    if window is not None and not (len(window) == 2 and 1 <= window[0] <= window[1]):
        raise ConfigError(f"key 'train.profile_steps': {list(window)} is not [first, last] with "
                          "1 <= first <= last")
    if t.loss == "fused" and lora.enabled and lora.lm_head:
        raise ConfigError("key 'lora.lm_head': train.loss fused reads the output weight directly, which an "
                          "adapted lm_head does not have; use train.loss plain")
    if check_paths:
        _check_paths(config)


def _in_range(value: float, spec: str) -> bool:
    if not math.isfinite(value):  # inf passes every ">" bound and trains on to NaN weights; NaN passes none
        return False
    if spec.startswith("["):
        low, high = (float(x) for x in spec[1:-1].split(","))
        return low <= value < high
    op, bound = spec.split()
    return value > float(bound) if op == ">" else value >= float(bound)
