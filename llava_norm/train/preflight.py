"""``llava-norm check``: what can fail at launch, found before a job is queued.

Owns the preflight of one config on a given launch shape: the config itself and the
environment variables its YAML files read; the world size against the global batch; the
DeepSpeed JSON and the paths the config names; each data source (``train.source_checks``);
each backbone (a local folder, or the hub cache when offline, and a gated id without a token); the template
keys the LLM's chat template never reads (``llava_norm.data.templates``); the DeepSpeed
JSON as DeepSpeed itself reads it (``llava_norm.train.deepspeed_keys``); and the plan's
verdict on the GPU named. Every problem is one line naming the key, file or variable.
``llava-norm train`` runs it on rank 0 before anything loads, and ``llava-norm sweep --slurm``
for every stage config of its grid before it writes a file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from llava_norm.config import _read_yaml_chain, each_config_error, load_config
from llava_norm.config_checks import output_dir_problem, path_problems
from llava_norm.config_schema import (NORM_ARMS, ConfigError, ModelConfig, RunConfig, effective_grad_accum, is_hub_id,
                                      world_sizes_that_split)
from llava_norm.data.templates import template_kwargs_problems
from llava_norm.provenance import RELAUNCH_PAST_A_DAMAGED_RECORD, DamagedRecordError, read_record
from llava_norm.train.rundir import (NO_DATA_STATE, SUMMARY, complete_checkpoints, data_state, global_batch_problem,
                                     processes)
from llava_norm.train.source_checks import NOTE, SKIPPABLE, source_problems
from llava_norm.worker import environment_variable

# ${oc.env:NAME} or ${oc.env:NAME,default} in a YAML file
ENV_REFERENCE = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")
# Hub organisations whose models are gated: a licence accepted on the hub, then a token.
GATED_ORGANISATIONS = ("meta-llama/",)


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    # what data.on_bad_sample: skip lets the run step over (an unreadable shard, rows missing
    # from a download): said, recorded by the run, not a reason to stop it
    warnings: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    config: RunConfig | None = None
    plan: object | None = None  # llava_norm.plan.Plan, when one could be made

    @property
    def ok(self) -> bool:
        return not self.problems


def _values(tree, prefix: str = ""):
    """(dotted key, string value) of every string in a config tree; list items as key[i]."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _values(value, f"{prefix}.{key}" if prefix else key)
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _values(value, f"{prefix}[{i}]")
    elif isinstance(tree, str):
        yield prefix, tree


def unset_variables(path: Path, config: RunConfig) -> list[str]:
    """A problem line for each environment variable the config's YAML chain reads, that is
    unset, and whose fallback the resolved config still uses (an override may have replaced it)."""
    values = list(_values(dataclasses.asdict(config)))
    problems, seen = [], set()
    for source, _ in _read_yaml_chain(Path(path)):
        for name, default in ENV_REFERENCE.findall(source.read_text()):
            if name in os.environ or name in seen or not default:
                continue  # no fallback: the config does not resolve, and loading it said so
            used = [(key, value) for key, value in values if value.startswith(default)]
            if used:
                seen.add(name)
                key, value = used[0]
                problems.append(f"environment variable {name} is unset: key '{key}' falls back to {value} "
                                f"({source} reads it)")
    return problems


def backbone_problems(name: str, key: str) -> tuple[list[str], str]:
    """(problems, where it will be read from) for a backbone named by ``key``."""
    if Path(name).expanduser().exists():
        return [], f"local {name}"
    # a path that is not there, in config_checks' words (its check stops at the first backbone; each is
    # said here, once: the caller drops a key said already), not huggingface_hub's about repo ids
    if not is_hub_id(name):
        return [f"key '{key}': path does not exist: {name}"], "nowhere"
    from huggingface_hub import get_token, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError as error:  # huggingface_hub's HFValidationError: not a repo id (a missing relative path, say)
        return [f"key '{key}': {name!r} is not a local directory (from {Path.cwd()}) and not a Hugging Face repo "
                f"id ({str(error).splitlines()[0] if str(error) else 'name or namespace/name'})"], "nowhere"
    if isinstance(cached, str):
        return [], "hub cache"
    problems = []
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        problems.append(f"key '{key}': {name} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: "
                        f"download it first (hf download {name})")
    elif name.startswith(GATED_ORGANISATIONS) and not get_token():
        problems.append(f"key '{key}': {name} is gated: accept its licence on huggingface.co, then set HF_TOKEN "
                        "(or run `hf auth login`) before the launch downloads it")
    return problems, "hub, downloaded at start-up"


