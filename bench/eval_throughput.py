"""Batched greedy evaluation throughput: ``Predictor.generate`` at several batch sizes vs batch 1.

Owns the evaluation-speed curve: a tiny LlavaNorm bundle (``llava_norm_demo.tiny``, SigLIP
+ Llama-3.2 format) answers the same image prompts at every batch size; rounds alternate the
batch sizes (order flipped every round) and the medians are reported as samples/s and
generated tokens/s (a random model rarely stops early, but tokens/s keeps the comparison
fair if it does).

    .venv/bin/python bench/eval_throughput.py
    .venv/bin/python bench/eval_throughput.py --batch-sizes 1 4 16 32 --prompts 64 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

import torch
from _harness import interleaved
from PIL import Image
from transformers.utils import logging as hf_logging

from llava_norm.inference import Predictor, Prompt
from llava_norm.model.builder import ModelSpec, build_model
from llava_norm_demo.tiny import make_tiny

QUESTIONS = ["What colour is the shape?", "How many objects are there?", "Where is the star?",
             "Describe the image in one sentence.", "Is there a circle in the picture? Answer yes or no."]


def prompts(n: int, seed: int) -> list[Prompt]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        colour = tuple(rng.randrange(256) for _ in range(3))
        out.append(Prompt(rng.choice(QUESTIONS), Image.new("RGB", (rng.randint(48, 96), rng.randint(48, 96)), colour)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds over all batch sizes")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp:
        paths = make_tiny(Path(tmp), seed=0)
        bundle = build_model(ModelSpec(vision_tower=str(paths["siglip"]), llm=str(paths["llama"])))
    predictor = Predictor(bundle, template_kwargs={"date_string": "26 Jul 2024"})
    items = prompts(args.prompts, seed=0)
    generated: dict[int, int] = {}

    def run(batch_size: int):
        def go() -> None:
            replies = predictor.generate_ids(items, args.max_new_tokens, batch_size=batch_size)
            generated[batch_size] = sum(len(r) for r in replies)
        return go

    reference = predictor.generate_ids(items, args.max_new_tokens, batch_size=1)
    batched = predictor.generate_ids(items, args.max_new_tokens, batch_size=max(args.batch_sizes))
    same = sum(a == b for a, b in zip(reference, batched))
    timings = interleaved({bs: run(bs) for bs in args.batch_sizes}, args.repeats)
    print(f"tiny bundle, {args.prompts} image prompts, up to {args.max_new_tokens} new tokens, "
          f"{args.repeats} interleaved rounds; batch {max(args.batch_sizes)} reproduces batch 1's greedy "
          f"answer for {same}/{args.prompts} prompts")
    print(f"{'batch':>5s} {'samples/s':>10s} {'tokens/s':>9s}")
    rate = {bs: args.prompts / t.median_s for bs, t in timings.items()}
    for bs, t in timings.items():
        print(f"{bs:5d} {rate[bs]:10.1f} {generated[bs] / t.median_s:9.0f}")
    base = rate.get(1)
    if base is None:
        return
    for bs in args.batch_sizes:
        if bs != 1:
            print(f"ratio batch {bs} / batch 1 samples/s: {rate[bs] / base:.2f}")
    best = max(rate, key=rate.get)
    verdict = "batched is faster" if rate[best] > base and best != 1 else "batched is NOT faster"
    print(f"ratio best (batch {best}) / batch 1 samples/s: {rate[best] / base:.2f} ({verdict})")


if __name__ == "__main__":
    main()
