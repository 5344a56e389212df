"""Stage-2 train step at the paper's real shapes on one GPU: tokens/s, MFU, peak memory and where
the step's time goes, for each variant the GPU kit compares.

Owns the measurement behind the ``MFU >= 45%`` target. The model is LlavaNorm with random
weights built from the architectures' config values (configs/backbones: SigLIP-SO400M-patch14-384
+ Llama-3.2-3B-Instruct or Qwen2.5-7B-Instruct; no hub access needed), bf16, every parameter
trainable (stage 2 trains the vision tower too), AdamW (fused on CUDA). Variants:
- ``fixed`` rows: batch x (729 image + 300 text) tokens, every row full; attention
  (``--attn``: sdpa, flex_attention, flash_attention_2 where flash-attn imports), Liger's RMSNorm,
  SwiGLU and RoPE kernels with the fused linear cross-entropy (``--liger``), activation
  checkpointing, micro-batch size;
- ``pool`` rows (``--pool``): the same 16 samples drawn from the NeXT length distribution
  (bench/padding.py) each step, unpacked (micro-batches of ``--pool-batch`` rows, sorted by
  length, padded to the longest) against packed (rows of ``--pack-budget`` tokens, no attention
  mask: transformers isolates the samples from their position ids); one optimizer step per pass.
  Before timing, the packed rows' per-sample logits are compared with each sample run alone.

Each variant prints one line and, for bench/gpu_kit.py, one ``KIT-RESULT {json}`` line. MFU counts
model FLOPs (PaLM convention, recomputation not counted; padding not counted), see
llava_norm/plan/flops.py. ``--profile`` adds the share of the step's GPU time in attention, GEMMs,
the loss, the optimizer and the rest (torch.profiler, one step), and the vision tower's share
(its forward and backward timed alone).

    python bench/gpu_step.py --llms llama-3.2-3b --attn sdpa flex_attention --liger off on --pool --profile
    .venv/bin/python bench/gpu_step.py --toy          # CPU smoke test: every variant at tiny shapes
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import time
from dataclasses import asdict

import torch
from _gpu_variants import (Result, bf16_peak_tflops, fixed_batch, set_compiled, planned_peak, pool_batches, pool_flops,
                           profile_shares, packing_logit_error, vision_share)
from _harness import random_llava
from transformers import AutoConfig, LlamaConfig, SiglipVisionConfig

from llava_norm.plan.backbones import SHIPPED_BACKBONES, vision_part
from llava_norm.plan.flops import train_flops

TARGET_MFU = 0.45
PLAN_TOLERANCE = 0.15  # the plan's peak within 15% of the measured one
# Paper Table 1: mean input-embedding norm T of each LLM (random weights would give a meaningless T).
PAPER_TEXT_NORM = {"llama-3.2-3b": 1.09, "qwen2.5-7b": 0.80}
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


def achieved(flops: float, step_s: float, peak_tflops: float | None) -> tuple[float, float | None]:
    """(TFLOP/s, MFU) of a step of ``flops`` model FLOPs taking ``step_s``; MFU None without a known peak."""
    tflops = flops / step_s / 1e12
    return tflops, (tflops / peak_tflops if peak_tflops else None)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attention_kinds(device: torch.device, asked: list[str]) -> list[str]:
    """The asked implementations this machine runs: flash-attention 2 only where flash_attn imports."""
    return [a for a in asked if a != "flash_attention_2"
            or (device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None)]


def apply_liger(model) -> None:
    """Liger's RMSNorm, SwiGLU and RoPE kernels on the language model (its fused linear
    cross-entropy is the model's own ``loss_kind="fused"`` path with ``loss_kernel="liger"``,
    llava_norm/model/loss.py)."""
    from liger_kernel.transformers import monkey_patch

    apply = {"llama": monkey_patch.apply_liger_kernel_to_llama, "qwen2": monkey_patch.apply_liger_kernel_to_qwen2}
    language_model = model.model.language_model
    apply[language_model.config.model_type](rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                            fused_linear_cross_entropy=False, model=language_model)


def timed_steps(model, micro_batches: list[dict], steps: int, warmup: int, device: torch.device,
                loss_kind: str) -> tuple[float, float | None]:
    """Mean seconds per optimizer step over ``micro_batches`` (gradients accumulated), and peak GiB."""
    # lr 0: the update's work without its effect; at 1e-5, bf16 AdamW took these random weights to NaN
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, fused=device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        for i in range(warmup + steps):
            if i == warmup:
                sync(device)
                start = time.perf_counter()
            for batch in micro_batches:
                model(**batch, loss_kind=loss_kind, loss_kernel="liger").loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        sync(device)
        seconds = (time.perf_counter() - start) / steps
    finally:  # free optimizer state and gradients before the next variant, also after an OOM
        del optimizer
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return seconds, (torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None)


def measure(model, label: dict, micro_batches: list[dict], flops: float, tokens: int, args, device, peak) -> Result:
    result = Result(**label)
    try:
        loss_kind = "fused" if label["liger"] else "plain"
        result.step_s, result.peak_mem_gib = timed_steps(model, micro_batches, args.steps, args.warmup, device,
                                                         loss_kind)
        result.tokens_per_s = tokens / result.step_s
        result.tflops, result.mfu = achieved(flops, result.step_s, peak)
        if args.profile:
            result.shares = profile_shares(model, micro_batches, loss_kind, device)
            result.shares["vision tower (timed alone)"] = vision_share(model, micro_batches, device) / result.step_s
    except torch.OutOfMemoryError as error:
        result.error = f"out of memory ({str(error).splitlines()[0][:80]})"
    except Exception as error:  # noqa: BLE001 - one variant's failure (a kernel, a compile) is a result
        result.error = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
    return result


def report(result: Result) -> None:
    print(result.line(), flush=True)
    print("KIT-RESULT " + json.dumps(asdict(result)), flush=True)


def run_arch(arch: str, vision, text, text_norm: float, args, device, peak) -> list[Result]:
    tokens_per_image = (vision.image_size // vision.patch_size) ** 2
    model = random_llava(vision, text, tokens_per_image, args.arm, attn="sdpa", text_norm=text_norm,
                         device=str(device), dtype=torch.bfloat16).train()
    results = []
    checks = logit_checks(model, vision, text, tokens_per_image, args, device) if args.pool else {}
    if args.logit_check_only:
        for attn, check in checks.items():
            print(f"{arch} {attn} packed logits vs alone: {check}", flush=True)
        return results
    for liger in args.liger:  # off first: Liger's kernels patch the model for good
        if liger == "on" and device.type != "cuda":
            results.append(Result(arch, "-", False, True, 0, False, error="Liger's Triton kernels need CUDA"))
            report(results[-1])
            continue
        if liger == "on":
            try:
                apply_liger(model)
            except Exception as error:  # noqa: BLE001 - not installed, or does not fit this transformers
                results.append(Result(arch, "-", False, True, 0, False, error=f"liger: {type(error).__name__}: "
                                                                             f"{str(error)[:160]}"))
                report(results[-1])
                continue
        for compiled in args.compile:  # each compile is undone after its variants
            set_compiled(model, compiled == "on", args.compile_backend)
            for attn in attention_kinds(device, args.attn):
                model.config.text_config._attn_implementation = attn  # the LLM's layers and masks read it per call
                results += fixed_rows(model, arch, attn, liger == "on", compiled == "on", vision, text,
                                      tokens_per_image, text_norm, args, device, peak)
                if args.pool and liger == "off" and compiled == "off":
                    set_checkpointing(model, False)
                    results += run_pool(model, arch, attn, vision, text, tokens_per_image, args, device, peak,
                                        checks.get(attn))
            set_compiled(model, False)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def fixed_rows(model, arch, attn, liger, compiled, vision, text, tokens_per_image, text_norm, args, device,
               peak) -> list[Result]:
    """Each micro-batch size and checkpointing setting over full rows, ``args.accum`` micro-batches
    (the same tensors) per optimizer step, as a recipe with gradient accumulation steps."""
    results, seq = [], tokens_per_image + args.text_tokens
    for batch in args.batches:
        micro = [fixed_batch(tokens_per_image, args.text_tokens, batch, vision, text, device)] * args.accum
        for ckpt in args.checkpointing:
            set_checkpointing(model, ckpt == "on")
            label = dict(arch=arch, attn=attn, packed=False, liger=liger, batch=batch, checkpointing=ckpt == "on",
                         rows=f"{args.accum}x{batch}x{seq}" if args.accum > 1 else f"{batch}x{seq}",
                         accum=args.accum, compiled=compiled)
            result = measure(model, label, micro, args.accum * train_flops(vision, text, seq, batch).total,
                             args.accum * batch * seq, args, device, peak)
            result.plan_gib = planned_peak(vision, text, tokens_per_image, args.arm, text_norm, batch,
                                           args.text_tokens, ckpt == "on", args.accum) / 2 ** 30
            results.append(result)
            report(result)
    return results


def logit_checks(model, vision, text, tokens_per_image, args, device) -> dict:
    """Per attention implementation, the packed rows' logits against each sample run alone, on the
    freshly built model (timed steps would have changed its weights); an error's text if it fails."""
    micro, _ = pool_batches(tokens_per_image, vision, text, args.pool_samples, args.pool_batch, args.pack_budget,
                            args.max_length, device)
    checks = {}
    for attn in attention_kinds(device, args.attn):
        model.config.text_config._attn_implementation = attn
        try:
            checks[attn] = packing_logit_error(model, micro[0], tokens_per_image, device)
        except Exception as error:  # noqa: BLE001 - a failed check is a result
            checks[attn] = f"logit check: {type(error).__name__}: {str(error)[:160]}"
    model.config.text_config._attn_implementation = "sdpa"
    return checks


