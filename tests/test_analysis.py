"""The diagnostics: analytic values on models with known norms, masks, GWC gradient ratio, every CLI output."""

import json
import math
from pathlib import Path

import pytest
import torch
from PIL import Image
from tinydata import write_dataset
from transformers.modeling_outputs import BaseModelOutput

from llava_norm.analysis.common import Labeled
from llava_norm.analysis.gains import gain_stats
from llava_norm.analysis.gradients import arm_bundles, gradient_flow, training_batch
from llava_norm.analysis.interface import checkpoint_interface_norms, top_norm_rows
from llava_norm.analysis.layers import LayerAccumulator, layer_statistics, residual_stream
from llava_norm.analysis.masks import interleave_prompts, prompt_batches, token_masks
from llava_norm.analysis.samples import SampleSet
from llava_norm.model.builder import ModelSpec, build_model


def _bundle(tiny_dir, arm="none"):
    return build_model(ModelSpec(str(tiny_dir / "siglip"), str(tiny_dir / "llama"), norm_alignment=arm, seed=0))


def _images(n=3):
    return [Image.new("RGB", (40, 40), (60 * i, 200 - 50 * i, 90)) for i in range(n)]


def test_token_masks_with_left_padding_and_text_only_sample():
    pad, img, bos = 0, 99, 1
    ids = torch.tensor([[pad, pad, bos, img, img, 7, 8],
                        [pad, pad, pad, pad, bos, 5, 6],
                        [bos, 4, img, img, 9, 9, 3]])
    attention = (ids != pad).long()
    image, text = token_masks(ids, attention, img, exclude_token_ids=(bos,))
    assert image.tolist() == [[0, 0, 0, 1, 1, 0, 0], [0] * 7, [0, 0, 1, 1, 0, 0, 0]]
    assert text.tolist() == [[0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1, 1], [0, 1, 0, 0, 1, 1, 1]]


def test_masks_of_real_mixed_batch_match_where_the_model_puts_image_features(tiny_dir):
    bundle = _bundle(tiny_dir, "ln_textnorm_gwc")
    model = bundle.model.eval()
    prompts = interleave_prompts(_images(2), ["What colour is it?", "Describe the picture in detail please."])
    batch = next(prompt_batches(bundle, prompts, batch_size=4))
    n = model.config.image_seq_length
    assert [p.image is not None for p in prompts] == [True, False, True, False]
    assert batch.image_mask.sum(dim=1).tolist() == [n, 0, n, 0]
    attention = batch.inputs["attention_mask"].bool()
    assert not (batch.image_mask & batch.text_mask).any()
    assert not ((batch.image_mask | batch.text_mask) & ~attention).any()  # padding is neither
    assert (~attention[:, 0]).any(), "the batch must be left padded"
    with torch.no_grad(), residual_stream(model) as states:
        model(**batch.inputs, use_cache=False)
        features = model.model.get_image_features(batch.inputs["pixel_values"]).pooler_output
    assert len(states) == model.config.text_config.num_hidden_layers + 1
    torch.testing.assert_close(states[0][batch.image_mask], torch.cat(list(features)))


class FixedNormTower(torch.nn.Module):
    """A vision stub whose every hidden state has per-token L2 norm ``norm``."""

    def __init__(self, tokens, dim, norm):
        super().__init__()
        self.tokens, self.dim, self.norm = tokens, dim, norm
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, pixel_values, output_hidden_states=True, return_dict=True):
        g = torch.Generator().manual_seed(0)
        h = torch.randn(pixel_values.shape[0], self.tokens, self.dim, generator=g)
        h = h / h.norm(dim=-1, keepdim=True) * self.norm
        return BaseModelOutput(last_hidden_state=h, hidden_states=(h,) * 4)


