"""The paper's diagnostics (``llava-norm analyze <what>``): each writes a JSON of numbers and a PNG.

Python API (each returns the result dict and, given ``out_dir``, writes ``<kind>.json/.png``):
``interface_norms`` with rows from ``checkpoint_interface_norms`` / ``backbone_interface_norms``
(Tables 1-2), ``top_norm_result`` (App. C), ``layer_curves`` (Fig. 3-4), ``dynamics`` (App. F),
``gain_stats`` (Table 5), ``gradient_flow`` (GWC), ``attention_maps`` (App. G), ``write_report``,
and ``run_suite`` (all of them over finished runs, for ``make demo``).

Names load on first use: the command line registers its subcommands without loading torch or
matplotlib.
"""

from importlib import import_module

_EXPORTS = {
    "attention_maps": "attention", "Labeled": "common", "load_analysis_bundle": "common", "parse_labeled": "common",
    "gain_stats": "gains", "arm_bundles": "gradients", "gradient_flow": "gradients", "training_batch": "gradients",
    "backbone_interface_norms": "interface", "checkpoint_interface_norms": "interface",
    "interface_norms": "interface", "top_norm_result": "interface", "dynamics": "layers", "layer_curves": "layers",
    "layer_statistics": "layers", "write_report": "report", "SampleSet": "samples", "load_samples": "samples",
    "SuiteInputs": "suite", "run_suite": "suite",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(f"llava_norm.analysis.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'llava_norm.analysis' has no attribute {name!r}")
