"""Train-step time: our LlavaNormForConditionalGeneration (arm none) vs transformers' Llava.

Owns the side-by-side CPU measurement behind the ``ratio <= 1.05`` target: both models get
the same configs, the same weights (ours copied into the stock class), the same batch and
the same AdamW, and their fwd + bwd + optimizer steps are timed interleaved (medians).

    .venv/bin/python bench/train_step.py                 # tiny and small
    .venv/bin/python bench/train_step.py --sizes small --repeats 9 --text-tokens 256
"""

from __future__ import annotations

import argparse

from _harness import (SIZES, interleaved, n_params, paired_ratio, random_llava, set_threads, stock_twin,
                      text_config, train_batch, train_step_fn, vision_config)

TARGET = 1.05


def measure(size: str, batch: int, text_tokens: int, repeats: int) -> float:
    s = SIZES[size]
    ours = random_llava(vision_config(s), text_config(s), s.tokens_per_image, "none", seed=0)
    stock = stock_twin(ours)
    inputs = train_batch(s.tokens_per_image, text_tokens, batch, s.image_size, s.vocab)
    step_ours, step_stock = train_step_fn(ours, inputs), train_step_fn(stock, inputs)
    first = step_ours(), step_stock()
    if abs(first[0] - first[1]) > 1e-4 * max(1.0, abs(first[1])):
        raise RuntimeError(f"{size}: the two models disagree on the first loss ({first[0]} vs {first[1]}); "
                           "they are not the same computation")
    t = interleaved({"stock": step_stock, "ours": step_ours}, repeats)
    ratio = paired_ratio(t, "ours", "stock")
    seq = s.tokens_per_image + text_tokens
    print(f"[{size}] {n_params(ours) / 1e6:.1f}M params, batch {batch} x {seq} tokens, {repeats} interleaved rounds")
    for name in ("stock", "ours"):
        print(f"[{size}]   {name:5s} step median {t[name].median_s * 1e3:8.1f} ms (spread {t[name].spread:.0%})")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--text-tokens", type=int, default=128, help="text tokens after the image tokens")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default: 30 tiny, 7 small)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the machine is shared)")
    args = parser.parse_args()
    set_threads(args.threads)
    ratios = {size: measure(size, args.batch, args.text_tokens, args.repeats or (30 if size == "tiny" else 7))
              for size in args.sizes}
    for size, ratio in ratios.items():
        verdict = "meets" if ratio <= TARGET else "MISSES"
        print(f"ratio ours/stock step time [{size}], median of per-round ratios: {ratio:.3f} "
              f"({verdict} target <= {TARGET})")


if __name__ == "__main__":
    main()
