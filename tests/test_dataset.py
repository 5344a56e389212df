"""Bad input: each case names the file and row id; skip mode counts; grouped sampler properties."""

import json

import pytest
import torch

from tinydata import write_dataset

from llava_norm.config import DataSource
from llava_norm.data.conversation import conversation_tokenizer
from llava_norm.data.dataset import BadSampleError, SupervisedDataset
from llava_norm.data.sampler import ModalityLengthGroupedSampler, ShuffledSampler, grouped_order
from llava_norm.model.builder import ModelSpec, build_model

GOOD = {"id": "ok", "image": "0001.png", "conversations": [
    {"from": "human", "value": "<image>\nWhat colour?"}, {"from": "gpt", "value": "Red."}]}
BAD_ROWS = {
    "malformed": ({"id": "m1", "conversations": "not a list"}, "missing or empty 'conversations'"),
    "empty": ({"id": "e1", "conversations": []}, "missing or empty 'conversations'"),
    "role": ({"id": "r1", "conversations": [{"from": "robot", "value": "hi"}, {"from": "gpt", "value": "x"}]},
             r"unknown role 'robot' \(expected one of human\|gpt\|system\|user\|assistant\)"),
    "misspelt": ({"id": "s1", "conversation": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x"}]},
                 r"missing or empty 'conversations' \(it has 'conversation'\)"),
    "count": ({"id": "c1", "image": "0001.png", "conversations": [
        {"from": "human", "value": "<image> <image> two?"}, {"from": "gpt", "value": "x"}]}, "2 '<image>' placeholders"),
    "no_placeholder": ({"id": "c2", "image": "0001.png", "conversations": [
        {"from": "human", "value": "where is it"}, {"from": "gpt", "value": "x"}]}, "0 '<image>' placeholders"),
}


@pytest.fixture(scope="module")
def bundle(tiny_dir):
    return build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama"))


def _dataset(bundle, rows, tmp_path, policy, max_length=512, **options):
    _, images = write_dataset(tmp_path, n=2)
    (images / "broken.png").write_bytes(b"\x89PNG not really")
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    encoder = conversation_tokenizer(bundle, "chat", {"date_string": "26 Jul 2024"})
    return path, SupervisedDataset([DataSource(path=str(path), image_folder=str(images))], encoder,
                                   bundle.image_processor, max_length, on_bad_sample=policy, **options)


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_malformed_rows_name_file_and_row(bundle, tmp_path, case):
    row, message = BAD_ROWS[case]
    with pytest.raises(BadSampleError, match=rf"rows.json: row {row['id']}: .*{message}"):
        _dataset(bundle, [GOOD, row], tmp_path, "error")
    path, dataset = _dataset(bundle, [GOOD, row], tmp_path, "skip")
    assert len(dataset) == 1 and len(dataset.rejected) == 1
    assert dataset.rejected[0]["file"] == str(path) and dataset.rejected[0]["row"] == row["id"]


@pytest.mark.parametrize("image,message", [("missing.png", "image not found"), ("broken.png", "cannot decode image")])
def test_bad_images_are_skipped_and_counted_or_raise(bundle, tmp_path, image, message):
    bad = {**GOOD, "id": "img1", "image": image}
    _, dataset = _dataset(bundle, [bad, GOOD], tmp_path, "error")
    with pytest.raises(BadSampleError, match=rf"rows.json: row img1: {message}"):
        dataset[0]
    _, dataset = _dataset(bundle, [bad, GOOD], tmp_path, "skip")
    example = dataset[0]  # replaced by the next good row, the skip recorded
    assert example.sample_id == "ok" and len(example.skipped) == 1 and example.skipped[0]["row"] == "img1"
    assert any(label != -100 for label in example.labels)


def test_a_sample_too_long_stops_the_run_under_error(bundle, tmp_path):
    """(Under skip it is replaced and recorded: test_bad_data.py::test_over_long_sample_is_replaced_and_recorded.)"""
    _, dataset = _dataset(bundle, [GOOD, {**GOOD, "id": "two"}], tmp_path, "error", max_length=20)
    with pytest.raises(BadSampleError, match="row ok: first turn does not fit max_length=20"):
        dataset[0]


def test_token_length_estimate_matches_encoded_length(bundle, tmp_path):
    """The grouped sampler sorts by what a batch will really hold: each row's encoded length
    (image tokens included, capped at max_length), not a word count."""
    text_only = {"id": "t", "conversations": [{"from": "human", "value": "What is two plus two?"},
                                              {"from": "gpt", "value": "Four, as everyone knows."}]}
    multi = {**GOOD, "id": "m", "conversations": GOOD["conversations"] + text_only["conversations"]}
    rows = [GOOD, text_only, multi]
    _, dataset = _dataset(bundle, rows, tmp_path, "error")
    encoded = [len(dataset.build(row).input_ids) for row in dataset.rows]
    assert [abs(n) for n in dataset.modality_lengths] == encoded
    assert [n > 0 for n in dataset.modality_lengths] == [True, False, True]
    _, capped = _dataset(bundle, rows, tmp_path, "error", max_length=70)
    assert [abs(n) for n in capped.modality_lengths] == [min(n, 70) for n in encoded]
    path, _ = _dataset(bundle, rows, tmp_path, "error")
    encoder = conversation_tokenizer(bundle, "chat", {"date_string": "26 Jul 2024"})
    images = dataset.rows[0].image.parent
    words = SupervisedDataset([DataSource(path=str(path), image_folder=str(images))], encoder,
                              bundle.image_processor, 512, length_estimate="words")
    assert [abs(n) for n in words.modality_lengths] != encoded  # the cheap estimate is only an estimate
    with pytest.raises(ValueError, match="data.length_estimate must be one of"):
        SupervisedDataset([DataSource(path=str(path))], encoder, bundle.image_processor, 512, length_estimate="chars")


def test_system_prompt_is_trained_and_matches_the_eval_prompt(bundle, tmp_path):
    """``data.system_prompt`` reaches every training row that has no system turn of its own, and
    the evaluation prompt (same encoder, same setting) is exactly the training sample's prefix."""
    from PIL import Image

    from llava_norm.inference import Prompt

    own = {**GOOD, "id": "own", "conversations": [{"from": "system", "value": "Own rules."}, *GOOD["conversations"]]}
    system = "You describe shapes."
    _, dataset = _dataset(bundle, [GOOD, own], tmp_path, "error", system_prompt=system)
    decode = bundle.tokenizer.decode
    trained, kept = (dataset.build(row) for row in dataset.rows)
    assert system in decode(trained.input_ids) and "Own rules." in decode(kept.input_ids)
    assert system not in decode(kept.input_ids)
    assert system not in decode([t for t in trained.labels if t != -100])  # context, not a target
    prompt = Prompt("What colour?", image=Image.new("RGB", (8, 8)), system=system)
    asked = dataset.encoder.encode(prompt.messages(), add_generation_prompt=True).input_ids
    assert trained.input_ids[:len(asked)] == asked
    _, plain = _dataset(bundle, [GOOD, own], tmp_path, "error")
    assert system not in decode(plain.build(plain.rows[0]).input_ids)


def test_grouped_sampler_properties():
    lengths = [100 + i for i in range(37)] + [-(5 + i) for i in range(23)]
    order = grouped_order(lengths, megabatch_size=4, seed=42, epoch=0)
    assert sorted(order) == list(range(60))
    assert order == grouped_order(lengths, 4, seed=42, epoch=0)
    assert order != grouped_order(lengths, 4, seed=42, epoch=1)
    full_batches = [order[i:i + 4] for i in range(0, 56, 4)]
    mixed = [b for b in full_batches if len({lengths[i] > 0 for i in b}) > 1]
    assert len(mixed) <= 1  # only the tail megabatch may mix modalities
    for single_modality in ([7] * 10, [-7] * 10):
        assert sorted(ModalityLengthGroupedSampler(single_modality, 3).__iter__()) == list(range(10))
    sampler = ModalityLengthGroupedSampler(lengths, batch_size=2, world_size=2, seed=1)
    sampler.set_epoch(3)
    assert list(sampler) == grouped_order(lengths, 4, seed=1, epoch=3)
    # train.seed moves the order too (each seed of a sweep sees its own), in both samplers
    assert order != grouped_order(lengths, 4, seed=43, epoch=0)
    assert ShuffledSampler(60, seed=1).order(0) != ShuffledSampler(60, seed=2).order(0)
    assert sorted(ShuffledSampler(60, seed=1).order(0)) == list(range(60))
    # the modalities' megabatches are shuffled together: each half of an epoch holds steps of both
    even = [100 + i for i in range(40)] + [-(5 + i) for i in range(40)]
    steps = [even[grouped_order(even, 4, seed=0, epoch=0)[i]] > 0 for i in range(0, 80, 4)]
    assert set(steps[:10]) == set(steps[10:]) == {True, False}, steps


def _padding_share(order, lengths, batch_size):
    batches = [order[i:i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    slots = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    return 1 - sum(lengths[i] for b in batches for i in b) / slots


def test_grouped_sampler_lookahead_sorts_across_megabatches():
    generator = torch.Generator().manual_seed(0)
    lengths = (torch.randint(100, 1000, (400,), generator=generator) * torch.tensor([1, -1]).repeat(200)).tolist()
    one = grouped_order(lengths, megabatch_size=4, seed=3, epoch=0, lookahead=1)
    wide = grouped_order(lengths, megabatch_size=4, seed=3, epoch=0, lookahead=16)
    assert sorted(wide) == list(range(400)) and wide == grouped_order(lengths, 4, seed=3, epoch=0, lookahead=16)
    magnitudes = [abs(n) for n in lengths]
    assert _padding_share(wide, magnitudes, 2) < _padding_share(one, magnitudes, 2) / 3
    assert all(len({lengths[i] > 0 for i in wide[i:i + 4]}) == 1 for i in range(0, 400, 4))  # modality kept apart
    with pytest.raises(ValueError, match="lookahead"):
        grouped_order(lengths, 4, seed=3, epoch=0, lookahead=0)


# LLaVA-665K-style rows: the image placeholder after the question, and a conversation that
# opens with a gpt turn (both occur in liuhaotian/LLaVA-Instruct-150K / the 665K mix).
IMAGE_LAST = {"id": "000000033471", "image": "0001.png", "conversations": [
    {"from": "human", "value": "What are the colors of the bus in the image?\n<image>"},
    {"from": "gpt", "value": "The bus in the image is white and red."},
    {"from": "human", "value": "What feature can be seen on the back of the bus?"},
    {"from": "gpt", "value": "The back of the bus features an advertisement."}]}
GPT_FIRST = {"id": "gpt-first", "image": "0002.png", "conversations": [
    {"from": "gpt", "value": "Hello! Ask me about the picture."},
    {"from": "human", "value": "<image>\nWhat colour is it?"}, {"from": "gpt", "value": "Blue."}]}


def test_llava_conventions_image_to_the_front_and_a_first_gpt_turn_dropped(bundle, tmp_path):
    _, dataset = _dataset(bundle, [IMAGE_LAST, GPT_FIRST, GOOD], tmp_path, "error")
    assert len(dataset) == 3 and not dataset.rejected
    rows = {dataset.rows[i].row_id: dataset.rows[i].messages for i in range(3)}
    # as LLaVA's preprocess_multimodal: '<image>' + newline + the rest of the turn, stripped
    assert rows["000000033471"][0]["content"] == "<image>\nWhat are the colors of the bus in the image?"
    assert [m["content"] for m in rows["000000033471"][1:]] == [t["value"] for t in IMAGE_LAST["conversations"][1:]]
    # the opening gpt turn goes (LLaVA drops that one turn), the rest of the row stays
    assert [m["role"] for m in rows["gpt-first"]] == ["user", "assistant"]
    assert rows["ok"][0]["content"] == GOOD["conversations"][0]["value"]  # already at the front: unchanged
    assert dataset.adjusted == {"image_moved_to_front": 1, "first_gpt_turn_dropped": 1}
    # the training sample then opens as evaluation's prompt does: the image's tokens, then the question
    image_token = bundle.model.config.image_token_id
    ids = dataset[0].input_ids
    first_image = ids.index(image_token)
    question = bundle.tokenizer.decode(ids[first_image + bundle.model.config.image_seq_length:][:20])
    assert question.lstrip().startswith("What are the colors")


def test_keep_leaves_the_placeholder_where_the_data_puts_it(bundle, tmp_path):
    _, dataset = _dataset(bundle, [IMAGE_LAST, GOOD], tmp_path, "error", image_placement="keep")
    assert dataset.rows[0].messages[0]["content"] == IMAGE_LAST["conversations"][0]["value"]
    assert dataset.adjusted == {}
