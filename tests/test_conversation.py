"""Masking property tests: labels are right by construction for every template."""

import random
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor

from llava_norm.data.conversation import IGNORE_INDEX, ChatTemplateFormat, ConversationTokenizer, PlainFormat, truncate
from llava_norm.data.prompts import Prompt, PromptEncoder
from llava_norm.model.builder import load_tokenizer

WORDS = ["red", "circle", "square", "the", "is", "where", "how many", "A.", "(B)", "yes", "no", "12", "word",
         "\n", "  ", "Answer:", "ÿ", "top left", "option"]
TEMPLATE_KWARGS = {"date_string": "26 Jul 2024"}
# What configs/_base/qwen3-8b.yaml passes: thinking off (the generation prompt then holds the empty
# think block that training samples carry before their last answer).
QWEN3_KWARGS = {**TEMPLATE_KWARGS, "enable_thinking": False}
KWARGS = {"llama": TEMPLATE_KWARGS, "qwen2": TEMPLATE_KWARGS, "qwen3": QWEN3_KWARGS}
THINK = "<think>\n\n</think>\n\n"


def _text(rng):
    # Stripped: each piece is tokenised on its own (as at inference, where the generation prompt
    # ends the prompt), so a leading "\n" would not merge with the template's "\n" as it does
    # when the whole string is tokenised at once.
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))).strip() or "ok"


def _conversation(rng, with_image):
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": _text(rng)})
    for turn in range(rng.randint(1, 4)):
        user = _text(rng)
        if with_image and turn == 0:
            user = rng.choice(["<image>\n" + user, user + "\n<image>", user + " <image> " + _text(rng)])
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": _text(rng)}]
    return messages


def _chat(tiny_dir, llm):
    tokenizer = load_tokenizer(str(tiny_dir / llm))
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    fmt = ChatTemplateFormat(tokenizer, KWARGS[llm])
    return tokenizer, ConversationTokenizer(tokenizer, fmt, image_id, tokens_per_image=5)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def chat(request, tiny_dir):
    return _chat(tiny_dir, request.param)


def test_chat_masking_property(chat):
    tokenizer, encoder = chat
    eot = tokenizer.convert_tokens_to_ids(encoder.format.end_of_turn)
    rng = random.Random(0)
    for case in range(150):
        messages = _conversation(rng, with_image=case % 2 == 0)
        text = encoder.render_text(messages)
        assert text == tokenizer.apply_chat_template(messages, tokenize=False, **encoder.format.template_kwargs)
        encoded = encoder.encode(messages)
        # Same ids as tokenising the whole rendered text, once images are expanded.
        whole = tokenizer.encode(text, add_special_tokens=False)
        expanded = [t for tok in whole for t in ([tok] * 5 if tok == encoder.image_token_id else [tok])]
        assert encoded.input_ids == expanded
        # Supervised tokens are exactly: each assistant content, then its end-of-turn token.
        expected = []
        for m in messages:
            if m["role"] == "assistant":
                content = m["content"].strip() if encoder.format.trims_content else m["content"]
                expected += tokenizer.encode(content, add_special_tokens=False) + [eot]
        assert [t for t, l in zip(encoded.input_ids, encoded.labels) if l != IGNORE_INDEX] == expected
        assert all(l in (IGNORE_INDEX, t) for t, l in zip(encoded.input_ids, encoded.labels))
        assert encoded.input_ids.count(encoder.image_token_id) == 5 * encoded.n_images


def test_generation_prompt_matches_template(chat):
    tokenizer, encoder = chat
    messages = [{"role": "user", "content": "<image>\nWhat is this?"}]
    assert encoder.render_text(messages, add_generation_prompt=True) == tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **encoder.format.template_kwargs)
    assert all(label == IGNORE_INDEX for label in encoder.encode(messages, add_generation_prompt=True).labels)


