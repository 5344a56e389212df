"""How long the one-GPU recipe (configs/recipe-1gpu, docs/one_gpu_recipe.md) should take on one GPU.

An estimate, not a measurement: model FLOPs from ``llava_norm.plan.flops`` at the recipe's
shapes (SigLIP-base-patch16-224 + Qwen2.5-0.5B-Instruct), divided by the GPU's bf16 peak times
an MFU. The MFU is an assumption until ``bench/gpu_step.py`` has measured it on that GPU;
pass the measured value with ``--mfu``. Stage 1 trains only the projector and the norm layer,
so it costs forward + activation gradients (4 of the 6 FLOPs per parameter and token), with
the towers' weight gradients skipped; evaluation is one forward pass per token scored.

    .venv/bin/python bench/recipe_time.py                 # assumed MFU 0.30, H100 peak
    .venv/bin/python bench/recipe_time.py --mfu 0.41      # a measured MFU
"""

from __future__ import annotations

import argparse

import _gpu_variants
import gpu_step

from llava_norm.plan.backbones import vision_part
from llava_norm.plan.flops import train_flops

H100_PEAK_TFLOPS = dict(_gpu_variants.BF16_PEAK_TFLOPS)["H100"]
ARMS, SEEDS = 9, 3
# The recipe's slices (configs/_base/recipe_1gpu_stage{1,2}.yaml) and evaluation limit.
STAGE1_SAMPLES, STAGE2_SAMPLES, EVAL_ITEMS = 50_000, 40_000, 9 * 500
# Mean tokens per sample: 196 image tokens plus text. LLaVA-558K captions are short (~20
# tokens); LLaVA-NeXT conversations run to a few hundred; a benchmark prompt ~80 + the image.
STAGE1_SEQ, STAGE2_SEQ, EVAL_SEQ = 220, 600, 280
# Not FLOPs, per chain: model and optimizer loading, checkpoint saves, DeepSpeed start-up, and
# evaluation's decoding latency (a few tokens per item, batch by batch), which FLOPs miss.
OVERHEAD_S = 180


def siglip_base_224():
    return vision_part(gpu_step.shipped("google/siglip-base-patch16-224"))


def qwen2_5_0_5b():
    return gpu_step.shipped("Qwen/Qwen2.5-0.5B-Instruct")


def chain_seconds(mfu: float, peak_tflops: float = H100_PEAK_TFLOPS) -> dict[str, float]:
    """Seconds per stage of one (arm, seed) chain at ``mfu`` of ``peak_tflops``."""
    vision, text = siglip_base_224(), qwen2_5_0_5b()
    rate = mfu * peak_tflops * 1e12
    stage1 = train_flops(vision, text, STAGE1_SEQ, STAGE1_SAMPLES, llm_trained=False, vision_trained=False).total
    stage2 = train_flops(vision, text, STAGE2_SEQ, STAGE2_SAMPLES).total
    evaluation = train_flops(vision, text, EVAL_SEQ, EVAL_ITEMS).total / 3  # forward only: 2 of 6
    return {"stage 1": stage1 / rate,
            "stage 2": stage2 / rate, "evaluation": evaluation / rate, "overhead": OVERHEAD_S}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mfu", type=float, default=0.30, help="model FLOPs utilisation (default: assumed 0.30)")
    parser.add_argument("--peak-tflops", type=float, default=H100_PEAK_TFLOPS, help="bf16 dense peak (default H100)")
    args = parser.parse_args()
    parts = chain_seconds(args.mfu, args.peak_tflops)
    per_chain = sum(parts.values())
    print(f"estimate at MFU {args.mfu:.2f} of {args.peak_tflops:.0f} TFLOP/s (not a measurement):")
    for name, seconds in parts.items():
        print(f"  {name:11s} {seconds / 60:6.1f} min per chain")
    print(f"  one chain   {per_chain / 60:6.1f} min; {ARMS} arms x {SEEDS} seeds = {ARMS * SEEDS} chains: "
          f"{ARMS * SEEDS * per_chain / 3600:.1f} h")


if __name__ == "__main__":
    main()
