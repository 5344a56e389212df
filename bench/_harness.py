"""Shared plumbing for the ``bench/`` scripts: import path, interleaved timing, random models.

Owns what the measuring benchmarks need and none should spell twice (the checkout on
``sys.path`` is ``_repo``'s):
- ``interleaved``: alternate the contenders round by round and report medians, so a burst of
  load from another process on the shared machine hits every contender alike, and
  ``paired_ratio``: the median of the per-round ratios, which also cancels slow load drifts;
- ``random_llava``: a LlavaNorm model with random weights built straight from backbone configs
  (no tokenizer, no hub), plus ``stock_twin`` (transformers' own Llava with identical weights).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from _repo import REPO_ROOT  # noqa: F401  (puts this checkout on sys.path)

import torch  # noqa: E402
from transformers import LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig  # noqa: E402

from llava_norm.model.modeling import LlavaNormConfig, LlavaNormForConditionalGeneration  # noqa: E402
from llava_norm.model.norm_align import text_embedding_norm  # noqa: E402

IMAGE_TOKEN_ID = 1  # any id below the vocabulary works: the model only compares ids to config.image_token_id


@dataclass(frozen=True)
class Timing:
    name: str
    median_s: float
    runs: list[float]

    @property
    def spread(self) -> float:
        """(max - min) / median of the kept runs: how noisy the machine was."""
        return (max(self.runs) - min(self.runs)) / self.median_s


def interleaved(contenders: dict[str, Callable[[], None]], repeats: int, warmup: int = 1) -> dict[str, Timing]:
    """Run each contender ``warmup`` times, then ``repeats`` rounds of A, B, ... (order flipped every round)."""
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    runs: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            contenders[name]()
            runs[name].append(time.perf_counter() - start)
    return {name: Timing(name, statistics.median(r), r) for name, r in runs.items()}


def paired_ratio(timings: dict[str, Timing], numerator: str, denominator: str) -> float:
    """Median over rounds of numerator/denominator: each round's two runs saw about the same machine load."""
    return statistics.median(a / b for a, b in zip(timings[numerator].runs, timings[denominator].runs))


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)


@dataclass(frozen=True)
class Shapes:
    """Backbone shapes for a random model; SigLIP-style tower (no CLS) + Llama-style LM."""

    image_size: int
    patch_size: int
    vision_hidden: int
    vision_layers: int
    vision_heads: int
    vision_intermediate: int
    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_intermediate: int
    vocab: int
    tie_embeddings: bool = True

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2


# "tiny" is llava_norm_demo.tiny.TinySizes; "small" is a ~100M-parameter model that still steps on a CPU.
SIZES = {
    "tiny": Shapes(64, 8, 64, 3, 4, 256, 96, 3, 4, 2, 192, 1280),
    "small": Shapes(224, 16, 384, 6, 6, 1536, 768, 12, 12, 4, 2048, 32000),
}


def vision_config(s: Shapes) -> SiglipVisionConfig:
    return SiglipVisionConfig(hidden_size=s.vision_hidden, intermediate_size=s.vision_intermediate,
                              num_hidden_layers=s.vision_layers, num_attention_heads=s.vision_heads,
                              image_size=s.image_size, patch_size=s.patch_size)


def text_config(s: Shapes) -> LlamaConfig:
    return LlamaConfig(vocab_size=s.vocab, hidden_size=s.text_hidden, intermediate_size=s.text_intermediate,
                       num_hidden_layers=s.text_layers, num_attention_heads=s.text_heads,
                       num_key_value_heads=s.text_kv_heads, max_position_embeddings=8192,
                       tie_word_embeddings=s.tie_embeddings)


def llava_config_kwargs(vision, text, tokens_per_image: int) -> dict:
    return dict(vision_config=vision, text_config=text, image_token_id=IMAGE_TOKEN_ID,
                image_seq_length=tokens_per_image, vision_feature_layer=-2,
                vision_feature_select_strategy="full", tie_word_embeddings=text.tie_word_embeddings)


def random_llava(vision, text, tokens_per_image: int, arm: str = "none", seed: int = 0, attn: str = "sdpa",
                 text_norm: float | None = None, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> LlavaNormForConditionalGeneration:
    """Random-weight LlavaNorm built on ``device``; ``text_norm`` None: T measured from the random embeddings."""
    kwargs = llava_config_kwargs(vision, text, tokens_per_image)
    if text_norm is None and arm != "none":
        probe = random_llava(vision, text, tokens_per_image, "none", seed, attn, device=device, dtype=dtype)
        text_norm = text_embedding_norm(probe.get_input_embeddings().weight)
        del probe
    config = LlavaNormConfig(norm_alignment=arm, text_norm=text_norm, **kwargs)
    config._attn_implementation = attn
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlavaNormForConditionalGeneration(config)
    return model.to(dtype)


def stock_twin(ours: LlavaNormForConditionalGeneration) -> LlavaForConditionalGeneration:
    """transformers' LlavaForConditionalGeneration with the same configs and the same weights (arm none)."""
    c = ours.config
    config = LlavaConfig(**llava_config_kwargs(c.vision_config, c.text_config, c.image_seq_length))
    config._attn_implementation = c._attn_implementation
    twin = LlavaForConditionalGeneration(config).to(ours.dtype)
    missing, unexpected = twin.load_state_dict(ours.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:  # lm_head is tied to the embeddings
        raise RuntimeError(f"stock Llava does not take our weights: missing {missing}, unexpected {unexpected}")
    twin.tie_weights()
    return twin


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def train_batch(tokens_per_image: int, text_tokens: int, batch: int, image_size: int, vocab: int,
                seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """One image per sample: ``<image>`` x tokens_per_image, then random text; labels = text tokens."""
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(2, vocab, (batch, text_tokens), generator=g)
    image = torch.full((batch, tokens_per_image), IMAGE_TOKEN_ID)
    input_ids = torch.cat([image, text], dim=1)
    labels = torch.cat([torch.full_like(image, -100), text], dim=1)
    pixels = torch.randn(batch, 3, image_size, image_size, generator=g)
    return {"input_ids": input_ids.to(device), "labels": labels.to(device),
            "attention_mask": torch.ones_like(input_ids).to(device),
            "pixel_values": pixels.to(device, dtype)}


def train_step_fn(model: torch.nn.Module, batch: dict, lr: float = 1e-5) -> Callable[[], float]:
    """fwd + bwd + AdamW step (every parameter trainable, as in stage 2); returns the loss."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)

    def step() -> float:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step
