"""What launching a run does when its output directory already holds one, decided before any
model or data loads.

Owns the run directory's states and the way out of each:
- finished (``train_summary.json`` marks it complete): nothing to do, exit 0, no byte written;
  ``train.extend: true`` continues from the last checkpoint to a new ``max_steps``/``epochs``;
- checkpoints (a killed or preempted run): resume from the newest complete one, if the config it
  was saved with (``run_config.yaml`` in the checkpoint) matches this one on every key that can
  change the result; otherwise refused with the keys named, unless
  ``train.allow_config_change: true``;
- empty: a fresh start.
``train.restart: true`` deletes the run's own outputs and starts from scratch. Keys that only
say where and how often to write (output path, save and log intervals, reporters, loader workers)
never block a resume.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from llava_norm.config import RunConfig, to_yaml
from llava_norm.files import REMOVING
from llava_norm.layout import CONFIG_FILE, MODEL_DIR, PROJECTOR_FILE
from llava_norm.provenance import RECORD, flatten
from llava_norm.train.rundir import (COMPLETE_MARKER, PROFILE_DIR, RUN_CONFIG, SKIPPED, SUMMARY, WANDB_RUN_ID,
                                     checkpoint_damage, checkpoint_step, complete_checkpoints)

log = logging.getLogger(__name__)
# Where and how often to write, and how to treat this launch: none of them changes the trained weights.
OPERATIONAL_KEYS = frozenset({
    "train.output_dir", "train.resume", "train.save_steps", "train.save_total_limit", "train.logging_steps",
    "train.report_to", "train.run_name", "train.norm_stats_steps", "train.restart", "train.extend",
    "train.allow_config_change", "data.num_workers", "model.allow_projector_mismatch", "train.profile_steps",
    # which kernel computes attention, not what trains: runs saved while its default was null resume
    "train.cudnn_attention",
})
SCHEDULE_KEYS = frozenset({"train.max_steps", "train.epochs"})  # what train.extend may raise
# Keys naming a file, folder or hub id (and each data source's path and image folder). A relaunch
# compares where they point, so one path spelt relative or absolute, or through a symlink, is
# one path; the training record fingerprints them (llava_norm.train.record).
INPUT_KEYS = ("model.vision_tower", "model.llm", "model.pretrained_projector", "train.deepspeed")
SOURCE_PATHS = ("path", "image_folder")
# What a run writes into output_dir, and so what train.restart removes (nothing else is touched).
RUN_OUTPUTS = (MODEL_DIR, PROJECTOR_FILE, SUMMARY, CONFIG_FILE, SKIPPED, "runs", RECORD, WANDB_RUN_ID, PROFILE_DIR)


class RelaunchError(RuntimeError):
    pass


@dataclass
class LaunchPlan:
    action: str  # "fresh" | "resume" | "done"
    checkpoint: Path | None = None
    message: str = ""
    differences: list[str] = field(default_factory=list)


def inert_keys(flat: dict) -> set[str]:
    """Keys of a flattened config that its other keys switch off, so they cannot change the result."""
    return (set() if flat.get("data.packing") else {"data.pack_max_tokens"}) | \
        (set() if flat.get("train.loss") == "fused" else {"train.fused_loss_kernel", "train.fused_loss_softmax"})


def optimizer_layout_changes(saved_yaml: str, config: RunConfig) -> list[str]:
    """``key: saved -> now`` for each change that gives the model or its optimizer other parameters
    or groups (params.freeze_backbones, freeze_for_lora, parameter_groups): another stage, arm or
    projector, LoRA on or off or shaped otherwise, the tower trained another way, weight decay to or
    from 0 (which splits each group in two)."""
    saved, now = flatten(yaml.safe_load(saved_yaml) or {}), flatten(yaml.safe_load(to_yaml(config)))

    def layout(flat: dict) -> dict:
        stage2 = flat.get("train.stage") == 2
        lora = stage2 and bool(flat.get("lora.enabled"))
        tower = "frozen" if not stage2 else flat.get("lora.vision_tower") if lora and flat.get("lora.vision_tower") \
            else "full" if flat.get("train.train_vision_tower") else "frozen"  # config_schema.lora_vision_mode
        return {"train.stage": flat.get("train.stage"), "model.norm_alignment": flat.get("model.norm_alignment"),
                "model.projector_type": flat.get("model.projector_type"), "lora.enabled": lora,
                **({f"lora.{k}": flat.get(f"lora.{k}") for k in ("rank", "target_modules", "lm_head")} if lora else {}),
                "tower": tower, "optim.weight_decay": bool(flat.get("optim.weight_decay"))}

    before, after = layout(saved), layout(now)
    changed = [key for key in before if before.get(key) != after.get(key)]
    changed = changed[:1] if changed[:1] in (["train.stage"], ["lora.enabled"]) else changed  # the rest follows
    tower_keys = ("train.train_vision_tower", "lora.vision_tower")  # the keys the tower's training follows
    keys = [k for key in changed for k in (tower_keys if key == "tower" else (key,))
            if key != "tower" or saved.get(k) != now.get(k)]
    return [f"{key}: {saved.get(key, '<unset>')!r} -> {now.get(key, '<unset>')!r}" for key in keys]


def _where(value):
    """A path as the real path it names, from this process's folder (a relative one only where
    it exists: a hub id, organisation/name, is not a path); anything else as it is."""
    if not isinstance(value, str) or not value:
        return value
    path = Path(value).expanduser()
    return os.path.realpath(path) if path.is_absolute() or path.exists() else value


def _located(flat: dict) -> dict:
    """A flattened config with its input paths as ``_where`` gives them."""
    out = {**flat, **{key: _where(flat[key]) for key in INPUT_KEYS if key in flat}}
    if isinstance(flat.get("data.mixture"), list):
        out["data.mixture"] = [{**source, **{key: _where(source[key]) for key in SOURCE_PATHS if key in source}}
                               if isinstance(source, dict) else source for source in flat["data.mixture"]]
    return out


def config_differences(saved_yaml: str, config: RunConfig, allowed: frozenset = frozenset()) -> list[str]:
    """``key: saved -> now`` for every result-changing key that differs (an input path by where it points)."""
    saved = _located(flatten(yaml.safe_load(saved_yaml) or {}))
    now = _located(flatten(yaml.safe_load(to_yaml(config))))
    ignore = OPERATIONAL_KEYS | allowed | (inert_keys(saved) & inert_keys(now))
    return [f"{key}: {saved.get(key, '<unset>')!r} -> {now.get(key, '<unset>')!r}"
            for key in sorted(set(saved) | set(now)) if key not in ignore and saved.get(key) != now.get(key)]


def finished_step(out: Path) -> int | None:
    """The last step of the finished run in ``out`` (its summary says complete); None if none."""
    path = out / SUMMARY
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except ValueError as err:  # JSON's and UTF-8's errors both
        # cut short (a machine that went down as it was written; a kill cannot, as it is put in
        # place whole): no finished run's, so the run resumes from its last checkpoint and writes it again
        log.warning("%s is unreadable (%s): the run is taken as unfinished", path, err)
        return None
    return summary.get("global_step") if isinstance(summary, dict) and summary.get("complete") else None


def _checked_resume(checkpoint: Path, config: RunConfig, allowed: frozenset, why: str) -> LaunchPlan:
    if not checkpoint.is_dir():  # train.resume naming nothing (a typo, another run's folder)
        complete = ", ".join(str(p) for p in complete_checkpoints(checkpoint.parent)) or "none"
        raise RelaunchError(f"{checkpoint}: {why}, but there is no such folder. Complete checkpoints beside it: "
                            f"{complete}")
    if checkpoint.is_dir() and not (checkpoint / COMPLETE_MARKER).is_file():  # one train.resume names
        complete = ", ".join(p.name for p in complete_checkpoints(checkpoint.parent)) or "none"
        raise RelaunchError(f"{checkpoint}: {why}, but it has no {COMPLETE_MARKER}: its save never finished (a "
                            f"launch stopped while writing it). Complete ones beside it: {complete}")
    damage = checkpoint_damage(checkpoint)
    if damage:  # deleted or cut short since its save: the Trainer would start a missing optimizer afresh
        found = [p.resolve() for p in complete_checkpoints(checkpoint.parent)]
        before = [p for p in (found[:found.index(checkpoint.resolve())] if checkpoint.resolve() in found else [])
                  if not checkpoint_damage(p)]
        raise RelaunchError(f"{checkpoint}: {why}, but it changed after its save: {'; '.join(damage)}. "
                            + (f"train.resume={before[-1]} resumes from the last complete checkpoint before it as "
                               "saved" if before else "train.restart=true starts over"))
    saved = checkpoint / RUN_CONFIG
    if not saved.is_file():
        differences = [f"{checkpoint} has no {RUN_CONFIG} (saved by an older version)"]
    else:
        saved_yaml = saved.read_text()
        try:
            differences = config_differences(saved_yaml, config, allowed)
        except yaml.YAMLError as error:  # (a checkpoint saved before markers listed their files' sizes)
            raise RelaunchError(f"{saved}: not a readable config ({str(error).splitlines()[0]}); "
                                "train.resume=<an earlier checkpoint> resumes from another") from None
        regrouped = differences and optimizer_layout_changes(saved_yaml, config)  # (each layout key is a config key)
        if regrouped:
            raise RelaunchError(f"{config.train.output_dir}: {why}, but {'; '.join(regrouped)} would give the "
                                "optimizer other parameters or groups than the checkpoint's, whose state cannot be "
                                "loaded into them (train.allow_config_change cannot cover this). "
                                "train.restart=true starts over; another train.output_dir starts a new run")
    if differences and not config.train.allow_config_change:
        raise RelaunchError(f"{config.train.output_dir}: {why}, but its config differs: {'; '.join(differences)}. "
                            "For a new run give another train.output_dir; train.allow_config_change=true resumes "
                            "anyway; train.restart=true deletes it and starts over")
    step, last = checkpoint_step(checkpoint), config.train.max_steps
    if step is not None and 0 < last < step:  # (a run that ends by epochs: the trainer refuses it at its start)
        raise RelaunchError(f"{checkpoint}: at step {step}, past this run's last step {last} (train.max_steps "
                            "lowered?)")
    return LaunchPlan("resume", checkpoint, f"resuming from {checkpoint}", differences)


def plan_launch(config: RunConfig) -> LaunchPlan:
    """Decide what this launch does; refuses (RelaunchError) rather than guess."""
    t = config.train
    out = Path(t.output_dir)
    if t.restart:
        _check_restart(config)
        return LaunchPlan("fresh", message="train.restart: starting over")
    if t.resume not in ("auto", "none"):  # (with train.extend, a larger train.max_steps is what is asked for)
        return _checked_resume(Path(t.resume).expanduser(), config, SCHEDULE_KEYS if t.extend else frozenset(),
                               f"train.resume={t.resume} was asked for")
    finished = finished_step(out)
    checkpoints = complete_checkpoints(out)
    if t.resume == "none":
        if finished is not None or checkpoints:
            raise RelaunchError(f"{out}: holds a run already and train.resume is none; use train.restart=true "
                                "to delete it and start over, or train.resume=auto to continue it")
        return LaunchPlan("fresh")
    if finished is not None:
        saved = (out / CONFIG_FILE).read_text() if (out / CONFIG_FILE).is_file() else ""
        if not t.extend:
            differences = config_differences(saved, config)
            if differences:
                raise RelaunchError(f"{out}: a finished run (step {finished}) with a different config: "
                                    f"{'; '.join(differences)}. For a new run give another train.output_dir; "
                                    "train.restart=true deletes this one and trains again; train.extend=true with a "
                                    "larger train.max_steps continues it")
            return LaunchPlan("done", message=f"{out}: complete at step {finished}; nothing to do "
                                              "(train.extend=true continues it, train.restart=true starts over)")
        if not checkpoints:
            raise RelaunchError(f"{out}: train.extend needs a checkpoint, and the finished run kept none")
        return _checked_resume(checkpoints[-1], config, SCHEDULE_KEYS, "train.extend continues the finished run")
    if checkpoints:
        return _checked_resume(checkpoints[-1], config, frozenset(), "it holds a checkpoint to resume")
    return LaunchPlan("fresh")


def restart_targets(out: Path) -> list[Path]:
    """What train.restart removes from ``out``: the run outputs and checkpoint folders there."""
    if not out.is_dir():
        return []
    return [path for path in [out / name for name in RUN_OUTPUTS] + sorted(out.glob("checkpoint-*")) if path.exists()]


def _check_restart(config: RunConfig) -> None:
    """Refuse a restart that would delete what no run of ours wrote (a folder that only shares a
    name with a run's outputs: "runs", "model", "config.yaml") or the projector this launch loads."""
    out = Path(config.train.output_dir)
    targets = restart_targets(out)
    if not targets:
        return
    ours = (out / SUMMARY).is_file() or (out / RECORD).is_file() or complete_checkpoints(out)
    if not ours:
        raise RelaunchError(f"{out}: train.restart=true would delete {', '.join(p.name for p in targets)}, but the "
                            f"folder holds no llava-norm run (no {SUMMARY}, {RECORD} or complete checkpoint): give "
                            "another train.output_dir, or move them away first")
    projector = config.model.pretrained_projector
    if projector:
        where = Path(os.path.realpath(Path(projector).expanduser()))
        doomed = [t for t in targets if where == Path(os.path.realpath(t)) or Path(os.path.realpath(t)) in where.parents]
        if doomed:
            raise RelaunchError(f"{out}: train.restart=true would delete model.pretrained_projector {projector} (in "
                                f"{doomed[0].name}) before this launch loads it: copy it elsewhere first, or give "
                                "another train.output_dir")


def clear_outputs(config: RunConfig) -> None:
    """train.restart: remove what an earlier run wrote (rank 0; the others wait for no file)."""
    out = Path(config.train.output_dir)
    if int(os.environ.get("RANK", "0")) != 0 or not out.is_dir():
        return
    targets = restart_targets(out)
    trash = out / f"{REMOVING}restart-{int(time.time() * 1000)}"  # finish_removals: what a kill left of it
    trash.mkdir()
    for target in targets:
        os.replace(target, trash / target.name)  # one rename each: no half-deleted run is ever visible
    shutil.rmtree(trash, ignore_errors=True)
    log.info("train.restart: removed the earlier run's outputs from %s", out)
