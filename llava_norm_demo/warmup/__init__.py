"""Backbone warm-up for the offline tiny pipeline: make the random tiny backbones behave like
pretrained ones before the LLaVA stages load them.

A real LLaVA starts from an LLM pretrained on text and a vision tower pretrained
contrastively; with random tiny backbones stage 1 and 2 cannot learn to see. This package
gives the tiny LLM a short causal-LM pretraining on the synthetic world's text (``lm``) and
the tiny SigLIP a short sigmoid contrastive pretraining on its image-caption pairs
(``vision``), with a shared loop and atomic, marker-guarded outputs (``loop``), and saves
both in Hugging Face format, so the stages load them through ``from_pretrained`` like hub
checkpoints. Entry point: :func:`warm_up` (``run``); CLI ``llava-norm warmup``.
"""

from llava_norm_demo.warmup.loop import LoopConfig
from llava_norm_demo.warmup.run import REPORT, WarmupConfig, warm_up

__all__ = ["REPORT", "LoopConfig", "WarmupConfig", "warm_up"]
