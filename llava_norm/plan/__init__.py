"""Memory and compute plan of a run before launch (``llava-norm plan``), from configs alone.

``backbones``: the architecture facts (local, cached, shipped or hub configs) and the meta model;
``flops``: the FLOP model; ``memory``: parameters, model states and traced activations;
``estimate``: the plan and the peak-memory model; ``report``: the printed plan and GPU names.
"""

from llava_norm.plan.estimate import Plan, make_plan
from llava_norm.plan.report import GPU_MEMORY_GIB, format_plan, gpu_memory, memory_text

__all__ = ["GPU_MEMORY_GIB", "Plan", "format_plan", "gpu_memory", "make_plan", "memory_text"]
