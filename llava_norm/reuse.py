"""The pipeline's reuse rule, one decision per step: reuse a step only when its provenance record
(``llava_norm.provenance``) matches the record of what it would compute now and its outputs are
still the ones recorded. Owns ``Decision`` and the checks of the training stages and of the
evaluations; ``llava_norm.pipeline`` runs the chain these decisions drive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llava_norm.config import load_config, naming_the_file
from llava_norm.config_checks import check_inputs, check_paths
from llava_norm.evaluation.arguments import parse_eval_args
from llava_norm.evaluation.predictions import read_json_output
from llava_norm.evaluation.settings import benchmark_settings, settings_differences
from llava_norm.layout import MODEL_DIR, PROJECTOR_FILE
from llava_norm.provenance import (Record, config_difference, differences, environment, environment_differences,
                                   fingerprint, read_record)
from llava_norm.train.record import training_record
from llava_norm.train.rundir import SUMMARY, complete_checkpoints


@dataclass
class Decision:
    reuse: bool
    reasons: list[str] = field(default_factory=list)  # why it must run: what differs, or what is missing
    notes: list[str] = field(default_factory=list)  # recorded differences that do not count (code, libraries)
    stale: bool = False  # an output exists, computed from something else (or unprovable)
    finished: bool = False  # that output is complete: the only kind --reuse-stale may keep
    forced: bool = False  # an earlier step of the same arm ran
    # recorded differences that leave the output as it is: the process count under a fixed global
    # batch (each optimizer step trains the same samples on any count; README, "Another number of
    # processes"), so a requeue on fewer nodes keeps a finished stage and resumes an interrupted one
    kept: list[str] = field(default_factory=list)


def compare(found: Record, expected: Record, code_counts: bool,
            ignore: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(what makes the output stale, what is only noted): a different code or library version
    is a note unless ``code_counts``; the config keys in ``ignore`` are neither."""
    reasons = differences(found, expected, ignore)
    notes = environment_differences(found.environment, expected.environment)
    return (reasons + notes, []) if code_counts else (reasons, notes)


def stage_decision(yaml_path: Path, overrides: list[str], out: Path, world: int, code_counts: bool) -> Decision:
    """Reuse a training stage only if its record matches what ``yaml_path`` + overrides would train now.

    A stage that is not reused also gets the launch's checks of this machine (packages,
    report_to's integrations, the DeepSpeed file's values), so that a problem is said in one
    line before anything launches (and by a dry run). A reused one gets only its input files'
    checks. Why: the machine's checks import transformers' model code, over a second of start-up
    in every sweep task and pipeline process, where a rerun that reuses its stages loads no model.
    """
    config = load_config(yaml_path, [*overrides, f"train.output_dir={out}"], check_paths=False)
    with naming_the_file(yaml_path):
        check_inputs(config)
        decision = _stage_decision(training_record(config, world), out, code_counts)
        if not decision.reuse:
            check_paths(config)
    return decision


def _stage_decision(expected: Record, out: Path, code_counts: bool) -> Decision:
    found = read_record(out)
    if found is None:
        holds_run = (out / SUMMARY).exists() or bool(complete_checkpoints(out))
        return Decision(False, ["its output has no provenance record" if holds_run else "not run yet"],
                        stale=holds_run)
    keep = ("world_size",) if expected.config.get("train.global_batch_size") is not None else ()
    reasons, notes = compare(found, expected, code_counts, keep)
    kept = [said for key in keep if (said := config_difference(found, expected, key))]
    outputs = {"model": out / MODEL_DIR, "projector": out / PROJECTOR_FILE}
    missing = [name for name in found.outputs if not outputs[name].exists()]
    changed = [name for name, recorded in found.outputs.items()
               if found.complete and name not in missing and recorded != fingerprint(outputs[name])]
    if found.complete:
        reasons += [f"output {name} is missing" for name in missing]
        reasons += [f"output {name} was changed after the run recorded it" for name in changed]
    # outputs no record describes (missing, or changed since): nothing to keep, even with --reuse-stale
    finished = found.complete and not missing and not changed
    if reasons:
        return Decision(False, reasons, notes, stale=True, finished=finished)
    if not found.complete:
        return Decision(False, ["interrupted: resuming it"], notes, kept=kept)
    return Decision(True, notes=notes, finished=True, kept=kept)


def eval_decision(argv: list[str], out: Path, code_counts: bool) -> Decision:
    """Reuse an evaluation only if every requested benchmark's result has the settings (checkpoint
    and data fingerprints included) that evaluating now would record."""
    config = parse_eval_args(argv)
    reasons, notes, stale, finished = [], [], False, True
    now = environment()
    for request in config.benchmarks:
        path = out / f"{request.name}.json"
        if not path.is_file():
            reasons.append(f"{request.name}: not evaluated yet")
            finished = False
            continue
        result = read_json_output(path)
        keys = settings_differences(result.get("settings", {}), benchmark_settings(config, request))
        env = environment_differences(result.get("environment", {}), now)
        if code_counts:
            keys, env = keys + env, []
        if keys:
            stale = True
            reasons.append(f"{request.name}: " + ", ".join(keys))
        notes += [f"{request.name}: {n}" for n in env]
    return Decision(not reasons, reasons, notes, stale=stale, finished=finished)
