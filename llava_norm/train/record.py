"""The provenance record of a training stage: what its output was computed from.

Owns which parts of a ``RunConfig`` are inputs (files and folders, compared by fingerprint:
the backbones, the stage-1 projector, the DeepSpeed file, each data source and its images),
which are settings (every other key that can change the weights), and which are neither (the
operational keys of ``llava_norm.train.relaunch``). ``run_training`` writes the record into
``output_dir`` when a run starts and again, marked complete with its outputs' fingerprints,
when it ends; ``scripts/pipeline.sh`` computes the same record for a YAML before deciding to
reuse a stage.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from llava_norm.config import RunConfig, to_yaml, world_size
from llava_norm.data.sources import hub_snapshot
from llava_norm.provenance import Record, differences, fingerprint, flatten, make_record, now, read_record, write_record
from llava_norm.train.relaunch import INPUT_KEYS, OPERATIONAL_KEYS, inert_keys  # INPUT_KEYS: inputs, by fingerprint


def training_record(config: RunConfig, world_size: int) -> Record:
    """The record of what training ``config`` on ``world_size`` processes would compute now (the
    number of processes sets the batch composition and, with a global batch size, the accumulation)."""
    flat = flatten(yaml.safe_load(to_yaml(config)))
    inputs: dict[str, str | None] = {key: flat.pop(key, None) for key in INPUT_KEYS}
    for index, source in enumerate(flat.pop("data.mixture", None) or []):
        if source.get("hub"):  # its local snapshot when cached, else the id (see provenance.fingerprint)
            snapshot = hub_snapshot(source["hub"], source.get("revision"))
            inputs[f"data.mixture.{index}.hub"] = snapshot or source["hub"]
            flat.update({f"data.mixture.{index}.{key}": source.get(key) for key in ("revision", "config", "split")})
        else:
            inputs[f"data.mixture.{index}.path"] = source.get("path")
        inputs[f"data.mixture.{index}.image_folder"] = source.get("image_folder")
        flat[f"data.mixture.{index}.take"] = source.get("take", "all")
    settings = {key: value for key, value in flat.items() if key not in OPERATIONAL_KEYS | inert_keys(flat)}
    settings["world_size"] = world_size
    if settings.get("train.precision") == "auto":  # bf16 on a GPU, fp32 on a CPU: different runs
        settings["train.precision"] = "bf16" if torch.cuda.is_available() else "fp32"
    return make_record(f"stage{config.train.stage}", settings, inputs, seed=config.train.seed)


CHANGED = "resumed_with_changes"  # in a record's config: what differed between the launches of one run


def start_record(config: RunConfig, changed: list[str], resuming: bool) -> Record:
    """Written when a launch starts: an interrupted run says what it was computing. A resume
    that differs from the launch it continues (a config change under
    ``train.allow_config_change``, or an input that changed in between) lists the changes, so
    the run never passes for one computed from a single set of inputs."""
    record = training_record(config, world_size())
    previous = read_record(config.train.output_dir) if resuming else None
    if previous is not None:
        earlier = previous.config.pop(CHANGED, [])
        changed = [*earlier, *changed, *(d for d in differences(previous, record) if d not in changed)]
    if changed:
        record.config[CHANGED] = list(dict.fromkeys(changed))
    write_record(config.train.output_dir, record)
    return record


def complete_finished_run(config: RunConfig, outputs: dict[str, Path]) -> None:
    """A relaunch of a finished run: if the last launch was stopped between its summary and its
    record, complete the record it started (same config, as the relaunch checked)."""
    record = read_record(config.train.output_dir)
    if record is not None and not record.complete:
        finish_record(config, record, outputs)


def finish_record(config: RunConfig, record: Record, outputs: dict[str, Path]) -> None:
    record.complete = True
    record.created = now()
    record.outputs = {name: fingerprint(path) for name, path in outputs.items() if Path(path).exists()}
    write_record(config.train.output_dir, record)