def preflight(path: str | Path, overrides: list[str], gpus: int, nodes: int = 1, gpu_memory_gib: float | None = None,
              gpu_name: str | None = None, plan: bool = True, sources: dict | None = None,
              output_dir: bool = True, launch: bool = False) -> Report:
    """The problems a launch of ``path`` with ``overrides`` on ``nodes`` x ``gpus`` processes
    would meet, and a summary; ``plan``: also the plan's verdict (training prints its own);
    ``sources``: results of data sources already read, by source (a grid's configs share them);
    ``output_dir``: whether the config's ``train.output_dir`` is where the launch writes, so what
    a relaunch there would do is checked (a sweep's chains write elsewhere); ``launch``: run inside
    a launch, whose process 0 holds the output folder's lock (``launch_lock``), so that lock is not
    another launch's."""
    report = Report()
    try:
        config = load_config(path, overrides, check_paths=False)
        report.problems += unset_variables(Path(path), config)
    except ConfigError as error:
        report.problems += each_config_error(path, overrides, error)
        return report
    report.config, world, t = config, gpus * nodes, config.train
    try:
        accum = effective_grad_accum(t, world)
        # given on the command line (a YAML base may set one for runs without a global batch)
        given = any(o.partition("=")[0].strip() == "train.grad_accum" for o in overrides)
        if given and t.global_batch_size is not None and t.grad_accum != accum:
            report.warnings.append(f"{path}: key 'train.grad_accum': {t.grad_accum} is given, but train.global_batch_size "
                                   f"{t.global_batch_size} decides the accumulation ({accum} on {nodes} node(s) x "
                                   f"{gpus} GPUs): it changes nothing (train.global_batch_size=null to use it)")
    except ConfigError:
        report.problems.append(f"{path}: key 'train.global_batch_size': {t.global_batch_size} rows per step cannot be "
                               f"split over {nodes} node(s) x {gpus} GPUs at {t.per_device_batch_size} per GPU; world "
                               f"sizes that work: {world_sizes_that_split(t)}")
        accum = None
    rows = 0
    sources = {} if sources is None else sources
    for i, source in enumerate(config.data.mixture):
        seen = (repr(source), i, config.data.prompt_format)
        if seen not in sources:
            sources[seen] = source_problems(source, f"data.mixture[{i}]", config.data.prompt_format)
        problems, found = sources[seen]
        for problem in problems:
            if problem.startswith(NOTE):
                report.warnings.append(problem[len(NOTE):])
            elif problem.startswith(SKIPPABLE) and config.data.on_bad_sample == "skip":
                report.warnings.append(problem[len(SKIPPABLE):] + " (data.on_bad_sample: skip: the run skips it "
                                       "and records it in skipped.jsonl)")
            else:
                report.problems.append(problem.removeprefix(SKIPPABLE))
        rows += found or 0
    # WORLD_SIZE as the launch will set it: the DeepSpeed JSON and the other paths the config names,
    # as the launch checks them
    with environment_variable("WORLD_SIZE", str(world)):
        for problem in path_problems(config):
            if not _said_already(report, problem):
                report.problems.append(f"{path}: {problem}")
    cache = os.environ.get("HF_DATASETS_CACHE")  # where the row index is built: a traceback at launch otherwise
    problem = cache and output_dir_problem(cache, "variable HF_DATASETS_CACHE")
    if problem:
        report.problems.append(problem)
    if t.deepspeed and accum is not None and not any("key 'train.deepspeed'" in said for said in report.problems):
        from llava_norm.train.deepspeed_keys import deepspeed_json_problems  # lazy: imports DeepSpeed

        settings = json.loads(Path(t.deepspeed).expanduser().read_text())  # read as JSON by the check above
        report.problems += [f"{path}: {problem}" for problem in
                            deepspeed_json_problems(settings, t.deepspeed, t.per_device_batch_size, accum)]
    where = {}
    for key in ("vision_tower", "llm"):
        problems, where[key] = backbone_problems(getattr(config.model, key), f"model.{key}")
        report.problems += [problem for problem in problems if not _said_already(report, problem)]
    if config.data.prompt_format == "chat":  # the plain format renders no template
        report.problems += [f"{path}: {problem}" for problem in
                            template_kwargs_problems(config.model.llm, config.data.template_kwargs)]
    report.summary += [
        f"world size {world} ({nodes} node(s) x {gpus} GPUs), gradient accumulation {accum}, "
        f"global batch {t.global_batch_size or t.per_device_batch_size * (accum or 1) * world}",
        f"data: {rows:,} rows taken from {len(config.data.mixture)} source(s) (before the row rules)",
        f"backbones: vision {config.model.vision_tower} ({where['vision_tower']}); llm {config.model.llm} ({where['llm']})",
    ]
    if t.save_steps == 0:
        report.warnings.append(f"{path}: key 'train.save_steps': 0 writes no checkpoint: a killed or requeued run "
                               "starts over from step 0")
    report.warnings += [f"{path}: {unused}" for unused in unused_arm_settings(config)]
    if accum is not None and output_dir and not _said_already(report, "key 'train.resume'"):  # a missing one: said
        _resume_shape(report, path, config, world, accum, launch)
    if plan and accum is not None:  # without a world size that divides the batch there is no launch to plan
        _plan(report, gpus, nodes, gpu_memory_gib, gpu_name)
    return report


