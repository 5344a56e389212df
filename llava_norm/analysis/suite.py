"""Every diagnostic over a set of finished runs, then the report: what ``make demo`` calls.

Owns choosing sensible inputs for each analysis from run directories (their final ``model/``,
their ``checkpoint-N`` dirs, the backbones named in their ``config.yaml``), so a caller only
names the runs, a sample source and a training json.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from llava_norm.analysis.attention import attention_maps
from llava_norm.analysis.common import Labeled, analysis_device, labeled_inputs, load_analysis_bundle
from llava_norm.analysis.gains import gain_stats
from llava_norm.analysis.gradients import arm_bundles, gradient_flow, training_batch
from llava_norm.analysis.interface import checkpoint_interface_norms, interface_norms, top_norm_result
from llava_norm.analysis.layers import dynamics, layer_curves
from llava_norm.analysis.report import write_report
from llava_norm.analysis.samples import load_samples
from llava_norm.layout import CONFIG_FILE, MODEL_DIR


@dataclass
class SuiteInputs:
    runs: dict[str, Path]  # label -> training output_dir (with model/ and checkpoint-N/)
    samples: Path  # images folder, synthetic world or LLaVA json
    data: Path  # LLaVA json for the gradient-flow batch
    image_folder: Path | None = None  # image root of ``data`` (and of ``samples`` if it is a json)
    # The run dir whose checkpoints App. F follows and whose config names the backbones for the
    # gradient-flow builds (default: the last of ``runs``).
    dynamics_run: Path | None = None
    # label -> model dir for Tables 1-2 and for Table 5 (default: the final model of every run);
    # e.g. the models after stage 1, where Table 5 reads the gain.
    interface_models: dict[str, Path] | None = None
    gain_models: dict[str, Path] | None = None
    attention_prompt: str = "What colour is the largest shape in the picture?"
    attention_phrase: str = "largest shape"
    limit: int = 8
    device: str | None = None


def run_suite(inputs: SuiteInputs, out_dir: str | Path, title: str = "llava-norm diagnostics",
              report_path: str | Path | None = None) -> Path:
    """Runs all seven analyses into ``out_dir`` and writes the report (default ``out_dir/REPORT.md``);
    returns its path."""
    out = Path(out_dir)
    finals = [Labeled(label, Path(run) / MODEL_DIR) for label, run in inputs.runs.items()]
    interface = [Labeled(k, Path(v)) for k, v in inputs.interface_models.items()] if inputs.interface_models else finals
    gains = [Labeled(k, Path(v)) for k, v in inputs.gain_models.items()] if inputs.gain_models else finals
    samples = load_samples(inputs.samples, inputs.limit, inputs.image_folder)
    device = analysis_device(inputs.device)

    rows = []
    for item in interface:
        bundle = load_analysis_bundle(item.path, device)
        rows.append(checkpoint_interface_norms(bundle, samples, item.label))
    interface_norms(rows, samples, out, labeled_inputs(interface))
    # App. C reads the embedding matrix of the last model loaded above.
    top_norm_result(bundle.model.get_input_embeddings().weight, bundle.tokenizer, interface[-1].label, 10, out,
                    labeled_inputs(interface[-1:]))
    del bundle

    layer_curves(finals, samples, out, device=inputs.device)
    gain_stats(gains, out)
    run_dir = Path(inputs.dynamics_run) if inputs.dynamics_run else Path(list(inputs.runs.values())[-1])
    dynamics(run_dir, samples, out, device=inputs.device)

    config = OmegaConf.load(run_dir / CONFIG_FILE)
    gradient_flow(arm_bundles(config.model.vision_tower, config.model.llm, device=inputs.device),
                  lambda b: training_batch(b, inputs.data, inputs.image_folder), out,
                  {"vision": config.model.vision_tower, "llm": config.model.llm, "data": inputs.data,
                   "image_folder": inputs.image_folder})
    attention_maps(finals, samples.image_paths[0], inputs.attention_prompt, inputs.attention_phrase, out_dir=out,
                   device=inputs.device)
    return write_report([out], report_path or out / "REPORT.md", title)
