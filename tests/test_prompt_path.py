"""One prompt path: an evaluation prompt is the exact prefix of the training sample with the same
turns, and the diagnostics feed a checkpoint exactly what evaluation feeds it.

The run below sets a system prompt, a chat-template date and pad-to-square images, none of them
defaults, so a consumer that built prompts its own way (or with default settings) would differ.
Training samples are built as ``train/run.py`` builds them, evaluation inputs are what
``llava-norm eval`` hands ``model.generate`` (captured), diagnostic inputs what ``analyze
layers`` / ``dynamics`` / ``attention`` hand the model's forward (captured).
"""

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from llava_norm.config import load_config, to_yaml
from llava_norm.data.conversation import conversation_tokenizer
from llava_norm.data.dataset import SupervisedDataset
from llava_norm.data.images import open_image, preprocess
from llava_norm.data.prompts import PromptSettings, training_prompt_settings
from llava_norm.inference import Predictor
from llava_norm.model.builder import ModelSpec, build_model, load_bundle

SYSTEM = "You describe shapes and colours."
DATE = "01 Jan 2030"
QUESTION = "What colour is the image?"
ANSWER = "The image is red."
COMPARED = ("input_ids", "attention_mask", "pixel_values")


@pytest.fixture(scope="module")
def run(tiny_dir, tmp_path_factory):
    """A run dir as training leaves it: config.yaml, model/ and a complete checkpoint-1/."""
    root = tmp_path_factory.mktemp("prompt_path")
    images = root / "images"
    images.mkdir()
    for name, size in (("wide.png", (64, 32)), ("tall.png", (24, 48))):  # not square: pad != resize
        Image.new("RGB", size, (220, 30, 30)).save(images / name)
    data = root / "data.json"
    data.write_text(json.dumps([{"id": "r0", "image": "wide.png", "conversations": [
        {"from": "human", "value": f"<image>\n{QUESTION}"}, {"from": "gpt", "value": ANSWER}]}]))
    yaml = root / "run.yaml"
    yaml.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: ln_textnorm_gwc}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], num_workers: 0, max_length: 512,
       system_prompt: "{SYSTEM}", template_kwargs: {{date_string: "{DATE}"}}, image_aspect: pad}}
