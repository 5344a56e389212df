"""Model stage of the data flow: norm-alignment layer, projector, the LLaVA model, builders.

Importing it registers the LlavaNorm classes with transformers' Auto classes (``modeling``)."""

from llava_norm.model import modeling  # noqa: F401  (the Auto-class registration)
