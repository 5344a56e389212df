"""Sequence packing: the plan, isolation between samples, and exactness against unpacked rows."""

import json
import random

import pytest
import torch
from tinydata import token_examples, write_dataset

from llava_norm.data.collate import Example, collate
from llava_norm.data.conversation import IGNORE_INDEX
from llava_norm.data.dataset import BadSampleError
from llava_norm.data.packing import Pack, PackedDataset, PackSampler, collate_packed, plan_packs
from llava_norm.model.builder import ModelSpec, build_model

# fp32 sums in another order (a packed row reduces over other shapes) differ by rounding: a tied
# embedding's gradient of ~1 sums hundreds of token terms, so a relative 1e-5 is allowed too.
TOL = dict(rtol=1e-5, atol=1e-5)


def test_plan_packs_places_every_sample_once_within_budget():
    rng = random.Random(0)
    lengths = [rng.randint(1, 900) for _ in range(3000)] + [1000, 1000, 0]
    packs = plan_packs(lengths, 1000, seed=3)
    assert sorted(i for pack in packs for i in pack) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in pack) <= 1000 for pack in packs)
    assert sum(lengths) / (1000 * len(packs)) > 0.99  # best fit over many samples leaves little room
    assert plan_packs(lengths, 1000, seed=3) == packs and plan_packs(lengths, 1000, seed=4) != packs
    with pytest.raises(ValueError, match="longer than the row budget 1000"):
        plan_packs([5, 1001], 1000, seed=0)


def test_pack_sampler_fingerprint_covers_pack_contents():
    a, b = PackSampler([[0, 1], [2]], seed=1), PackSampler([[0, 2], [1]], seed=1)
    assert a.order(0) == b.order(0) and a.fingerprint(0) != b.fingerprint(0)


@pytest.fixture(scope="module", params=["siglip-llama-ln_textnorm_gwc", "clip-qwen2-none", "siglip-qwen3-scale_learned"])
def model(request, tiny_dir):
    vision, llm, arm = request.param.split("-", 2)
    bundle = build_model(ModelSpec(str(tiny_dir / vision), str(tiny_dir / llm), norm_alignment=arm, seed=0))
    return bundle.model.float().train()


def _sample_losses(logits, labels, spans):
    """Token-mean loss of each sample span (row, start, length) of a batch."""
    out = []
    for row, start, n in spans:
        pred = logits[row, start:start + n - 1]
        target = labels[row, start + 1:start + n]
        out.append(torch.nn.functional.cross_entropy(pred, target, ignore_index=IGNORE_INDEX))
    return out


def _packed(model, samples, layout, one_row=False):
    packs = [Pack([samples[i] for i in pack]) for pack in layout]
    batch = collate_packed(packs, pad_token_id=0, one_row=one_row)
    rows = [[i for pack in layout for i in pack]] if one_row else layout
    positions = {}
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            positions[i] = (r, at, len(samples[i].input_ids))
            at += len(samples[i].input_ids)
    return batch, [positions[i] for i in sorted(positions)]


def _assert_grad_close(ours, theirs, name):
    # Relative to the tensor's largest entry: tiny Qwen3's first-token embedding takes gradients
    # of ~1e3, whose rounding alone exceeds 1e-5.
    scale = max(float(theirs.abs().max()), 1.0)
    torch.testing.assert_close(ours / scale, theirs / scale, **TOL, msg=lambda m: f"{name}: {m}")


def _run(model, batch, spans):
    model.zero_grad()
    labels = batch["labels"]
    count = labels[..., 1:].ne(IGNORE_INDEX).sum()
    inputs = {k: v for k, v in batch.items() if k != "num_tokens"}
    out = model(**inputs, num_items_in_batch=count)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    logits = [out.logits[r, s:s + n].detach() for r, s, n in spans]
    return out.loss.detach(), logits, _sample_losses(out.logits.detach(), labels, spans), grads


