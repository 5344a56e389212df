"""llava-norm: LLaVA-1.5 with a norm-alignment layer between projector and LLM.

The public names below load on first use, so that ``llava-norm --help`` and the processes that
only orchestrate (pipeline, sweep, table) do not pay for torch and transformers. Loading the
model module (``import llava_norm.model``, any builder or loader, or one of the model names
below) registers ``LlavaNormConfig`` / ``LlavaNormForConditionalGeneration`` with transformers'
Auto classes, so saved checkpoints load through ``AutoModelForImageTextToText.from_pretrained``
without ``trust_remote_code``.
"""

from importlib import import_module

_EXPORTS = {
    "NORM_ARMS": "llava_norm.model.norm_align",
    "GlobalWeightCompensatedLayerNorm": "llava_norm.model.norm_align",
    "text_embedding_norm": "llava_norm.model.norm_align",
    "LlavaNormConfig": "llava_norm.model.modeling",
    "LlavaNormForConditionalGeneration": "llava_norm.model.modeling",
    "LlavaNormModel": "llava_norm.model.modeling",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'llava_norm' has no attribute {name!r}")
