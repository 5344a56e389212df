"""train.compile: which layers are compiled, and that a compiled run trains as the eager one does."""

import json

import pytest
import torch
from tinydata import write_dataset

from llava_norm.config import load_config
from llava_norm.config_schema import ConfigError
from llava_norm.model.builder import ModelSpec, build_model
from llava_norm.model.compile import repeated_layers
from llava_norm.train.run import run_training


@pytest.mark.parametrize("vision, llm, classes", [("siglip", "llama", {"LlamaDecoderLayer", "SiglipEncoderLayer"}),
                                                  ("clip", "qwen2", {"Qwen2DecoderLayer", "CLIPEncoderLayer"})])
def test_the_compiled_layers_are_each_backbones_own_layers(tiny_dir, vision, llm, classes):
    model = build_model(ModelSpec(vision_tower=str(tiny_dir / vision), llm=str(tiny_dir / llm))).model
    layers = repeated_layers(model)
    config = model.config
    assert len(layers) == config.text_config.num_hidden_layers + config.vision_config.num_hidden_layers
    assert {type(layer).__name__ for layer in layers} == classes
    assert layers[0] is model.model.language_model.layers[0]


def _run(tmp_path, tiny_dir, name: str, extra: str) -> list[float]:
    data, images = write_dataset(tmp_path / "data", n=8, text_only_every=3)
    config = tmp_path / f"{name}.yaml"
    config.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: ln_textnorm_gwc}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], num_workers: 0, max_length: 256}}
train: {{stage: 2, output_dir: {tmp_path}/{name}, max_steps: 3, per_device_batch_size: 2, grad_accum: 2,
        gradient_checkpointing: true, report_to: [], save_steps: 100, {extra}}}
""")
    run_training(load_config(config))
    history = json.loads((tmp_path / name / "train_summary.json").read_text())["log_history"]
    return [h["loss"] for h in history if "loss" in h]


def test_a_compiled_run_compiles_every_layer_and_trains_as_the_eager_run(tmp_path, tiny_dir, monkeypatch):
    """aot_eager: dynamo's capture and AOTAutograd's joint graph, the parts of a compile that can
    change what is computed, without inductor's code generation (a C++ compile per graph on CPU)."""
    from torch._dynamo.utils import counters

    eager = _run(tmp_path, tiny_dir, "eager", "compile: false")
    counters.clear()
    compiled_modules, compile = [], torch.nn.Module.compile

    def spy(module, *args, **kwargs):
        compiled_modules.append(type(module).__name__)
        return compile(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "compile", spy)
    compiled = _run(tmp_path, tiny_dir, "compiled", "compile: true, compile_backend: aot_eager")
    # every layer of both stacks (the tiny backbones have 3 each), and the graphs ran
    assert sorted(compiled_modules) == ["LlamaDecoderLayer"] * 3 + ["SiglipEncoderLayer"] * 3
    assert counters["stats"]["unique_graphs"] >= 2  # at least the decoder layer's graph and the tower layer's
    assert len(eager) == len(compiled) == 3
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-5, atol=1e-6)


def test_an_unknown_compile_backend_is_refused_naming_the_key(tmp_path, tiny_dir):
    data, images = write_dataset(tmp_path / "data", n=2)
    config = tmp_path / "c.yaml"
    config.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}]}}
train: {{output_dir: {tmp_path}/out, compile: true, compile_backend: indcutor}}
""")
    with pytest.raises(ConfigError, match="train.compile_backend.*'indcutor'.*inductor"):
        load_config(config)