@pytest.mark.parametrize("one_row", [False, True], ids=["rows", "one_row"])
def test_packed_equals_unpacked_per_sample(model, one_row):
    """Each sample's logits and loss, the global token-mean loss and every parameter gradient
    match the unpacked batch (fp32, CPU sdpa): text-only and image samples, two images in a row."""
    samples = token_examples(model.config)
    plain = collate(samples, pad_token_id=0)
    plain_spans = [(i, 0, len(s.input_ids)) for i, s in enumerate(samples)]
    loss, logits, losses, grads = _run(model, plain, plain_spans)
    layout = [[0, 1, 2], [3, 4], [5]]  # row 0: two images and a text-only sample between them
    batch, spans = _packed(model, samples, layout, one_row)
    assert "attention_mask" not in batch and batch["position_ids"][0, len(samples[0].input_ids)] == 0
    p_loss, p_logits, p_losses, p_grads = _run(model, batch, spans)
    torch.testing.assert_close(p_loss, loss, **TOL)
    for ours, theirs in zip(p_logits, logits):
        torch.testing.assert_close(ours, theirs, **TOL)
    for ours, theirs in zip(p_losses, losses):
        torch.testing.assert_close(ours, theirs, **TOL)
    assert grads.keys() == p_grads.keys() and any("multi_modal_projector" in n for n in grads)
    for name in grads:
        _assert_grad_close(p_grads[name], grads[name], name)


def test_a_packed_sample_gets_the_gradient_of_its_own_loss_only(model):
    samples = token_examples(model.config)
    batch, spans = _packed(model, samples, [[0, 1, 2, 3]])
    inputs = {k: v for k, v in batch.items() if k not in ("num_tokens", "labels")}
    model.zero_grad()
    out = model(**inputs)
    _sample_losses(out.logits, batch["labels"], spans[:4])[2].backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    alone = collate([samples[2]], pad_token_id=0)
    out = model(**{k: v for k, v in alone.items() if k != "labels"})
    _sample_losses(out.logits, alone["labels"], [(0, 0, len(samples[2].input_ids))])[0].backward()
    for name, grad in packed.items():
        _assert_grad_close(grad, model.get_parameter(name).grad, name)
    if model.lm_head.weight is not model.get_input_embeddings().weight:  # tied: every row is an output class
        # The other samples' tokens get exactly no gradient from sample 2's loss.
        embed = packed["model.language_model.embed_tokens.weight"]
        others = {t for i in (0, 1, 3) for t in samples[i].input_ids} - set(samples[2].input_ids)
        assert others and not embed[sorted(others)].any()


def test_changing_one_sample_leaves_the_others_unchanged(model):
    """No token attends across samples: samples 1, 2 and 3, all after sample 0 in the same row,
    keep their logits exactly when sample 0 changes (causality alone would not keep them)."""
    samples = token_examples(model.config)
    other = list(samples)
    # Same length, other tokens and image: the row's shapes stay the same, so equality is exact.
    changed = samples[0]
    assert changed.pixel_values is not None  # its image tokens change too
    ids = [t if t == model.config.image_token_id else (t + 1) % 5 + 10 for t in changed.input_ids]
    other[0] = Example(ids, changed.labels, changed.pixel_values.flip(-1) + 1)
    with torch.no_grad():
        first = [_run_logits(model, s) for s in (samples, other)]
    for i in (1, 2, 3):
        torch.testing.assert_close(first[0][i], first[1][i], rtol=0, atol=0)
    assert not torch.equal(first[0][0], first[1][0])


def _run_logits(model, samples):
    batch, spans = _packed(model, samples, [[0, 1, 2, 3]])
    out = model(**{k: v for k, v in batch.items() if k not in ("num_tokens", "labels")})
    return [out.logits[r, s:s + n] for r, s, n in spans[:4]]


# --- the packed dataset on real rows: the plan, and bad samples ----------------------------------

@pytest.fixture(scope="module")
def chat_bundle(tiny_dir):
    return build_model(ModelSpec(str(tiny_dir / "siglip"), str(tiny_dir / "llama"), norm_alignment="none", seed=0))


def _packed_dataset(bundle, data, images, budget=320, policy="skip", exact_lengths=False):
    from llava_norm.config import DataSource
    from llava_norm.data.conversation import conversation_tokenizer
    from llava_norm.data.dataset import SupervisedDataset

    encoder = conversation_tokenizer(bundle, "chat", {"date_string": "26 Jul 2024"})
    samples = SupervisedDataset([DataSource(path=str(data), image_folder=str(images))], encoder,
                                bundle.image_processor, min(256, budget), on_bad_sample=policy,
                                exact_lengths=exact_lengths)
    return PackedDataset(samples, budget, seed=42)