def _resume_shape(report: Report, path, config: RunConfig, world: int, accum: int, launch: bool) -> None:
    """A relaunch that ``llava_norm.train.relaunch`` would refuse (a finished run or a checkpoint
    with another config, an unfinished checkpoint asked for): a problem. A launch that would
    resume a checkpoint saved on another number of processes: said in the summary, or a problem
    where the trainer would refuse it (``global_batch_problem``); a checkpoint without its data
    position is a problem on any number."""
    # lazy: relaunch reads the run's files
    from llava_norm.train.launch_lock import folder_in_use
    from llava_norm.train.relaunch import RelaunchError, plan_launch

    held = None if launch else folder_in_use(config.train.output_dir)
    if held:  # a job submitted twice: the second would be refused at launch
        report.problems.append(f"{path}: relaunch refused: {held}")
        return
    try:
        relaunch = plan_launch(config)
    except RelaunchError as error:  # the launch would refuse it: said before the job is queued
        report.problems.append(f"{path}: relaunch refused: {error}")
        return
    except (OSError, ValueError):  # files the launch reads again and says why
        return
    checkpoint = relaunch.checkpoint
    if relaunch.action == "done":  # a launch would exit at once: said, so an OK is not read as "will train"
        report.summary.append(f"relaunch: {relaunch.message}")
    # a stage 2 that starts fresh (not resuming a checkpoint's trained weights) from no stage-1 projector
    if relaunch.action == "fresh" and config.train.stage == 2 and not config.model.pretrained_projector:
        report.warnings.append(f"{path}: key 'model.pretrained_projector' is unset: stage 2 starts the projector and "
                               "norm layer from random weights, without stage 1's pretraining (give stage 1's "
                               "projector.safetensors)")
    out = Path(config.train.output_dir)
    if config.train.restart:  # the folder may hold another experiment's run
        found = complete_checkpoints(out)
        kept = "a finished run" if (out / SUMMARY).is_file() else \
            f"a run's checkpoints up to {found[-1].name}" if found else None
        if kept:
            report.warnings.append(f"{path}: train.restart=true deletes what {out} holds, {kept}, before training")
    try:  # a resume reads it to carry the earlier launches' changes; a finished run's, to complete it
        if relaunch.action != "fresh":
            read_record(out)
    except DamagedRecordError as error:
        report.problems.append(f"{path}: relaunch refused: {error}; {RELAUNCH_PAST_A_DAMAGED_RECORD}")
        return
    if checkpoint is None:
        return
    saved = data_state(checkpoint)
    if saved is None:  # the trainer refuses to resume it: said here first
        report.problems.append(f"{path}: {checkpoint.name}: {NO_DATA_STATE}")
        return
    problem = global_batch_problem(saved, world, config.train.per_device_batch_size * world * accum,
                                   config.train.per_device_batch_size)
    if problem:  # the trainer's own check, said before the launch
        report.problems.append(f"{path}: {checkpoint.name}: {problem}")
        return
    saved_world = saved.get("world_size", world)
    if saved_world == world:
        report.summary.append(f"resumes {checkpoint}")
        return
    converted = " after its DeepSpeed state is converted to the universal format (disk: README)" \
        if config.train.deepspeed else ""
    report.summary.append(f"resumes {checkpoint} (saved on {processes(saved_world)}) on {processes(world)}{converted}")