def test_plain_format_supervises_caption_and_separator(tiny_dir):
    for llm in ("llama", "qwen2", "qwen3"):
        tokenizer = load_tokenizer(str(tiny_dir / llm))
        image_id = tokenizer.convert_tokens_to_ids("<image>")
        encoder = ConversationTokenizer(tokenizer, PlainFormat(tokenizer), image_id, tokens_per_image=4)
        messages = [{"role": "user", "content": "Describe the image.\n<image>"},
                    {"role": "assistant", "content": "a red circle on a striped background"}]
        encoded = encoder.encode(messages)
        caption = tokenizer.encode("a red circle on a striped background", add_special_tokens=False)
        bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        end = tokenizer.encode("\n", add_special_tokens=False)  # LLaVA-1.5's plain separator, not eos
        assert encoded.input_ids == bos + [image_id] * 4 + caption + end
        assert [l for l in encoded.labels if l != IGNORE_INDEX] == caption + end
        assert tokenizer.eos_token_id not in encoded.input_ids


def test_truncation_keeps_whole_turns_or_skips(chat):
    _, encoder = chat
    messages = [{"role": "user", "content": "<image>\nq one"}, {"role": "assistant", "content": "a one"},
                {"role": "user", "content": "q two"}, {"role": "assistant", "content": "a two two two"}]
    encoded = encoder.encode(messages)
    first_end, last_end = encoded.turn_ends
    assert last_end >= len(encoded.input_ids) - 1  # Qwen closes with "<|im_end|>" + "\n"
    cut = truncate(encoded, last_end - 1)
    assert cut.input_ids == encoded.input_ids[:first_end] and cut.labels == encoded.labels[:first_end]
    assert truncate(encoded, first_end - 1) is None
    assert truncate(encoded, len(encoded.input_ids)) is encoded
    # three turns, the last one over the limit: the cut keeps the first two, not the first alone
    three = [*messages, {"role": "user", "content": "q three"}, {"role": "assistant", "content": "a three three"}]
    encoded = encoder.encode(three)
    first_end, second_end, third_end = encoded.turn_ends
    cut = truncate(encoded, third_end - 1)
    assert cut.input_ids == encoded.input_ids[:second_end] and cut.labels == encoded.labels[:second_end]
    assert encoder.encoded_lengths([three], third_end - 1) == [second_end]