def test_packed_rows_hold_what_the_plan_says(chat_bundle, tmp_path):
    data, images = write_dataset(tmp_path, n=24, text_only_every=3)
    packed = _packed_dataset(chat_bundle, data, images)
    assert sorted(i for pack in packed.packs for i in pack) == list(range(24))
    assert any(len(pack) > 1 for pack in packed.packs)
    for index, pack in enumerate(packed.packs):
        examples = packed[index].examples
        assert [len(e.input_ids) for e in examples] == [packed.lengths[i] for i in pack]  # lengths are exact
        assert sum(packed.lengths[i] for i in pack) <= 320
    batch = collate_packed([packed[0], packed[1]], pad_token_id=0)
    assert batch["num_tokens"] == sum(packed.lengths[i] for i in packed.packs[0] + packed.packs[1])


def test_the_row_index_keeps_the_exact_lengths_packing_would_take(chat_bundle, tmp_path, monkeypatch):
    """With exact lengths in the row index (a packed run builds it so), the plan reads them and
    tokenises nothing; they equal the lengths taken at start-up, a truncated multi-turn row included."""
    data, images = write_dataset(tmp_path, n=12, text_only_every=3)
    rows = json.loads(data.read_text())
    turns = rows[5]["conversations"]
    rows[5]["conversations"] = turns + [{"from": "human", "value": "more " * 60},
                                        {"from": "gpt", "value": "answer " * 60}] * 3  # over 256: cut at a turn
    data.write_text(json.dumps(rows))
    taken = _packed_dataset(chat_bundle, data, images).lengths
    from llava_norm.data.conversation import ConversationTokenizer

    def refuse(*args, **kwargs):
        raise AssertionError("tokenised at start-up")

    monkeypatch.setattr(ConversationTokenizer, "encoded_lengths", refuse)
    kept = _packed_dataset(chat_bundle, data, images, exact_lengths=True)
    assert kept.lengths == taken and 0 < taken[5] < 256
    examples = kept[next(k for k, p in enumerate(kept.packs) if 5 in p)].examples
    assert 256 >= max(len(e.input_ids) for e in examples) and taken[5] in [len(e.input_ids) for e in examples]


def test_a_bad_sample_is_dropped_from_its_pack_with_its_record(chat_bundle, tmp_path):
    data, images = write_dataset(tmp_path, n=24, text_only_every=3)
    packed = _packed_dataset(chat_bundle, data, images)
    index, pack = next((k, p) for k, p in enumerate(packed.packs) if len(p) > 1)
    bad = next(i for i in pack if packed.samples.rows[i].image is not None)
    packed.samples.rows[bad].image.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    drawn = packed[index]
    assert len(drawn.examples) == len(pack) - 1  # dropped, not replaced: a replacement could overflow the row
    row = packed.samples.rows[bad]
    assert [(r["file"], r["row"], r["cause"]) for r in drawn.skipped] == [(row.source, row.row_id, "image_corrupt")]
    assert collate_packed([drawn], pad_token_id=0)["skipped_samples"] == drawn.skipped
    strict = _packed_dataset(chat_bundle, data, images, policy="error")
    with pytest.raises(BadSampleError, match=rf"{data}: row {row.row_id}: .*"):
        strict[index]


def test_a_pack_of_bad_samples_is_replaced_by_the_next_and_a_run_of_them_stops_the_draw(chat_bundle, tmp_path):
    data, images = write_dataset(tmp_path, n=24)
    packed = _packed_dataset(chat_bundle, data, images)
    index = 0
    bad = {packed.samples.rows[i].image for i in packed.packs[index]}
    assert not bad & {packed.samples.rows[i].image for i in packed.packs[index + 1]}  # no image shared
    for image in bad:
        image.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    drawn = packed[index]
    nxt = packed.packs[index + 1]
    assert [e.sample_id for e in drawn.examples] == [packed.samples.rows[i].row_id for i in nxt]
    assert sorted(r["row"] for r in drawn.skipped) == sorted(packed.samples.rows[i].row_id for i in packed.packs[index])
    for row in packed.samples.rows:  # every image bad (a wrong image folder): the draw stops, saying so
        row.image.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    with pytest.raises(BadSampleError, match=r"32 consecutive packs of bad samples from pack 0; last: .*not .*image"):
        packed[0]


