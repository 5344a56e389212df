"""llava-norm: LLaVA-1.5 with a norm-alignment layer between projector and LLM.

Importing the package registers ``LlavaNormConfig`` / ``LlavaNormForConditionalGeneration``
with transformers' Auto classes, so saved checkpoints load through
``AutoModelForImageTextToText.from_pretrained`` without ``trust_remote_code``.
"""

from llava_norm.model.norm_align import (
    NORM_ARMS,
    GlobalWeightCompensatedLayerNorm,
    text_embedding_norm,
)
from llava_norm.model.modeling import (
    LlavaNormConfig,
    LlavaNormForConditionalGeneration,
    LlavaNormModel,
)

__all__ = [
    "NORM_ARMS",
    "GlobalWeightCompensatedLayerNorm",
    "LlavaNormConfig",
    "LlavaNormForConditionalGeneration",
    "LlavaNormModel",
    "text_embedding_norm",
]
__version__ = "0.1.0"
