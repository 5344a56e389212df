"""Train-step overhead of the method: arm ``ln_textnorm_gwc`` vs arm ``none``.

Owns the measurement behind the ``ratio <= 1.01`` target. Both models share every weight
except the norm layer (which only the GWC arm has); same batch, same AdamW, every parameter
trainable (stage 2), fwd + bwd + optimizer step timed interleaved (medians).

    .venv/bin/python bench/gwc_overhead.py
    .venv/bin/python bench/gwc_overhead.py --sizes small --repeats 15
"""

from __future__ import annotations

import argparse

import torch
from _harness import (SIZES, interleaved, paired_ratio, random_llava, set_threads, text_config, train_batch,
                      train_step_fn, vision_config)

TARGET = 1.01


def measure(size: str, batch: int, text_tokens: int, repeats: int) -> float:
    s = SIZES[size]
    base = random_llava(vision_config(s), text_config(s), s.tokens_per_image, "none", seed=0)
    gwc = random_llava(vision_config(s), text_config(s), s.tokens_per_image, "ln_textnorm_gwc", seed=0)
    missing, unexpected = gwc.load_state_dict(base.state_dict(), strict=False)
    if unexpected or any(not k.startswith("model.multi_modal_projector.norm.") for k in missing):
        raise RuntimeError(f"arms differ beyond the norm layer: missing {missing}, unexpected {unexpected}")
    inputs = train_batch(s.tokens_per_image, text_tokens, batch, s.image_size, s.vocab)
    t = interleaved({"none": train_step_fn(base, inputs), "ln_textnorm_gwc": train_step_fn(gwc, inputs)}, repeats)
    print(f"[{size}] batch {batch} x {s.tokens_per_image + text_tokens} tokens, {repeats} interleaved rounds")
    for name, timing in t.items():
        print(f"[{size}]   {name:16s} step median {timing.median_s * 1e3:8.2f} ms (spread {timing.spread:.0%})")
    layer_s = norm_layer_seconds(gwc, batch * s.tokens_per_image)
    print(f"[{size}]   the GWC LayerNorm alone (fwd + bwd on {batch * s.tokens_per_image} tokens): "
          f"{layer_s * 1e6:.0f} us = {layer_s / t['none'].median_s:.2%} of the step "
          "(isolated, so far less noisy than the step ratio)")
    return paired_ratio(t, "ln_textnorm_gwc", "none")


def norm_layer_seconds(model, tokens: int, calls: int = 200) -> float:
    """Median time of the norm layer's fwd + bwd on the projected features' shape, in training mode."""
    layer = model.norm_layer.train()
    x = torch.randn(tokens, layer.hidden_size, requires_grad=True)

    def run() -> None:
        for _ in range(calls):
            layer(x).sum().backward()

    return interleaved({"layer": run}, repeats=5)["layer"].median_s / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--text-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default: 200 tiny, 7 small)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_threads(args.threads)
    ratios = {size: measure(size, args.batch, args.text_tokens, args.repeats or (200 if size == "tiny" else 7))
              for size in args.sizes}
    for size, ratio in ratios.items():
        verdict = "meets" if ratio <= TARGET else "MISSES"
        print(f"ratio gwc/none step time [{size}], median of per-round ratios: {ratio:.4f} "
              f"({verdict} target <= {TARGET})")


if __name__ == "__main__":
    main()