def test_a_sample_that_cannot_fit_is_refused_when_planned(chat_bundle, tmp_path):
    data, images = write_dataset(tmp_path, n=12, text_only_every=3)
    rows = json.loads(data.read_text())
    rows[4]["conversations"][0]["value"] += " word" * 400  # its first turn alone is longer than max_length
    data.write_text(json.dumps(rows))
    packed = _packed_dataset(chat_bundle, data, images)
    assert 4 not in {i for pack in packed.packs for i in pack} and len(packed.samples.rejected) == 1
    assert packed.samples.rejected[0]["row"] == rows[4]["id"] and packed.samples.rejected[0]["cause"] == "too_long"
    with pytest.raises(BadSampleError, match=rf"{data}: row {rows[4]['id']}: first turn does not fit 256 tokens \(the smaller of"):
        _ = _packed_dataset(chat_bundle, data, images, policy="error").packs


def test_packing_refuses_an_llm_family_it_does_not_know_to_isolate(tiny_dir, tmp_path):
    from llava_norm.config import ConfigError, load_config

    data, images = write_dataset(tmp_path / "data", n=4)
    llm = tmp_path / "hybrid"
    llm.mkdir()
    (llm / "config.json").write_text(json.dumps({"model_type": "qwen3_next"}))
    path = tmp_path / "run.yaml"
    path.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {llm}}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], prompt_format: plain, packing: true}}
train: {{output_dir: {tmp_path}/out}}
""")
    with pytest.raises(ConfigError, match=r"key 'data.packing': the LLM is a 'qwen3_next' model"):
        load_config(path)
    assert load_config(path, ["data.packing=false"]).data.packing is False  # the refusal is packing's alone


def test_too_small_a_row_budget_stops_instead_of_dropping_every_image(chat_bundle, tmp_path):
    data, images = write_dataset(tmp_path, n=40)  # every row has an image, longer than 64 tokens
    with pytest.raises(BadSampleError, match="32 consecutive samples do not fit; last: .* 64 tokens"):
        _ = _packed_dataset(chat_bundle, data, images, budget=64).packs


def test_a_refused_packed_resume_rewrites_nothing(tmp_path, tiny_dir):
    """A relaunch whose data no longer gives the checkpoint's order is refused before the run's
    config and provenance record are rewritten, so the original command still finds its run."""
    from llava_norm.config import load_config
    from llava_norm.provenance import RECORD
    from llava_norm.train.run import run_training
    from llava_norm.train.trainer import ResumeError

    data, images = write_dataset(tmp_path / "data", n=12, text_only_every=3)
    path = tmp_path / "c.yaml"
    path.write_text(f"""
model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama}}
data: {{mixture: [{{path: {data}, image_folder: {images}}}], num_workers: 0, max_length: 256, packing: true,
       pack_max_tokens: 320}}
train: {{stage: 2, output_dir: {tmp_path}/out, max_steps: 1, per_device_batch_size: 2, grad_accum: 1,
        report_to: [], save_steps: 1, loss: fused}}
""")
    run_training(load_config(path))
    out = tmp_path / "out"
    before = {name: (out / name).read_bytes() for name in ("config.yaml", RECORD)}
    changed = ["train.extend=true", "train.max_steps=2", "train.allow_config_change=true", "data.pack_max_tokens=512"]
    with pytest.raises(ResumeError, match="no longer gives epoch 0's sample order"):
        run_training(load_config(path, changed))
    assert {name: (out / name).read_bytes() for name in before} == before
    assert run_training(load_config(path)) is None  # the original command: finished, nothing to do
    # the same config, rows edited since (longer replies: other packs): refused too, and not a file
    # of the run's folder is written or touched
    from launch import snapshot

    rows = json.loads(data.read_text())
    for row in rows[::2]:
        row["conversations"][-1]["value"] += " and then some more words" * 6
    data.write_text(json.dumps(rows))
    taken = snapshot(out)
    with pytest.raises(ResumeError, match="no longer gives epoch 0's sample order"):
        run_training(load_config(path, ["train.extend=true", "train.max_steps=2"]))
    assert snapshot(out) == taken
