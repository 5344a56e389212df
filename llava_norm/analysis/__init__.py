"""The paper's diagnostics (``llava-norm analyze <what>``): each writes a JSON of numbers and a PNG.

Python API (each returns the result dict and, given ``out_dir``, writes ``<kind>.json/.png``):
``interface_norms`` with rows from ``checkpoint_interface_norms`` / ``backbone_interface_norms``
(Tables 1-2), ``top_norm_result`` (App. C), ``layer_curves`` (Fig. 3-4), ``dynamics`` (App. F),
``gain_stats`` (Table 5), ``gradient_flow`` (GWC), ``attention_maps`` (App. G), ``write_report``,
and ``run_suite`` (all of them over finished runs, for ``make demo``).
"""

from llava_norm.analysis.attention import attention_maps
from llava_norm.analysis.common import Labeled, load_analysis_bundle, parse_labeled
from llava_norm.analysis.gains import gain_stats
from llava_norm.analysis.gradients import arm_bundles, gradient_flow, training_batch
from llava_norm.analysis.interface import (
    backbone_interface_norms,
    checkpoint_interface_norms,
    interface_norms,
    top_norm_result,
)
from llava_norm.analysis.layers import dynamics, layer_curves, layer_statistics
from llava_norm.analysis.report import write_report
from llava_norm.analysis.samples import SampleSet, load_samples
from llava_norm.analysis.suite import SuiteInputs, run_suite

__all__ = [
    "Labeled", "SampleSet", "SuiteInputs", "arm_bundles", "attention_maps", "backbone_interface_norms",
    "checkpoint_interface_norms", "dynamics", "gain_stats", "gradient_flow", "interface_norms", "layer_curves",
    "layer_statistics", "load_analysis_bundle", "load_samples", "parse_labeled", "run_suite", "top_norm_result",
    "training_batch", "write_report",
]