def test_interface_norms_equal_analytic_values(tiny_dir):
    bundle = _bundle(tiny_dir, "ln_textnorm")
    model = bundle.model
    cfg = model.config
    d = cfg.text_config.hidden_size
    model.model.vision_tower = FixedNormTower(cfg.image_seq_length, cfg.vision_config.hidden_size, 7.5)
    projector = model.model.multi_modal_projector
    b2 = torch.linspace(-1.0, 2.0, d)
    with torch.no_grad():
        for linear in (projector.linear_1, projector.linear_2):
            linear.weight.zero_()
        projector.linear_2.bias.copy_(b2)
        emb = model.get_input_embeddings().weight
        nonzero = emb.norm(dim=-1) > 0
        emb[nonzero] = emb[nonzero] / emb[nonzero].norm(dim=-1, keepdim=True) * 0.37
    row = checkpoint_interface_norms(bundle, SampleSet(_images(3), ["a red square", "count the shapes"]))
    assert row["vision_output"]["mean"] == pytest.approx(7.5, rel=1e-6)
    assert row["vision_output"]["std"] == pytest.approx(0, abs=1e-5)
    assert row["vision_output"]["tokens"] == 3 * cfg.image_seq_length
    assert row["projector_output"]["mean"] == pytest.approx(float(b2.norm()), rel=1e-6)
    var = float(b2.var(unbiased=False))
    gain = cfg.text_norm / math.sqrt(d)  # the text-norm init
    expected = gain * math.sqrt(d * var / (var + cfg.norm_eps))
    assert row["norm_output"]["mean"] == pytest.approx(expected, rel=1e-5)
    assert row["text_norm_T"] == pytest.approx(0.37, rel=1e-6)
    assert row["text_tokens"]["mean"] == pytest.approx(0.37, rel=1e-6)


def test_top_norm_rows_are_the_scaled_rows_decoded(tiny_dir):
    bundle = _bundle(tiny_dir)
    tok = bundle.tokenizer
    emb = bundle.model.get_input_embeddings().weight.detach().clone()
    chosen = [300, 17, 450, 120, 77, 610, 205, 333, 58, 402, 150]  # 11 rows: the 11th must be left out
    with torch.no_grad():
        nonzero = emb.norm(dim=-1) > 0
        emb[nonzero] = emb[nonzero] / emb[nonzero].norm(dim=-1, keepdim=True)
        for rank, token in enumerate(chosen):
            emb[token] *= 20.0 - rank
    result = top_norm_rows(emb, tok, k=10)
    assert [r["token_id"] for r in result["rows"]] == chosen[:10]
    assert [r["norm"] for r in result["rows"]] == pytest.approx([20.0 - i for i in range(10)], rel=1e-6)
    assert [r["token"] for r in result["rows"]] == tok.convert_ids_to_tokens(chosen[:10])
    n = int(nonzero.sum())
    assert result["text_norm_T"] == pytest.approx((n - 11 + sum(20.0 - i for i in range(11))) / n, rel=1e-6)


def _rotating_states(angles, norms, batch=2, seq=6, seed=0):
    """Tokens in the (e0, e1) plane turning by angles[l] from boundary l to l+1, with norm norms[l]."""
    g = torch.Generator().manual_seed(seed)
    start = torch.rand(batch, seq, generator=g) * 6.28
    cumulative = [0.0] + list(torch.tensor(angles).cumsum(0).tolist())
    states = []
    for total, norm in zip(cumulative, norms):
        h = torch.randn(batch, seq, 5, generator=g) * 1e3  # padding positions get garbage
        h[..., 0], h[..., 1] = norm * torch.cos(start + total), norm * torch.sin(start + total)
        h[..., 2:] = 0
        states.append(h)
    return states


