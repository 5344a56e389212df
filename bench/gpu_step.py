"""Stage-2 train step at the paper's real shapes on one GPU: tokens/s, TFLOP/s, MFU, peak memory.

Owns the measurement behind the ``MFU >= 45%`` target. The model is LlavaNorm with random
weights built from the architectures' config values written below (SigLIP-SO400M-patch14-384
+ Llama-3.2-3B-Instruct or Qwen2.5-7B-Instruct; no hub access needed), bf16, every parameter
trainable (stage 2 trains the vision tower too), AdamW. It runs every combination of
attention implementation (sdpa, and flash_attention_2 where flash-attn is installed) and
activation checkpointing off/on; a combination that runs out of memory is reported as such.

MFU counts model FLOPs (PaLM convention, recomputation under activation checkpointing is not
counted): 6 x matmul parameters x tokens + 12 x layers x width x sequence per token for
attention, for the vision layers that feed the projector, the projector and the LM (lm_head
included, the embedding lookup not).

    .venv/bin/python bench/gpu_step.py                                # on a GPU machine
    .venv/bin/python bench/gpu_step.py --llms llama-3.2-3b --batches 1 4 --steps 10
    .venv/bin/python bench/gpu_step.py --toy                          # CPU smoke test, seconds
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import time
from dataclasses import dataclass

import torch
from _harness import random_llava, train_batch
from transformers import AutoConfig, LlamaConfig, SiglipVisionConfig

from llava_norm.plan.backbones import SHIPPED_BACKBONES, vision_part
from llava_norm.plan.flops import train_flops
from llava_norm.plan.memory import PLAN_ATTENTION, count_parameters, model_states, peak_bytes, trace_activations
from llava_norm.train.params import freeze_backbones

TARGET_MFU = 0.45
PLAN_TOLERANCE = 0.15  # the plan's peak within 15% of the measured one
# Paper Table 1: mean input-embedding norm T of each LLM (random weights would give a meaningless T).
PAPER_TEXT_NORM = {"llama-3.2-3b": 1.09, "qwen2.5-7b": 0.80}
# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, matched against torch.cuda.get_device_name().
BF16_PEAK_TFLOPS = [("H100 PCIe", 756.0), ("H100", 989.4), ("H200", 989.4), ("GH200", 989.4), ("B200", 2250.0),
                    ("A100", 312.0), ("L40S", 362.0), ("A10G", 70.0)]
VISION = "google/siglip-so400m-patch14-384"
LLMS = {"llama-3.2-3b": "meta-llama/Llama-3.2-3B-Instruct", "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct"}


def shipped(hub_id: str):
    """The published config of a real backbone (configs/backbones; no hub access needed)."""
    return AutoConfig.from_pretrained(SHIPPED_BACKBONES / hub_id)


def siglip_so400m_384() -> SiglipVisionConfig:
    return vision_part(shipped(VISION))


def toy_vision() -> SiglipVisionConfig:
    return SiglipVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                              image_size=56, patch_size=14)


def toy_llm() -> LlamaConfig:
    return LlamaConfig(vocab_size=1024, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)


def planned_peak(vision, text, tokens_per_image: int, arm: str, text_norm: float, batch: int, text_tokens: int,
                 checkpointing: bool) -> int:
    """``llava-norm plan``'s peak for this script's step: one GPU, bf16 weights, gradients and AdamW
    moments (layout ``bf16_adamw``), every reached parameter trained, one image per row."""
    model = random_llava(vision, text, tokens_per_image, arm, attn=PLAN_ATTENTION, text_norm=text_norm,
                         device="meta", dtype=torch.bfloat16)
    freeze_backbones(model, 2)  # everything the step reaches trains; the unused tower layer gets no gradient
    components = count_parameters(model)
    trained = sum(c.trained for c in components)
    states = model_states(trained, sum(c.total for c in components) - trained, 0, "bf16_adamw", 1)
    acts = trace_activations(model, batch, tokens_per_image + text_tokens, batch, tokens_per_image)
    return peak_bytes(states, acts, checkpointing, grad_accum=1)


def bf16_peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in BF16_PEAK_TFLOPS if key in name), None)


@dataclass
class Result:
    label: str
    step_s: float | None = None
    tokens_per_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    peak_mem_gib: float | None = None
    plan_gib: float | None = None
    error: str | None = None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def achieved(flops: float, step_s: float, peak_tflops: float | None) -> tuple[float, float | None]:
    """(TFLOP/s, MFU) of a step of ``flops`` model FLOPs taking ``step_s``; MFU None without a known peak."""
    tflops = flops / step_s / 1e12
    return tflops, (tflops / peak_tflops if peak_tflops else None)


def run_one(model, inputs: dict, flops: float, steps: int, warmup: int, device: torch.device,
            peak_tflops: float | None, label: str) -> Result:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        for i in range(warmup + steps):
            if i == warmup:
                sync(device)
                start = time.perf_counter()
            model(**inputs).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        sync(device)
    except torch.OutOfMemoryError as error:
        return Result(label, error=f"out of memory ({str(error).splitlines()[0][:80]})")
    finally:  # free optimizer state and any gradients a failed step left, before the next combination
        del optimizer
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    step_s = (time.perf_counter() - start) / steps
    tokens = inputs["input_ids"].numel()
    tflops, mfu = achieved(flops, step_s, peak_tflops)
    mem = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    return Result(label, step_s, tokens / step_s, tflops, mfu, mem)


def attention_kinds(device: torch.device) -> list[str]:
    kinds = ["sdpa"]
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        kinds.append("flash_attention_2")
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llms", nargs="+", default=list(LLMS), choices=sorted(LLMS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4], help="per-device batch sizes")
    parser.add_argument("--text-tokens", type=int, default=300,
                        help="text tokens per sample after the 729 image tokens")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--arm", default="ln_textnorm_gwc")
    parser.add_argument("--checkpointing", choices=["off", "on", "both"], default="both")
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the device's bf16 peak")
    parser.add_argument("--toy", action="store_true", help="tiny shapes on CPU: a smoke test of this script")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.toy else "cpu")
    if not args.toy and device.type != "cuda":
        parser.error("no CUDA device: real shapes need a GPU (use --toy for the CPU smoke test)")
    peak = args.peak_tflops or bf16_peak_tflops(device)
    archs = {"toy": (toy_vision, toy_llm, 1.0)} if args.toy else {
        name: (siglip_so400m_384, lambda name=name: shipped(LLMS[name]), PAPER_TEXT_NORM[name]) for name in args.llms}
    batches = [1] if args.toy else args.batches
    steps, warmup = (2, 1) if args.toy else (args.steps, args.warmup)
    ckpts = {"off": [False], "on": [True], "both": [False, True]}[args.checkpointing]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}; bf16 peak: {f'{peak:.0f} TFLOP/s' if peak else 'unknown'}; arm {args.arm}; "
          f"{steps} timed steps after {warmup} warm-up")
    results: list[Result] = []
    for arch, (vision_fn, text_fn, text_norm) in archs.items():
        vision, text = vision_fn(), text_fn()
        tokens_per_image = (vision.image_size // vision.patch_size) ** 2
        for attn in attention_kinds(device):
            model = random_llava(vision, text, tokens_per_image, args.arm, attn=attn, text_norm=text_norm,
                                 device=str(device), dtype=torch.bfloat16).train()
            for batch in batches:
                seq = tokens_per_image + args.text_tokens
                inputs = train_batch(tokens_per_image, args.text_tokens, batch, vision.image_size, text.vocab_size,
                                     device=str(device), dtype=torch.bfloat16)
                inputs["use_cache"] = False  # training: no KV cache (and none under checkpointing)
                flops = train_flops(vision, text, seq, batch).total
                for ckpt in ckpts:
                    if ckpt:  # as the trainer sets it (train.gradient_checkpointing)
                        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
                    else:
                        model.activation_checkpointing_disable()
                    label = f"{arch} {attn} batch {batch}x{seq} ckpt {'on' if ckpt else 'off'}"
                    results.append(run_one(model, inputs, flops, steps, warmup, device, peak, label))
                    results[-1].plan_gib = planned_peak(vision, text, tokens_per_image, args.arm, text_norm, batch,
                                                        args.text_tokens, ckpt) / 2 ** 30
                    print(format_result(results[-1]), flush=True)
            del model
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    measured = [r for r in results if r.mfu is not None]
    if measured:
        best = max(measured, key=lambda r: r.mfu)
        verdict = "meets" if best.mfu >= TARGET_MFU else "MISSES"
        print(f"MFU best: {best.mfu:.1%} ({best.label}; {verdict} target >= {TARGET_MFU:.0%})")
    else:
        print(f"MFU: n/a (no bf16 peak known for {name}; pass --peak-tflops)")
    compared = [r for r in results if r.peak_mem_gib and r.plan_gib]
    if compared:
        worst = max(compared, key=lambda r: abs(r.peak_mem_gib / r.plan_gib - 1))
        off = worst.peak_mem_gib / worst.plan_gib - 1
        verdict = "meets" if abs(off) <= PLAN_TOLERANCE else "MISSES"
        print(f"plan vs measured peak memory: worst {off:+.1%} ({worst.label}; {verdict} target within "
              f"{PLAN_TOLERANCE:.0%})")


def format_result(r: Result) -> str:
    if r.error:
        return f"{r.label}: {r.error}" + (f" (plan {r.plan_gib:.1f} GiB)" if r.plan_gib is not None else "")
    mem = f", peak memory {r.peak_mem_gib:.1f} GiB" if r.peak_mem_gib is not None else ""
    if r.plan_gib is not None:
        mem += f", plan {r.plan_gib:.1f} GiB"
    mfu = f", MFU {r.mfu:.1%}" if r.mfu is not None else ""
    return (f"{r.label}: step {r.step_s * 1e3:.1f} ms, {r.tokens_per_s:,.0f} tokens/s, "
            f"{r.tflops:.2f} TFLOP/s{mfu}{mem}")


if __name__ == "__main__":
    main()