def run_pool(model, arch, attn, vision, text, tokens_per_image, args, device, peak, check) -> list[Result]:
    """Unpacked against packed over the same samples; the packed row carries its logit check."""
    results = []
    # flex_attention compiles per shape: only the packed rows, padded to the budget, have one shape
    for packed in ((True,) if attn == "flex_attention" else (False, True)):
        micro, samples = pool_batches(tokens_per_image, vision, text, args.pool_samples, args.pool_batch,
                                      args.pack_budget if packed else None, args.max_length, device)
        label = dict(arch=arch, attn=attn, packed=packed, liger=False, batch=len(micro[0]["input_ids"]),
                     checkpointing=False, rows=f"{len(samples)} samples in {len(micro)} micro-batches")
        tokens = sum(length for length, _ in samples)
        result = measure(model, label, micro, pool_flops(vision, text, samples), tokens, args, device, peak)
        if packed and isinstance(check, dict):
            result.packing_logit_error = check
        elif packed and check is not None:
            result.error = check
        results.append(result)
        report(result)
    return results


def set_checkpointing(model, on: bool) -> None:
    if on:  # as the trainer sets it (train.gradient_checkpointing)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.activation_checkpointing_disable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llms", nargs="+", default=list(LLMS), choices=sorted(LLMS))
    parser.add_argument("--attn", nargs="+", default=["sdpa"],
                        choices=["sdpa", "flex_attention", "flash_attention_2"])
    parser.add_argument("--liger", nargs="+", default=["off"], choices=["off", "on"])
    parser.add_argument("--batches", type=int, nargs="+", default=[4], help="per-device batch sizes (fixed rows)")
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step (fixed rows)")
    parser.add_argument("--compile", nargs="+", default=["off"], choices=["off", "on"],
                        help="torch.compile the LLM's and the tower's layers")
    parser.add_argument("--compile-backend", default="inductor", help="aot_eager: dynamo and autograd, no codegen")
    parser.add_argument("--checkpointing", nargs="+", default=["off"], choices=["off", "on"])
    parser.add_argument("--text-tokens", type=int, default=300, help="text tokens per fixed row after the image")
    parser.add_argument("--pool", action="store_true", help="also unpacked vs packed over NeXT-like lengths")
    parser.add_argument("--pool-samples", type=int, default=16)
    parser.add_argument("--pool-batch", type=int, default=4, help="unpacked rows per micro-batch")
    parser.add_argument("--pack-budget", type=int, default=4096, help="tokens per packed row")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--logit-check-only", action="store_true", help="with --pool: the packed-logit check alone")
    parser.add_argument("--profile", action="store_true", help="time shares per variant (torch.profiler)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--arm", default="ln_textnorm_gwc")
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the device's bf16 peak")
    parser.add_argument("--toy", action="store_true", help="tiny shapes on CPU: a smoke test of every variant")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.toy else "cpu")
    if not args.toy and device.type != "cuda":
        parser.error("no CUDA device: real shapes need a GPU (use --toy for the CPU smoke test)")
    peak = args.peak_tflops or bf16_peak_tflops(device)
    if args.toy:
        archs = {"toy": (toy_vision(), toy_llm(), 1.0)}
        args.steps, args.warmup, args.text_tokens = 2, 1, 40
        args.pack_budget, args.max_length, args.pool_samples = 256, 120, 6
    else:
        archs = {name: (siglip_so400m_384(), shipped(LLMS[name]), PAPER_TEXT_NORM[name]) for name in args.llms}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}; torch {torch.__version__}; bf16 peak: {f'{peak:.0f} TFLOP/s' if peak else 'unknown'}; "
          f"arm {args.arm}; {args.steps} timed steps after {args.warmup} warm-up", flush=True)
    results = [r for arch, (vision, text, norm) in archs.items()
               for r in run_arch(arch, vision, text, norm, args, device, peak)]
    measured = [r for r in results if r.mfu is not None]
    if args.logit_check_only:
        pass  # nothing timed
    elif measured:
        best = max(measured, key=lambda r: r.mfu)
        print(f"MFU best: {best.mfu:.1%} ({best.name()}; "
              f"{'meets' if best.mfu >= TARGET_MFU else 'MISSES'} target >= {TARGET_MFU:.0%})")
    else:
        print(f"MFU: n/a (no bf16 peak known for {name}; pass --peak-tflops)")
    compared = [r for r in results if r.peak_mem_gib and r.plan_gib]
    if compared:
        worst = max(compared, key=lambda r: abs(r.peak_mem_gib / r.plan_gib - 1))
        off = worst.peak_mem_gib / worst.plan_gib - 1
        print(f"plan vs measured peak memory: worst {off:+.1%} ({worst.name()}; "
              f"{'meets' if abs(off) <= PLAN_TOLERANCE else 'MISSES'} target within {PLAN_TOLERANCE:.0%})")


if __name__ == "__main__":
    main()
