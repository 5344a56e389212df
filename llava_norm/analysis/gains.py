"""Table 5: statistics of the norm layer's gain g and bias b, per checkpoint.

Owns reading only the norm layer's two tensors out of a checkpoint's safetensors (single file
or sharded with an index), so the table for a 7B run does not load 7B parameters, and feeding
them through ``GlobalWeightCompensatedLayerNorm.gain_statistics`` (the same numbers training logs).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from safetensors import safe_open
from transformers.utils import SAFE_WEIGHTS_NAME

from llava_norm.analysis.common import Labeled, labeled_inputs, saved_model_config, write_result
from llava_norm.analysis.plots import gains_figure
from llava_norm.layout import NORM_PREFIX
from llava_norm.model.norm_align import GlobalWeightCompensatedLayerNorm, get_arm



def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file holding it."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return {k: path / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    single = path / SAFE_WEIGHTS_NAME
    if not single.is_file():
        raise FileNotFoundError(f"{path}: neither model.safetensors nor model.safetensors.index.json")
    with safe_open(str(single), framework="pt") as f:
        return {k: single for k in f.keys()}


def read_norm_layer(path: str | Path) -> GlobalWeightCompensatedLayerNorm | None:
    """The checkpoint's norm layer (None for an arm without one: ``none`` and the scaling arms)."""
    path = Path(path)
    config = saved_model_config(path)
    arm = get_arm(config.get("norm_alignment", "none"))
    if not arm.normalises:  # no gain: nothing for Table 5
        return None
    files = _tensor_files(path)
    names = [NORM_PREFIX + "weight", *([] if arm.layer == "rmsnorm" else [NORM_PREFIX + "bias"])]
    if names[0] not in files:
        raise ValueError(f"{path}: config says norm_alignment={arm.name!r} but the weights have no {names[0]}")
    tensors = {}
    for name in names:
        with safe_open(str(files[name]), framework="pt") as f:
            tensors[name.rsplit(".", 1)[1]] = f.get_tensor(name).float()
    layer = GlobalWeightCompensatedLayerNorm(tensors["weight"].numel(), rms=arm.layer == "rmsnorm")
    layer.load_state_dict(tensors)
    return layer


def checkpoint_gain_stats(path: str | Path, label: str) -> dict:
    config = saved_model_config(path)
    d = config["text_config"]["hidden_size"]
    T = config.get("text_norm")
    layer = read_norm_layer(path)
    row = {"label": label, "path": str(path), "norm_alignment": config.get("norm_alignment", "none"),
           "hidden_size": d, "text_norm_T": T,
           # The text-norm init: every g_i = T / sqrt(d), so ||g|| = T and mean|g| = T / sqrt(d).
           "text_norm_init_abs_mean": T / math.sqrt(d) if T else None}
    if layer is None:
        return {**row, "gain_l2": None, "gain_abs_mean": None, "gain_abs_std": None, "bias_abs_mean": None}
    return {**row, **layer.gain_statistics()}


def gain_stats(models: list[Labeled], out_dir: str | Path | None = None) -> dict:
    rows = [checkpoint_gain_stats(m.path, m.label) for m in models]
    return write_result({"analysis": "gain_stats", "rows": rows}, out_dir, gains_figure(rows),
                        labeled_inputs(models))