train: {{stage: 1, output_dir: {root}/run, max_steps: 1, per_device_batch_size: 1, grad_accum: 1, report_to: []}}
""")
    config = load_config(yaml)
    out = root / "run"
    out.mkdir()
    (out / "config.yaml").write_text(to_yaml(config))
    bundle = build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama", norm_alignment="ln_textnorm_gwc"))
    bundle.save(out / "model")
    shutil.copytree(out / "model", out / "checkpoint-1")
    (out / "checkpoint-1" / "checkpoint_complete").write_text("")
    return SimpleNamespace(config=config, dir=out, images=images, bundle=bundle)


def _training_dataset(run):
    """What ``train/run.py`` trains on, built the way it builds it."""
    config = run.config
    encoder = conversation_tokenizer(run.bundle, config.data.prompt_format, dict(config.data.template_kwargs))
    return SupervisedDataset(config.data.mixture, encoder, run.bundle.image_processor, config.data.max_length,
                             config.data.image_aspect, config.data.on_bad_sample, config.data.length_estimate,
                             system_prompt=config.data.system_prompt)


def _evaluation_inputs(checkpoint, items, monkeypatch) -> list[dict]:
    """The tensors ``llava-norm eval`` hands ``model.generate`` for these items (prompt settings
    read as the eval CLI reads them, the Predictor built as ``run_evaluation`` builds it)."""
    from llava_norm.evaluation.runner import _predict_batch

    prompt = training_prompt_settings(checkpoint)
    predictor = Predictor(load_bundle(checkpoint), prompt.prompt_format, prompt.template_kwargs,
                          prompt.image_aspect, device="cpu", system_prompt=prompt.system_prompt)
    seen = []

    def generate(**kwargs):
        seen.append({k: kwargs[k].clone() for k in COMPARED if k in kwargs})
        ids = kwargs["input_ids"]
        return torch.cat([ids, torch.full((ids.shape[0], 1), predictor.stop_ids[0])], dim=1)

    monkeypatch.setattr(predictor.model, "generate", generate)
    _predict_batch(predictor, "generate", items, cap=None)
    return seen


def _item(text, image):
    return SimpleNamespace(item_id=text, prompt=text, image=image, max_new_tokens=4)


def test_evaluation_prompt_is_the_exact_prefix_of_the_training_sample(run, monkeypatch):
    trained = _training_dataset(run)[0]
    image = open_image(run.images / "wide.png")
    (asked,) = _evaluation_inputs(run.dir / "model", [_item(QUESTION, image)], monkeypatch)
    ids = asked["input_ids"][0].tolist()
    assert trained.input_ids[:len(ids)] == ids
    assert trained.labels[:len(ids)] == [-100] * len(ids)  # the prompt is context, never a target
    decode = run.bundle.tokenizer.decode
    assert decode(trained.input_ids[len(ids):], skip_special_tokens=True).strip() == ANSWER
    assert SYSTEM in decode(ids) and DATE in decode(ids)  # the run's settings, not the defaults
    assert torch.equal(asked["pixel_values"], trained.pixel_values)
    resized = preprocess([image], run.bundle.image_processor, "resize")
    assert not torch.equal(asked["pixel_values"], resized)  # the run's pad-to-square reached both


def _recording_loader(monkeypatch, module, seen):
    """Wrap ``module.load_analysis_bundle`` so every forward of the loaded model is recorded."""
    real = module.load_analysis_bundle

    def load(*args, **kwargs):
        bundle = real(*args, **kwargs)
        forward = bundle.model.forward

        def record(*f_args, **f_kwargs):
            seen.append({k: f_kwargs[k].detach().clone() for k in COMPARED if k in f_kwargs})
            return forward(*f_args, **f_kwargs)

        monkeypatch.setattr(bundle.model, "forward", record)
        return bundle

    monkeypatch.setattr(module, "load_analysis_bundle", load)


def _assert_same_inputs(diagnostic: dict, evaluation: dict):
    assert diagnostic.keys() <= evaluation.keys()
    for key, value in diagnostic.items():
        assert torch.equal(value.float(), evaluation[key].float()), key


def test_diagnostics_feed_the_model_what_evaluation_feeds_it(run, monkeypatch):
    from llava_norm.analysis import attention, layers
    from llava_norm.analysis.common import Labeled
    from llava_norm.analysis.masks import interleave_prompts
    from llava_norm.analysis.samples import SampleSet

    paths = [run.images / "wide.png", run.images / "tall.png"]
    samples = SampleSet([open_image(p) for p in paths], [QUESTION, "Describe the picture."], "test", paths)
    prompts = interleave_prompts(samples.images, samples.prompts)  # image and text-only prompts, mixed
    evaluation = _evaluation_inputs(run.dir / "model", [_item(p.text, p.image) for p in prompts], monkeypatch)
    assert len(evaluation) == 1 and evaluation[0]["input_ids"].shape[0] == len(prompts)
    assert (evaluation[0]["attention_mask"] == 0).any()  # left padding is part of what is compared

    seen: list[dict] = []
    _recording_loader(monkeypatch, layers, seen)
    _recording_loader(monkeypatch, attention, seen)
    layers.layer_curves([Labeled("final", run.dir / "model")], samples, batch_size=len(prompts), device="cpu")
    result = layers.dynamics(run.dir, samples, batch_size=len(prompts), include_final=False, device="cpu")  # App. F
    assert len(seen) == 2
    for diagnostic in seen:
        _assert_same_inputs(diagnostic, evaluation[0])
    assert [c["label"] for c in result["curves"]] == ["step 1"]
    assert result["curves"][0]["prompt"]["system_prompt"] == SYSTEM  # recorded beside the numbers

    seen.clear()
    attention.attention_maps([Labeled("final", run.dir / "model")], paths[0], QUESTION, "colour", layers=[-1],
                             device="cpu")
    (single,) = _evaluation_inputs(run.dir / "model", [_item(QUESTION, samples.images[0])], monkeypatch)
    (diagnostic,) = seen
    _assert_same_inputs(diagnostic, single)


def test_a_model_saved_outside_a_run_is_read_with_the_training_defaults(run, tmp_path):
    from llava_norm.config_schema import DataConfig

    run.bundle.save(tmp_path / "bare")
    assert training_prompt_settings(tmp_path / "bare") == PromptSettings.from_data(DataConfig().__dict__)
    assert PromptSettings().template_kwargs == dict(DataConfig().template_kwargs)  # one source of the defaults
    assert training_prompt_settings(run.dir / "checkpoint-1") == PromptSettings("chat", {"date_string": DATE}, SYSTEM,
                                                                                "pad")


def test_a_plain_format_run_is_read_as_its_training_samples_lay_out_image_and_text(run, tiny_dir, tmp_path):
    """Stage 1 ('plain': BOS, image, caption) has generation prompts with no text; the
    diagnostics read the prompt's text in the caption's place, token for token as a training
    sample with that caption, so App. F has text tokens to compare against."""
    from llava_norm.analysis.masks import prompt_batches
    from llava_norm.data.prompts import Prompt, PromptEncoder

    settings = PromptSettings(prompt_format="plain")
    image = open_image(run.images / "wide.png")
    encoder = PromptEncoder.for_bundle(run.bundle, settings)
    trained = encoder.example([{"role": "user", "content": f"<image>\n{QUESTION}"},
                               {"role": "assistant", "content": ANSWER}], [image])
    (batch,) = prompt_batches(run.bundle, [Prompt(ANSWER, image)], settings=settings)
    assert batch.inputs["input_ids"][0].tolist() == trained.input_ids
    assert torch.equal(batch.inputs["pixel_values"], trained.pixel_values)
    assert batch.text_mask.sum() > 0 and batch.image_mask.sum() > 0
    # Evaluation (generation) of the same run asks with the image alone.
    assert encoder.prompt_example(Prompt(ANSWER, image)).input_ids == trained.input_ids[:batch.image_mask.sum() + 1]


def test_evals_prompt_options_replace_the_runs_and_its_rows_are_named_after_the_run(run, tmp_path):
    """README, Evaluation: `--prompt-format` and `--system-prompt` ('' for none) replace what the
    run trained with; a row is named after the run's `train.run_name`, else its arm."""
    import dataclasses

    from llava_norm.evaluation.arguments import parse_eval_args

    def config(checkpoint, *extra):
        return parse_eval_args([str(checkpoint), "--benchmarks", "pope", "--data", f"pope={run.images}", *extra])

    trained = config(run.dir / "model")
    assert (trained.prompt.prompt_format, trained.prompt.system_prompt, trained.run_name) == \
        ("chat", SYSTEM, "ln_textnorm_gwc")
    given = config(run.dir / "model", "--prompt-format", "plain", "--system-prompt", "")
    assert (given.prompt.prompt_format, given.prompt.system_prompt) == ("plain", None)
    assert config(run.dir / "model", "--system-prompt", "Be brief.").prompt.system_prompt == "Be brief."
    named = tmp_path / "named"
    named.mkdir()
    (named / "model").symlink_to(run.dir / "model")
    (named / "config.yaml").write_text(to_yaml(dataclasses.replace(
        run.config, train=dataclasses.replace(run.config.train, run_name="mine"))))
    assert config(named / "model").run_name == "mine"
    assert config(named / "model", "--name", "given").run_name == "given"


