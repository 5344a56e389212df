"""What a path given as a saved model is, said before anything loads.

Owns the checks of a path given where a saved model belongs: ``check_saved_model`` (``eval``
and ``chat``, before anything loads) names a missing folder, a training run's folder, one of its
checkpoints and a model of another kind (a backbone), each with what to give instead;
``check_model_kind``, which ``load_bundle`` runs for every command (the diagnostics load
checkpoints too), the last alone. transformers' own errors name a hub id's form, a tokenizer
backend, or a hundred model classes.
"""

from __future__ import annotations

import json
from pathlib import Path

from llava_norm.config_schema import is_hub_id
from llava_norm.layout import COMPLETE_MARKER, MODEL_DIR

MODEL_TYPE = "llava_norm"  # LlavaNormConfig.model_type: what a run's saved config.json says


def check_saved_model(path: str | Path) -> None:
    """Raise FileNotFoundError or ValueError naming what ``path`` is, unless it is a saved
    llava-norm model (or a hub id, which the loader resolves)."""
    folder = Path(path).expanduser()
    if not folder.exists() and not is_hub_id(str(path)):  # a hub id is loaded from the hub (or its cache)
        raise FileNotFoundError(f"{path}: no saved model here (from {Path.cwd()}; give a saved model directory, "
                                f"RUN/{MODEL_DIR}, or a Hugging Face hub id, organisation/name)")
    if not folder.is_dir():
        return
    config = folder / "config.json"
    # a checkpoint holds the model's config and weights, but not the tokenizer a saved model has
    if (folder / COMPLETE_MARKER).is_file() or (folder.name.startswith("checkpoint-") and not config.is_file()):
        raise ValueError(f"{path} is a training checkpoint (what a relaunch resumes from), not a saved model: the "
                         f"run's model is {folder.parent / MODEL_DIR}, written when the run ends")
    if not config.is_file() and (folder / MODEL_DIR / "config.json").is_file():
        raise ValueError(f"{path} is a training run's folder, not a saved model: its model is {folder / MODEL_DIR}")
    if not config.is_file():
        raise ValueError(f"{path}: no saved model here (no config.json); give a saved model directory, RUN/{MODEL_DIR}")
    check_model_kind(path)


def check_model_kind(path: str | Path) -> None:
    """ValueError where the folder's config.json names a model of another kind (a backbone), which
    the loader would meet as its own error listing a hundred model classes. Anything else (a hub
    id, no config.json, a checkpoint: the diagnostics load those) is left to the loader."""
    config = Path(path).expanduser() / "config.json"
    try:
        kind = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):  # none here, or not a JSON object: the loader says
        return
    if isinstance(kind, str) and kind != MODEL_TYPE:
        raise ValueError(f"{path}: a {kind!r} model (its config.json), not one a llava-norm run saved (a backbone? "
                         f"give RUN/{MODEL_DIR})")