def test_encoded_lengths_are_exact_after_truncation(chat, tiny_dir):
    """Packing plans rows with these lengths: they must equal what encode + truncate builds."""
    tokenizer, encoder = chat
    plain = ConversationTokenizer(tokenizer, PlainFormat(tokenizer), encoder.image_token_id, tokens_per_image=5)
    rng = random.Random(1)
    conversations = [_conversation(rng, with_image=i % 3 != 0) for i in range(120)]
    for enc, rows in ((encoder, conversations), (plain, [c[-2:] if c[0]["role"] == "system" else c[:2]
                                                         for c in conversations])):
        full = [len(enc.encode(messages).input_ids) for messages in rows]
        seen = set()
        for max_length in (10_000, sorted(full)[len(full) // 2], min(full)):
            expected = []
            for messages in rows:
                cut = truncate(enc.encode(messages), max_length)
                expected.append(0 if cut is None else len(cut.input_ids))
            assert enc.encoded_lengths(rows, max_length, chunk=7) == expected
            seen |= {"cut" if 0 < cut < whole else "refused" if cut == 0 else "whole"
                     for cut, whole in zip(expected, full)}
        assert seen == {"cut", "refused", "whole"} or enc is plain  # plain rows have one turn: never cut


def _supervised(encoded) -> list[int]:
    return [t for t, label in zip(encoded.input_ids, encoded.labels) if label != IGNORE_INDEX]


def _find(ids: list[int], part: list[int]) -> list[int]:
    return [i for i in range(len(ids) - len(part) + 1) if ids[i:i + len(part)] == part]


def test_qwen3_thinking_tags_are_single_plain_added_tokens(tiny_dir):
    tokenizer = load_tokenizer(str(tiny_dir / "qwen3"))
    for tag in ("<think>", "</think>", "<tool_response>", "</tool_response>"):
        ids = tokenizer.encode(tag, add_special_tokens=False)
        assert tokenizer.convert_ids_to_tokens(ids) == [tag]
        assert tag not in tokenizer.all_special_tokens  # added, not special, as in Qwen3's vocabulary
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (None, "<|im_end|>", "<|endoftext|>")


QWEN3_CONVERSATIONS = {
    "single": [{"role": "user", "content": "<image>\nWhat colour is the circle?"},
               {"role": "assistant", "content": "The circle is red."}],
    "multi": [{"role": "system", "content": "Answer briefly."},
              {"role": "user", "content": "<image>\nHow many squares?"}, {"role": "assistant", "content": "Two."},
              {"role": "user", "content": "Where is the star?"}, {"role": "assistant", "content": "Top left."},
              {"role": "user", "content": "And the circle?"}, {"role": "assistant", "content": "In the middle."}],
}


@pytest.mark.parametrize("name", QWEN3_CONVERSATIONS)
def test_qwen3_think_block_is_unsupervised_template_text_before_the_last_answer(tiny_dir, name):
    messages = QWEN3_CONVERSATIONS[name]
    tokenizer, encoder = _chat(tiny_dir, "qwen3")
    text = encoder.render_text(messages)
    assert text == tokenizer.apply_chat_template(messages, tokenize=False, **QWEN3_KWARGS)
    # Only the last assistant turn carries the (empty) block; earlier ones are rendered without it.
    assert text.count("<think>") == 1 and text.endswith(f"<|im_start|>assistant\n{THINK}{messages[-1]['content']}"
                                                        "<|im_end|>\n")
    encoded = encoder.encode(messages)
    block = tokenizer.encode(THINK, add_special_tokens=False)
    (start,) = _find(encoded.input_ids, block)
    end = start + len(block)
    assert set(encoded.labels[start:end]) == {IGNORE_INDEX}
    assert encoded.labels[end] != IGNORE_INDEX  # the answer starts right after the block
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    assert _supervised(encoded) == [t for a in answers for t in tokenizer.encode(a, add_special_tokens=False) + [eot]]


@pytest.mark.parametrize("name", QWEN3_CONVERSATIONS)
def test_qwen3_eval_prompt_is_the_training_prefix(tiny_dir, name):
    """What the model is asked (thinking off) is token for token the training sample with the same
    turns, up to where the supervised answer starts: the think block is in both."""
    *turns, answer = QWEN3_CONVERSATIONS[name]
    tokenizer, encoder = _chat(tiny_dir, "qwen3")
    prompts = PromptEncoder(encoder, AutoImageProcessor.from_pretrained(tiny_dir / "siglip"))
    image = Image.new("RGB", (40, 30), (200, 20, 20))
    asked = prompts.example(turns, [image], add_generation_prompt=True)
    trained = prompts.example([*turns, answer], [image])
    n = len(asked.input_ids)
    assert trained.input_ids[:n] == asked.input_ids
    assert trained.labels[n - 1] == IGNORE_INDEX and trained.labels[n] != IGNORE_INDEX
    assert tokenizer.decode(asked.input_ids).endswith(f"<|im_start|>assistant\n{THINK}")
    torch.testing.assert_close(asked.pixel_values, trained.pixel_values)
    if name == "single":  # the Prompt path evaluation uses
        prompt = Prompt("What colour is the circle?", image)
        assert prompts.prompt_example(prompt).input_ids == asked.input_ids


def test_a_default_configs_llama_prompt_carries_the_pinned_date_not_todays(tiny_dir):
    """Llama-3's template stamps today's date unless given one, so without the default a run's
    training and evaluation prompts would differ from day to day (README: default `26 Jul 2024`)."""
    from llava_norm.config_schema import DataConfig

    tokenizer, _ = _chat(tiny_dir, "llama")
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    encoder = ConversationTokenizer(tokenizer, ChatTemplateFormat(tokenizer, DataConfig().template_kwargs), image_id,
                                    tokens_per_image=5)
    text = encoder.render_text([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert "Today Date: 26 Jul 2024\n" in text
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert "`data.template_kwargs.date_string` pins it (default `26 Jul 2024`)" in readme
