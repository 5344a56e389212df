"""Tiny, randomly initialised backbones that follow the real ones' formats (``llava-norm make-tiny``).

Owns: locally trained byte-level BPE tokenizers with the real Llama-3.2-Instruct, Qwen2.5-Instruct
and Qwen3 special and added tokens, pre-tokenizer regexes and chat templates (Qwen3's is the real
one, thinking tags included); tiny SigLIP and CLIP dual encoders (their vision towers are what
LLaVA uses, the text towers let the demo warm them up contrastively); tiny Llama, Qwen2 and Qwen3
causal LMs. Everything is saved in Hugging Face format so the rest of the project loads it
through ``from_pretrained``, exactly as it loads hub ids on a cluster. The demo's pipeline runs on
the Llama; the Qwen2 and Qwen3 LMs let the tests run those configs' code paths.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    CLIPConfig,
    CLIPImageProcessorPil,
    CLIPModel,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    SiglipConfig,
    SiglipImageProcessorPil,
    SiglipModel,
)

# Pre-tokenizer split patterns of the real tokenizers (Llama-3 groups up to 3 digits, Qwen2 splits every digit).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

LLAMA3_SPECIAL = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
] + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)]
QWEN25_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]
# Added but not special in Qwen2.5 (they are plain added tokens there).
QWEN25_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>"]
# Qwen3 keeps Qwen2.5's special and added tokens and adds these four plain added tokens; the chat
# template writes <think>/</think>, so each must be one token, as in the real vocabulary.
QWEN3_ADDED = QWEN25_ADDED + ["<tool_response>", "</tool_response>", "<think>", "</think>"]


@dataclass(frozen=True)
class Tower:
    """Width and depth of one transformer stack."""

    hidden: int
    layers: int
    heads: int
    intermediate: int  # MLP width
    kv_heads: int | None = None  # grouped-query attention (the LLMs)

    def config(self) -> dict:
        """The keys every Hugging Face config here (Llama, Qwen2, SigLIP, CLIP) names alike."""
        keys = dict(hidden_size=self.hidden, intermediate_size=self.intermediate,
                    num_hidden_layers=self.layers, num_attention_heads=self.heads)
        return keys if self.kv_heads is None else {**keys, "num_key_value_heads": self.kv_heads}


@dataclass(frozen=True)
class TinySizes:
    """Shapes of the tiny backbones; small enough that a CPU step takes milliseconds."""

    image_size: int = 64
    patch_size: int = 8
    vision: Tower = Tower(hidden=64, layers=3, heads=4, intermediate=256)  # also the dual encoders' text towers
    text: Tower = Tower(hidden=96, layers=3, heads=4, intermediate=192, kv_heads=2)  # the LLMs
    tokenizer_vocab: int = 1200
    max_positions: int = 512


def builtin_corpus(seed: int, n_lines: int = 4000) -> list[str]:
    """A small deterministic English corpus for training the tiny tokenizers when none is given."""
    rng = random.Random(seed)
    colours = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white"]
    shapes = ["circle", "square", "triangle", "star", "shape", "object", "image", "picture"]
    places = ["top left", "top right", "bottom left", "bottom right", "center", "middle", "left", "right"]
    verbs = ["is", "are", "shows", "contains", "has", "sees", "answer", "choose", "describe", "count"]
    glue = ["the", "a", "an", "of", "in", "on", "and", "with", "there", "what", "where", "how", "many", "which",
            "option", "letter", "question", "yes", "no", "word", "written", "large", "small", "background"]
    words = colours + shapes + places + verbs + glue
    lines = []
    for _ in range(n_lines):
        n = rng.randint(4, 14)
        sent = " ".join(rng.choice(words) for _ in range(n))
        suffix = rng.choice([".", "?", "!", ":", ",", " A.", " (B)", f" {rng.randint(0, 999)}", "\n", "\n\n"])
        lines.append(sent.capitalize() + suffix)
    return lines


def train_bpe_tokenizer(corpus: list[str], split_pattern: str, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def _template(name: str) -> str:
    return resources.files("llava_norm.model").joinpath(f"templates/{name}").read_text()


def make_llama3_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = train_bpe_tokenizer(corpus, LLAMA3_SPLIT, vocab_size)
    tok.add_special_tokens(LLAMA3_SPECIAL)
    bos_id = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
        special_tokens=[("<|begin_of_text|>", bos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
        chat_template=_template("llama3_2_instruct.jinja"), model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )


def _qwen_tokenizer(corpus: list[str], vocab_size: int, added: list[str], template: str) -> PreTrainedTokenizerFast:
    """Qwen2.5 and Qwen3 share the split regex, special tokens, eos, pad and the lack of a bos."""
    tok = train_bpe_tokenizer(corpus, QWEN2_SPLIT, vocab_size)
    tok.add_special_tokens(QWEN25_SPECIAL)
    tok.add_tokens(added)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=QWEN25_SPECIAL[1:], chat_template=_template(template),
        model_max_length=131072, clean_up_tokenization_spaces=False, errors="replace",
    )


def make_qwen25_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    return _qwen_tokenizer(corpus, vocab_size, QWEN25_ADDED, "qwen2_5_instruct.jinja")


def make_qwen3_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    return _qwen_tokenizer(corpus, vocab_size, QWEN3_ADDED, "qwen3.jinja")


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def make_tiny_llama(tokenizer, sizes: TinySizes) -> LlamaForCausalLM:
    """Llama-3.2 style: tied embeddings, llama3 rope, vocab equal to the tokenizer."""
    config = LlamaConfig(
        vocab_size=len(tokenizer), **sizes.text.config(), max_position_embeddings=sizes.max_positions,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")],
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    )
    return LlamaForCausalLM(config)


def make_tiny_qwen2(tokenizer, sizes: TinySizes) -> Qwen2ForCausalLM:
    """Qwen2.5 style: untied embeddings, qkv bias, vocab padded past the tokenizer with zero rows."""
    config = Qwen2Config(
        vocab_size=_round_up(len(tokenizer) + 1, 64), **sizes.text.config(),
        max_position_embeddings=sizes.max_positions, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")],
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # the real checkpoint's padding rows are zero; T must ignore them
        model.get_input_embeddings().weight[len(tokenizer):] = 0
    return model


def make_tiny_qwen3(tokenizer, sizes: TinySizes) -> Qwen3ForCausalLM:
    """Qwen3-8B style: untied embeddings, no qkv bias, per-head q/k RMSNorm, vocab padded past the
    tokenizer with zero rows. head_dim is a key of its own in Qwen3 (128 in every size), not
    hidden / heads; the tiny one differs from hidden / heads (32 against 24) so code that derives
    it from the hidden size fails here."""
    config = Qwen3Config(
        vocab_size=_round_up(len(tokenizer) + 1, 64), **sizes.text.config(), head_dim=32,
        max_position_embeddings=sizes.max_positions, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")],
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():  # as make_tiny_qwen2: zero padding rows, which T must ignore
        model.get_input_embeddings().weight[len(tokenizer):] = 0
    return model


def _vision_kwargs(sizes: TinySizes) -> dict:
    return dict(**sizes.vision.config(), image_size=sizes.image_size, patch_size=sizes.patch_size)


def _text_tower_kwargs(sizes: TinySizes, tokenizer) -> dict:
    return dict(**replace(sizes.vision, layers=2).config(), vocab_size=len(tokenizer),
                max_position_embeddings=64, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)


def make_tiny_siglip(sizes: TinySizes, tokenizer) -> tuple[SiglipModel, SiglipImageProcessorPil]:
    config = SiglipConfig(vision_config=_vision_kwargs(sizes), text_config=_text_tower_kwargs(sizes, tokenizer))
    processor = SiglipImageProcessorPil(size={"height": sizes.image_size, "width": sizes.image_size})
    return SiglipModel(config), processor


def make_tiny_clip(sizes: TinySizes, tokenizer) -> tuple[CLIPModel, CLIPImageProcessorPil]:
    config = CLIPConfig(vision_config=_vision_kwargs(sizes), text_config=_text_tower_kwargs(sizes, tokenizer),
                        projection_dim=sizes.vision.hidden)
    processor = CLIPImageProcessorPil(
        size={"shortest_edge": sizes.image_size}, crop_size={"height": sizes.image_size, "width": sizes.image_size}
    )
    return CLIPModel(config), processor


TINY_BACKBONES = ("siglip", "clip", "llama", "qwen2", "qwen3")


def _save_lm(model, tokenizer, path: Path) -> None:
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=model.config.eos_token_id, do_sample=False)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def make_tiny(out_dir: str | Path, seed: int = 0, sizes: TinySizes = TinySizes(),
              corpus: list[str] | None = None) -> dict[str, Path]:
    """Write the tiny backbones under ``out_dir/<name>`` for each name in TINY_BACKBONES; returns their paths."""
    out = Path(out_dir)
    corpus = corpus if corpus is not None else builtin_corpus(seed)
    paths = {name: out / name for name in TINY_BACKBONES}
    tokenizers = {
        "llama": make_llama3_tokenizer(corpus, sizes.tokenizer_vocab),
        "qwen2": make_qwen25_tokenizer(corpus, sizes.tokenizer_vocab),
    }
    for name, make_lm in (("llama", make_tiny_llama), ("qwen2", make_tiny_qwen2)):
        torch.manual_seed(seed)
        tokenizer = tokenizers[name]
        _save_lm(make_lm(tokenizer, sizes), tokenizer, paths[name])
    # The dual encoders' text towers reuse the Llama-format tokenizer (the demo's contrastive warm-up).
    for name, make_tower in (("siglip", make_tiny_siglip), ("clip", make_tiny_clip)):
        torch.manual_seed(seed)
        model, processor = make_tower(sizes, tokenizers["llama"])
        model.save_pretrained(paths[name])
        processor.save_pretrained(paths[name])
        tokenizers["llama"].save_pretrained(paths[name])
    # Last and seeded on its own, so adding it left the other backbones' bytes as they were.
    torch.manual_seed(seed)
    qwen3_tokenizer = make_qwen3_tokenizer(corpus, sizes.tokenizer_vocab)
    _save_lm(make_tiny_qwen3(qwen3_tokenizer, sizes), qwen3_tokenizer, paths["qwen3"])
    return paths
