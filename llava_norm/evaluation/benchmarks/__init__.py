"""Benchmark formats, prompts and community scoring rules for the paper's nine benchmarks.

Owns: one module per benchmark (its ``Declaration``, loader, prompt builder, scorer,
settings), the shared item types, declaration and registry (``base``), file/row/image
reading and the row-per-item load loop (``tabular``) and the multiple-choice helpers every
MCQ scorer uses (``mcq``). Importing this package registers all nine. Code outside a
benchmark's module reads its facts (data directory, files, headline, chance, ...) from
``BENCHMARKS[name].declaration`` and nowhere else:

    bench = get_benchmark("ai2d", variant="no_mask")
    items = bench.load("/data/ai2d-no-mask")
    metrics = bench.score(items, {item.item_id: reply for ...})
"""

from llava_norm.evaluation.benchmarks.base import (
    BENCHMARKS,
    Benchmark,
    Declaration,
    EncodedImage,
    GenerationItem,
    Headline,
    Item,
    LoglikelihoodItem,
    get_benchmark,
    register_benchmark,
)

# Imported for their registration side effect; order fixes BENCHMARKS' iteration order.
from llava_norm.evaluation.benchmarks.mmbench import MMBenchEnDev
from llava_norm.evaluation.benchmarks.mmstar import MMStar
from llava_norm.evaluation.benchmarks.ocrbench import OCRBench
from llava_norm.evaluation.benchmarks.seedbench2plus import SEEDBench2Plus
from llava_norm.evaluation.benchmarks.scienceqa import ScienceQAImg
from llava_norm.evaluation.benchmarks.ai2d import AI2D
from llava_norm.evaluation.benchmarks.pope import POPE
from llava_norm.evaluation.benchmarks.hellaswag import HellaSwag
from llava_norm.evaluation.benchmarks.mmlu import MMLU

__all__ = [
    "AI2D",
    "BENCHMARKS",
    "Benchmark",
    "Declaration",
    "EncodedImage",
    "GenerationItem",
    "HellaSwag",
    "Headline",
    "Item",
    "LoglikelihoodItem",
    "MMBenchEnDev",
    "MMLU",
    "MMStar",
    "OCRBench",
    "POPE",
    "SEEDBench2Plus",
    "ScienceQAImg",
    "get_benchmark",
    "register_benchmark",
]
