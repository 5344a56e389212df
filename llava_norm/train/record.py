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

import yaml

from llava_norm.config import RunConfig, to_yaml, world_size
from llava_norm.provenance import Record, fingerprint, flatten, make_record, now, write_record
from llava_norm.train.relaunch import OPERATIONAL_KEYS

# Keys naming a file, folder or hub id: they enter the record as inputs, by fingerprint.
INPUT_KEYS = ("model.vision_tower", "model.llm", "model.pretrained_projector", "train.deepspeed")


def training_record(config: RunConfig, world_size: int) -> Record:
    """The record of what training ``config`` on ``world_size`` processes would compute now (the
    number of processes sets the batch composition and, with a global batch size, the accumulation)."""
    flat = flatten(yaml.safe_load(to_yaml(config)))
    inputs: dict[str, str | None] = {key: flat.pop(key, None) for key in INPUT_KEYS}
    for index, source in enumerate(flat.pop("data.mixture", None) or []):
        inputs[f"data.mixture.{index}.path"] = source.get("path")
        inputs[f"data.mixture.{index}.image_folder"] = source.get("image_folder")
        flat[f"data.mixture.{index}.take"] = source.get("take", "all")
    settings = {key: value for key, value in flat.items() if key not in OPERATIONAL_KEYS}
    settings["world_size"] = world_size
    return make_record(f"stage{config.train.stage}", settings, inputs, seed=config.train.seed)


def start_record(config: RunConfig, changed: list[str]) -> Record:
    """Written when a launch starts: an interrupted run says what it was computing. A resume
    under ``train.allow_config_change`` lists the changes, so the run never passes for one
    trained under a single config."""
    record = training_record(config, world_size())
    if changed:
        record.config["resumed_with_changes"] = list(changed)
    write_record(config.train.output_dir, record)
    return record


def finish_record(config: RunConfig, record: Record, outputs: dict[str, Path]) -> None:
    record.complete = True
    record.created = now()
    record.outputs = {name: fingerprint(path) for name, path in outputs.items() if Path(path).exists()}
    write_record(config.train.output_dir, record)