def test_the_attention_map_is_the_phrases_attention_to_each_image_token(run):
    """App. G's map, recomputed by hand: the phrase's own tokens (found by their ids, not by the
    map's offsets) as queries, every layer's and head's attention from them to each image token,
    averaged, on the patch grid."""
    import math

    from llava_norm.analysis.attention import attention_map
    from llava_norm.analysis.common import load_analysis_bundle
    from llava_norm.data.prompts import Prompt, PromptEncoder

    bundle = load_analysis_bundle(run.dir / "model", torch.device("cpu"), attn_implementation="eager")
    image, settings = open_image(run.images / "wide.png"), training_prompt_settings(run.dir / "model")
    found = attention_map(bundle, image, QUESTION, "colour", settings=settings)
    example = PromptEncoder.for_bundle(bundle, settings).reading_example(Prompt(QUESTION, image))
    ids, phrase = example.input_ids, bundle.tokenizer(" colour", add_special_tokens=False).input_ids
    image_at = [i for i, token in enumerate(ids) if token == bundle.model.config.image_token_id]
    # the system turn says "colours" too: the question's phrase is the one after the image
    starts = [i for i in range(image_at[-1], len(ids)) if ids[i:i + len(phrase)] == phrase]
    assert len(starts) == 1
    queries = list(range(starts[0], starts[0] + len(phrase)))
    assert "".join(found["query_tokens"]).strip() == "colour"
    with torch.no_grad():
        out = bundle.model(input_ids=torch.tensor([ids]), pixel_values=example.pixel_values.to(bundle.model.dtype),
                           output_attentions=True, use_cache=False)
    by_hand = torch.stack([a[0].float() for a in out.attentions])[:, :, queries][..., image_at].mean(dim=(0, 1, 2))
    side = math.isqrt(len(image_at))
    assert torch.allclose(torch.tensor(found["grid"]), by_hand.reshape(side, side), atol=1e-6)