def test_layer_statistics_recover_known_rotations_and_norms():
    image_mask = torch.tensor([[0, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    text_mask = torch.tensor([[0, 0, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    img_angles, img_norms = [0.1, 0.05, 0.02], [40.0, 41.0, 43.0, 44.0]
    txt_angles, txt_norms = [0.9, 0.6, 0.3], [1.0, 3.0, 6.0, 9.0]
    img_states = _rotating_states(img_angles, img_norms)
    txt_states = _rotating_states(txt_angles, txt_norms, seed=1)
    states = [torch.where(text_mask[..., None], t, i) for i, t in zip(img_states, txt_states)]
    stats = layer_statistics(states, image_mask, text_mask)
    assert stats["image"]["tokens"] == 5 and stats["text"]["tokens"] == 3
    assert stats["image"]["cosine"] == pytest.approx([math.cos(a) for a in img_angles], rel=1e-6)
    assert stats["text"]["cosine"] == pytest.approx([math.cos(a) for a in txt_angles], rel=1e-6)
    assert stats["image"]["norm"] == pytest.approx(img_norms, rel=1e-6)
    assert stats["text"]["norm"] == pytest.approx(txt_norms, rel=1e-6)
    # Across batches the mean is over tokens: 5 tokens at cos(0.1) and 1 at cos(0.5).
    acc = LayerAccumulator()
    acc.add(states, {"image": image_mask, "text": text_mask})
    other = _rotating_states([0.5, 0.5, 0.5], img_norms, seed=2)
    one = torch.zeros_like(image_mask)
    one[0, 0] = True
    acc.add(other, {"image": one, "text": torch.zeros_like(one)})
    assert acc.result()["image"]["cosine"][0] == pytest.approx((5 * math.cos(0.1) + math.cos(0.5)) / 6, rel=1e-6)


def test_gwc_gradient_ratio_equals_mean_abs_gain(tiny_dir, tmp_path):
    data, images = write_dataset(tmp_path / "data", n=4)
    models = arm_bundles(str(tiny_dir / "siglip"), str(tiny_dir / "llama"), ("ln_textnorm", "ln_textnorm_gwc"), seed=0)
    result = gradient_flow(models, lambda b: training_batch(b, data, images, batch_size=2))
    plain, gwc = result["rows"]
    assert plain["loss"] == gwc["loss"]  # GWC leaves the forward pass unchanged
    mean_g = gwc["gain"]["gain_abs_mean"]
    assert mean_g < 0.1  # the text-norm init, T / sqrt(d)
    for key in ("projector_output", "projector_linear_1", "projector_linear_2", "vision_tower"):
        assert plain["grad_norms"][key] < gwc["grad_norms"][key]
        assert plain["grad_norms"][key] / gwc["grad_norms"][key] == pytest.approx(mean_g, rel=1e-3)
    assert plain["grad_norms"]["norm_gain"] == pytest.approx(gwc["grad_norms"]["norm_gain"], rel=1e-5)
    assert result["gwc_check"]["predicted_ratio_mean_abs_g"] == pytest.approx(mean_g)


def test_gain_stats_of_fresh_builds(tiny_dir, tmp_path):
    for arm in ("ln_default", "ln_textnorm_gwc", "none"):
        _bundle(tiny_dir, arm).save(tmp_path / arm)
    rows = gain_stats([Labeled(a, tmp_path / a) for a in ("ln_default", "ln_textnorm_gwc", "none")])["rows"]
    d = rows[0]["hidden_size"]
    assert rows[0]["gain_l2"] == pytest.approx(math.sqrt(d)) and rows[0]["gain_abs_mean"] == 1.0
    T = rows[1]["text_norm_T"]
    assert rows[1]["gain_l2"] == pytest.approx(T, rel=1e-5)
    assert rows[1]["gain_abs_mean"] == pytest.approx(T / math.sqrt(d), rel=1e-5) and rows[1]["bias_abs_mean"] == 0
    assert rows[2]["gain_l2"] is None


def test_every_subcommand_writes_json_and_png_and_the_report(tiny_dir, tmp_path):
    from llava_norm.cli import main
    from llava_norm.config import load_config
    from llava_norm.train.run import run_training

    data, images = write_dataset(tmp_path / "data", n=6, text_only_every=3)
    config = tmp_path / "c.yaml"
    config.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama, norm_alignment: ln_textnorm_gwc}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], num_workers: 0, max_length: 256}}
train: {{stage: 1, output_dir: {tmp_path}/run, max_steps: 2, per_device_batch_size: 2, grad_accum: 1,
        save_steps: 1, report_to: []}}
""")
    run_training(load_config(config))
    run, out = tmp_path / "run", str(tmp_path / "analysis")
    common = ["--out", out, "--device", "cpu"]
    samples = ["--samples", str(data), "--image-folder", str(images), "--limit", "3"]
    two = ["--checkpoint", f"gwc={run}/model", "--checkpoint", f"{run}/checkpoint-1"]
    commands = {
        "interface_norms": ["interface-norms", *two, "--vision", f"{tiny_dir}/siglip", "--llm", f"{tiny_dir}/llama",
                            *samples, *common],
        "top_norm_rows": ["top-norm-rows", "--llm", f"{tiny_dir}/qwen2", "--out", out],
        "layers": ["layers", *two, *samples, *common],
        "gain_stats": ["gain-stats", *two, "--out", out],
        "dynamics": ["dynamics", str(run), "--samples", str(images), "--limit", "2", *common],
        "gradient_flow": ["gradient-flow", "--vision", f"{tiny_dir}/clip", "--llm", f"{tiny_dir}/qwen2",
                          "--data", str(data), "--image-folder", str(images), "--batch-size", "2", *common],
        "attention": ["attention", *two, "--image", str(next(images.glob("*.png"))), "--prompt",
                      "What colour is the image?", "--phrase", "colour", "--layers", "-1", *common],
    }
    models = {"gwc", "run/checkpoint-1"}
    read = {"interface_norms": {*models, "samples", "vision", "llm"}, "top_norm_rows": {f"{tiny_dir}/qwen2"},
            "layers": {*models, "samples"}, "gain_stats": models, "dynamics": {"samples", "step 1", "step 2 (final)"},
            "gradient_flow": {"data", "image_folder", "vision", "llm"}, "attention": {*models, "image"}}
    for kind, argv in commands.items():
        main(["analyze", *argv])
        result = json.loads((tmp_path / "analysis" / f"{kind}.json").read_text())
        assert result["analysis"] == kind
        record = result["provenance"]  # what it was computed from, by fingerprint, and by which code
        assert record["stage"] == f"analysis:{kind}" and record["environment"]["source"]
        assert all(len(i["fingerprint"]) == 20 for i in record["inputs"].values())
        assert set(record["inputs"]) == read[kind], (kind, sorted(record["inputs"]))  # every file it read
        with Image.open(tmp_path / "analysis" / f"{kind}.png") as png:
            assert png.size[0] > 300 and png.size[1] > 200
    interface = json.loads((tmp_path / "analysis/interface_norms.json").read_text())["rows"]
    # The checkpoint and the bare backbones share the vision tower in stage 1: same vision norms.
    assert interface[0]["vision_output"]["mean"] == pytest.approx(interface[2]["vision_output"]["mean"], rel=1e-5)
    assert [c["label"] for c in json.loads((tmp_path / "analysis/dynamics.json").read_text())["curves"]] == [
        "step 1", "step 2 (final)"]  # the run ended at step 2: its final model is checkpoint-2 again
    main(["analyze", "report", out])
    report = (tmp_path / "analysis/REPORT.md").read_text()
    for kind in commands:
        assert f"![{kind}]({kind}.png)" in report
    # the two T's a report shows are told apart: each model's embeddings' now, and the one built with
    assert "| T (its embeddings) |" in report and "| T/√d (T as built) |" in report
    # The Python API make demo calls: every analysis over finished runs, then one report.
    from llava_norm.analysis import SuiteInputs, run_suite

    page = run_suite(SuiteInputs(runs={"gwc": run}, samples=data, data=data, image_folder=images, limit=2,
                                 attention_prompt="What colour is the image?", attention_phrase="colour",
                                 device="cpu"), tmp_path / "suite").read_text()
    for kind in commands:
        assert f"![{kind}]({kind}.png)" in page


def test_unlabelled_checkpoints_get_labels_that_tell_them_apart():
    """Plain paths are labelled by their last two parts, or as many more as keep them apart (two
    arms' stage2/model); the same label for two models is refused, naming both."""
    from llava_norm.analysis.common import parse_labeled

    one = parse_labeled(["runs/demo/none/stage2/model"])
    assert [m.label for m in one] == ["stage2/model"]
    two = parse_labeled(["runs/demo/none/stage2/model", "runs/demo/ln_textnorm_gwc/stage2/model", "gwc=x/model"])
    assert [m.label for m in two] == ["none/stage2/model", "ln_textnorm_gwc/stage2/model", "gwc"]
    assert [str(m.path) for m in two] == ["runs/demo/none/stage2/model", "runs/demo/ln_textnorm_gwc/stage2/model", "x/model"]
    with pytest.raises(ValueError, match="two models under the label 'a': x and y"):
        parse_labeled(["a=x", "a=y"])
    from llava_norm.cli import main

    with pytest.raises(SystemExit) as stop:  # the command says it in one line, naming itself
        main(["analyze", "gain-stats", "--checkpoint", "a=x", "--checkpoint", "a=y"])
    assert stop.value.code == "analyze gain-stats: two models under the label 'a': x and y; name them with LABEL=PATH"
    with pytest.raises(SystemExit) as stop:  # and a missing folder, named
        main(["analyze", "gain-stats", "--checkpoint", "/nowhere/stage2/model"])
    said = stop.value.code
    assert said == (f"analyze gain-stats: /nowhere/stage2/model: no such folder (from {Path.cwd()}); expected a saved "
                    "model dir, RUN/model, or a checkpoint-N dir")


def test_a_run_folder_or_a_folder_without_a_model_is_named_as_such(tmp_path, tiny_dir):
    """A training run's folder given where a model belongs is named as one, with its model's path;
    a folder without config.json is named as that, and a backbone as one."""
    from llava_norm.cli import main

    for backbone, kind in (("llama", "llama"), ("siglip", "siglip")):
        with pytest.raises(SystemExit) as stop:
            main(["analyze", "gain-stats", "--checkpoint", str(tiny_dir / backbone)])
        assert stop.value.code == (f"analyze gain-stats: {tiny_dir / backbone}: a {kind!r} model (its config.json), "
                                   "not one a llava-norm run saved (a backbone? give RUN/model)")

    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        main(["analyze", "gain-stats", "--checkpoint", str(tmp_path / "run")])
    assert stop.value.code == (f"analyze gain-stats: {tmp_path / 'run'} is a training run's folder: give its model, "
                               f"{tmp_path / 'run' / 'model'}, or one of its checkpoint-N dirs")
    with pytest.raises(SystemExit) as stop:
        main(["analyze", "gain-stats", "--checkpoint", str(tmp_path)])
    assert stop.value.code == (f"analyze gain-stats: {tmp_path}: no config.json; expected a saved model dir or a "
                               "checkpoint-N dir")


def test_report_names_a_damaged_json_and_a_missing_folder(tmp_path):
    from llava_norm.cli import main

    (tmp_path / "layers.json").write_text('{"analysis": "layers", "rows": [')  # cut short
    with pytest.raises(SystemExit) as stop:
        main(["analyze", "report", str(tmp_path)])
    assert str(stop.value.code).startswith(f"analyze report: {tmp_path / 'layers.json'}: not readable JSON ("), \
        stop.value.code
    with pytest.raises(SystemExit) as stop:
        main(["analyze", "report", str(tmp_path / "nowhere")])
    assert str(stop.value.code).startswith(f"analyze report: {tmp_path / 'nowhere'}: no such folder"), stop.value.code


def test_a_missing_llm_and_a_count_below_one_are_refused_in_one_line(capsys):
    """An LLM that is neither a folder nor a hub id (the loader's OSError), and --limit below 1
    (once taken as 'all but 3')."""
    from llava_norm.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["analyze", "top-norm-rows", "--llm", "/nowhere/llm"])
    assert str(stop.value.code).startswith("analyze top-norm-rows: ") and "/nowhere/llm" in str(stop.value.code)
    with pytest.raises(SystemExit) as stop:  # argparse's own refusal, naming the option
        main(["analyze", "interface-norms", "--samples", "x", "--limit=-3"])
    assert stop.value.code == 2 and "argument --limit: -3 is not at least 1" in capsys.readouterr().err


def test_dynamics_given_a_runs_model_folder_names_the_run_folder(tmp_path):
    """The new user's trial: `analyze dynamics RUN/model` said only that no checkpoint was there."""
    from llava_norm.analysis.layers import run_checkpoints

    (tmp_path / "run" / "model").mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as given_model:
        run_checkpoints(tmp_path / "run" / "model")
    assert str(given_model.value) == f"{tmp_path / 'run' / 'model'}: no complete checkpoint-N dirs and no model/ " \
        f"dir; give the training run's folder, {tmp_path / 'run'}"
    with pytest.raises(FileNotFoundError) as given_run:
        run_checkpoints(tmp_path / "run")
    assert str(given_run.value) == f"{tmp_path / 'run'}: no complete checkpoint-N dirs and no model/ dir"


def test_residual_states_are_each_layers_output_and_bos_is_no_text_token(tiny_dir):
    """The layer curves (Fig. 3/4) read the residual stream each decoder layer leaves, checked
    against transformers' own hidden states (the last one before the final norm), and the text
    curves leave out the BOS token every row holds (it would dominate the text norms)."""
    from llava_norm.model.builder import ModelSpec

    bundle = build_model(ModelSpec(str(tiny_dir / "siglip"), str(tiny_dir / "llama"), norm_alignment="ln_textnorm_gwc"))
    model = bundle.model.eval()
    images = [Image.new("RGB", (40, 40), (60 * i, 200 - 50 * i, 90)) for i in range(2)]
    batch = next(prompt_batches(bundle, interleave_prompts(images, ["What colour is it?", "Describe it."]), 4))
    ids, bos = batch.inputs["input_ids"], bundle.tokenizer.bos_token_id
    assert (ids == bos).any(dim=1).all() and not (batch.text_mask & (ids == bos)).any()
    with torch.no_grad(), residual_stream(model) as states:
        hidden = model(**batch.inputs, use_cache=False, output_hidden_states=True).hidden_states
    assert len(states) == len(hidden)
    for mine, theirs in zip(states[:-1], hidden[:-1]):
        torch.testing.assert_close(mine, theirs)
    torch.testing.assert_close(model.model.language_model.norm(states[-1]), hidden[-1])
    assert not torch.allclose(states[-1], hidden[-1])


@pytest.mark.parametrize("tower", ["siglip", "clip"])
def test_interface_norms_are_of_what_the_model_feeds_its_projector(tiny_dir, tower):
    """Tables 1/2's vision-output and projector-output norms, against the tensors the model itself
    hands its projector's first linear layer and gets from its second (SigLIP's full strategy,
    CLIP's CLS dropped, both at the configured feature layer)."""
    from llava_norm.data.images import preprocess

    bundle = build_model(ModelSpec(str(tiny_dir / tower), str(tiny_dir / "llama"), norm_alignment="ln_textnorm"))
    model = bundle.model.eval()
    images = [Image.new("RGB", (40, 40), (60 * i, 200 - 50 * i, 90)) for i in range(3)]
    row = checkpoint_interface_norms(bundle, SampleSet(images, ["a red square"]))
    seen, projector = {}, model.model.multi_modal_projector
    hooks = [projector.linear_1.register_forward_hook(lambda m, a, o: seen.update({"in": a[0]})),
             projector.linear_2.register_forward_hook(lambda m, a, o: seen.update({"out": o}))]
    with torch.no_grad():
        model.model.get_image_features(preprocess(images, bundle.image_processor))
    for hook in hooks:
        hook.remove()
    for key, stage in (("in", "vision_output"), ("out", "projector_output")):
        norms = seen[key].double().norm(dim=-1).flatten()
        assert row[stage]["tokens"] == norms.numel()
        assert row[stage]["mean"] == pytest.approx(float(norms.mean()), rel=1e-5)
        assert row[stage]["std"] == pytest.approx(float(norms.std(unbiased=False)), rel=1e-3, abs=1e-6)


def test_text_token_norms_are_of_the_prompts_own_embedding_rows(tiny_dir):
    bundle = build_model(ModelSpec(str(tiny_dir / "siglip"), str(tiny_dir / "llama"), norm_alignment="ln_textnorm"))
    prompts = ["a red square", "count the shapes"]
    row = checkpoint_interface_norms(bundle, SampleSet([Image.new("RGB", (40, 40))], prompts))
    embedding = bundle.model.get_input_embeddings().weight.detach().double()
    ids = [i for p in prompts for i in bundle.tokenizer(p, add_special_tokens=False).input_ids]
    norms = embedding[ids].norm(dim=-1)
    assert norms.std() > 1e-3 * norms.mean()  # rows of different norms: a wrong row would show
    assert row["text_tokens"]["tokens"] == len(ids)
    assert row["text_tokens"]["mean"] == pytest.approx(float(norms.mean()), rel=1e-6)


def test_gwc_observed_ratios_are_the_mean_abs_gain(tiny_dir, tmp_path):
    """The report's "without/with GWC" gradient ratios, measured on every part GWC scales (the
    projector's output, its linear layers without the norm, the vision tower), each mean|g|."""
    data, images = write_dataset(tmp_path / "data", n=4)
    models = arm_bundles(str(tiny_dir / "siglip"), str(tiny_dir / "llama"), ("ln_textnorm", "ln_textnorm_gwc"), seed=0)
    result = gradient_flow(models, lambda b: training_batch(b, data, images, batch_size=2))
    plain, gwc = result["rows"]
    mean_g = gwc["gain"]["gain_abs_mean"]
    assert plain["grad_norms"]["projector_linears"] / gwc["grad_norms"]["projector_linears"] == pytest.approx(
        mean_g, rel=1e-3)
    observed = result["gwc_check"]["observed_ratio"]
    assert set(observed) == {"projector_output", "projector_linears", "vision_tower"}
    assert all(v == pytest.approx(mean_g, rel=1e-3) for v in observed.values()), observed


def test_the_chosen_layers_and_heads_are_the_ones_averaged(tiny_dir):
    """``analyze attention --layers/--heads``: each (layer, head) map alone, their mean the map
    of all, and a negative layer counted from the last."""
    from llava_norm.analysis.attention import attention_map

    bundle = build_model(ModelSpec(str(tiny_dir / "siglip"), str(tiny_dir / "llama"), norm_alignment="ln_textnorm",
                                   attn_implementation="eager"))
    image, question = Image.new("RGB", (40, 40), (200, 30, 30)), "What colour is the image?"
    every = attention_map(bundle, image, question, "colour")
    n_layers, n_heads = len(every["layers"]), len(every["heads"])
    assert n_layers > 1 and n_heads > 1
    one = {(layer, head): torch.tensor(attention_map(bundle, image, question, "colour", layers=[layer],
                                                     heads=[head])["grid"])
           for layer in range(n_layers) for head in range(n_heads)}
    assert attention_map(bundle, image, question, "colour", layers=[-1])["layers"] == [n_layers - 1]
    torch.testing.assert_close(torch.stack(list(one.values())).mean(0), torch.tensor(every["grid"]))
    assert not torch.allclose(one[(0, 0)], one[(n_layers - 1, 0)])
    assert not torch.allclose(one[(0, 0)], one[(0, n_heads - 1)])