def unused_arm_settings(config) -> list[str]:
    """Settings the config's arm never reads, set all the same: in an ablation, the sign of an
    arm's config edited for another arm. (Not the chat template's keyword arguments under the
    plain format: a backbone's base file sets them for both stages on purpose.)"""
    arm, found = NORM_ARMS[config.model.norm_alignment], []
    if not arm.scale_calibrated and config.model.scale_value != ModelConfig.scale_value:
        found.append(f"key 'model.scale_value': {config.model.scale_value!r} is set, but arm {arm.name} has no "
                     "calibrated scale (scale_fixed and scale_learned read it): it changes nothing")
    if not arm.learns and config.optim.lr_norm is not None:
        found.append(f"key 'optim.lr_norm': {config.optim.lr_norm} is set, but arm {arm.name} has no alignment "
                     "weights that train: it changes nothing")
    return found


def _said_already(report: Report, problem: str) -> bool:
    """Whether the key ``problem`` names has a problem in the report already (one cause, said once)."""
    key = re.search(r"key '([^']+)'", problem)
    return bool(key) and any(f"'{key.group(1)}" in said for said in report.problems)


def _plan(report: Report, gpus: int, nodes: int, memory: float | None, name: str | None) -> None:
    # lazy: the plan builds the meta-device model (transformers' model code); the checks alone do not
    from llava_norm.plan import make_plan, memory_text

    try:
        plan = make_plan(report.config, gpus, nodes, memory, name, alternatives=memory is not None)
    except Exception as error:  # noqa: BLE001 - a plan that cannot be made is said, in one line
        said = f"plan: {type(error).__name__}: {str(error).splitlines()[0]}"
        # a backbone already said to be missing or of the wrong kind: the plan, which reads both, fails
        # on it too (naming its key, or an attribute the other kind of model lacks); and any key the
        # plan's error names that has its problem said (the DeepSpeed file, say): one cause, said once
        if any(f"key 'model.{key}'" in problem for key in ("vision_tower", "llm") for problem in report.problems) \
                or _said_already(report, said):
            report.summary.append("plan: none until the problems above are fixed")
        else:
            report.problems.append(said)
        return
    report.plan, peak = plan, plan.peak() / 2 ** 30
    host = plan.host_memory_gib()
    fit = "" if memory is None else f" ({'fits' if plan.fits(plan.peak()) else 'does not fit'} {memory:.1f} GiB)"
    # the fit beside the GPU peak it is of, not after the host figure (read as 240 GiB fitting 40)
    line = f"plan: peak {memory_text(plan.peak())} per GPU{fit}; host memory at start-up about " \
        f"{memory_text(host * 2 ** 30)} per node"
    if plan.fits(plan.peak()) is False:
        fixes = "; ".join(change for change, _ in plan.alternatives) or "none found"
        report.problems.append(f"plan: peak {peak:.1f} GiB per GPU does not fit {memory:.1f} GiB "
                               f"({name or 'given'}); single changes that fit: {fixes}")
    report.summary.append(line)


def print_report(report: Report, out=None) -> None:
    for problem in report.problems:
        print(f"problem: {problem}", file=out)
    for warning in report.warnings:
        print(f"warning: {warning}", file=out)
    if report.ok:
        for line in report.summary:
            print(line, file=out)
        print("check: OK", file=out)
    else:
        print(f"check: {len(report.problems)} problem(s)", file=out)


def json_report(report: Report) -> str:
    return json.dumps({"problems": report.problems, "warnings": report.warnings, "summary": report.summary}, indent=2)


__all__ = ["Report", "backbone_problems", "json_report", "preflight", "print_report", "source_problems",
           "unset_variables"]
