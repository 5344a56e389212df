"""The pieces of bench/gpu_step.py's variants: their inputs (fixed rows, NeXT-like pools, packed
rows), their FLOPs and planned peak, the packed rows' logit check and the time shares.

Owns how a variant's batch is built and how its step time is split; gpu_step.py owns which
variants run and what they print.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from _harness import IMAGE_TOKEN_ID, random_llava, train_batch
from padding import LengthModel, sample_lengths

from llava_norm.data.packing import plan_packs
from llava_norm.model.compile import compile_layers, repeated_layers
from llava_norm.plan.flops import train_flops
from llava_norm.plan.memory import PLAN_ATTENTION, count_parameters, model_states, peak_bytes, trace_activations
from llava_norm.train.params import freeze_backbones

# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, matched against torch.cuda.get_device_name().
BF16_PEAK_TFLOPS = [("H100 PCIe", 756.0), ("H100", 989.4), ("H200", 989.4), ("GH200", 989.4), ("B200", 2250.0),
                    ("A100", 312.0), ("L40S", 362.0), ("A10G", 70.0)]
# Profiler event names -> the part of the step they belong to (first match wins; GEMMs inside the
# fused loss count as GEMMs, its own kernels as the loss).
SHARE_PATTERNS = [("attention", r"attention|flash|flex|fmha|sdpa|triton_tem"),  # tem: flex's compiled template
                  ("loss", r"cross_entropy|nll_loss|log_softmax|liger.*cross|LinearCrossEntropy"),
                  ("optimizer", r"adam|optimizer|multi_tensor"),
                  ("GEMMs", r"^aten::(mm|addmm|bmm|baddbmm|_scaled_mm)$|gemm|cutlass|nvjet")]


@dataclass
class Result:
    arch: str
    attn: str
    packed: bool
    liger: bool
    batch: int
    checkpointing: bool
    rows: str = ""
    accum: int = 1  # micro-batches per optimizer step
    compiled: bool = False  # the LLM's and the tower's layers under torch.compile
    step_s: float | None = None
    tokens_per_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    peak_mem_gib: float | None = None
    plan_gib: float | None = None
    shares: dict = field(default_factory=dict)
    packing_logit_error: dict = field(default_factory=dict)
    error: str | None = None

    def name(self) -> str:
        return (f"{self.arch} {self.attn}{' packed' if self.packed else ''}{' liger' if self.liger else ''}"
                f"{' compiled' if self.compiled else ''} {self.rows} ckpt {'on' if self.checkpointing else 'off'}")

    def line(self) -> str:
        if self.error:
            return f"{self.name()}: {self.error}" + (f" (plan {self.plan_gib:.1f} GiB)" if self.plan_gib else "")
        text = f"{self.name()}: step {self.step_s * 1e3:.1f} ms, {self.tokens_per_s:,.0f} tokens/s, " \
               f"{self.tflops:.2f} TFLOP/s"
        text += f", MFU {self.mfu:.1%}" if self.mfu is not None else ""
        text += f", peak memory {self.peak_mem_gib:.1f} GiB" if self.peak_mem_gib is not None else ""
        text += f", plan {self.plan_gib:.1f} GiB" if self.plan_gib is not None else ""
        if self.shares:
            text += "; shares " + ", ".join(f"{k} {v:.0%}" for k, v in self.shares.items())
        if self.packing_logit_error:
            check = self.packing_logit_error
            text += (f"; packed logits vs alone: max |diff| {check['relative']:.2%} of max |logit| "
                     f"(the same sample in bf16 vs fp32: {check['bf16_floor']:.2%})")
        return text


def bf16_peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in BF16_PEAK_TFLOPS if key in name), None)


def planned_peak(vision, text, tokens_per_image: int, arm: str, text_norm: float, batch: int, text_tokens: int,
                 checkpointing: bool, accum: int = 1) -> int:
    """``llava-norm plan``'s peak for a fixed-row step: one GPU, bf16 weights, gradients and AdamW
    moments (layout ``bf16_adamw``), every reached parameter trained, one image per row."""
    model = random_llava(vision, text, tokens_per_image, arm, attn=PLAN_ATTENTION, text_norm=text_norm,
                         device="meta", dtype=torch.bfloat16)
    freeze_backbones(model, 2)  # everything the step reaches trains; the unused tower layer gets no gradient
    components = count_parameters(model)
    trained = sum(c.trained for c in components)
    states = model_states(trained, sum(c.total for c in components) - trained, 0, "bf16_adamw", 1)
    acts = trace_activations(model, batch, tokens_per_image + text_tokens, batch, tokens_per_image)
    return peak_bytes(states, acts, checkpointing, grad_accum=accum)  # accumulated gradients stay alive


def set_compiled(model, on: bool, backend: str = "inductor") -> None:
    """The trainer's ``train.compile`` (llava_norm/model/compile.py) on or off, in place."""
    if on:
        compile_layers(model, backend)
    else:
        for layer in repeated_layers(model):
            layer._compiled_call_impl = None


def fixed_batch(tokens_per_image: int, text_tokens: int, batch: int, vision, text, device) -> dict:
    inputs = train_batch(tokens_per_image, text_tokens, batch, vision.image_size, text.vocab_size,
                         device=str(device), dtype=torch.bfloat16)
    inputs["use_cache"] = False  # training: no KV cache (and none under checkpointing)
    return inputs


def _sample(length: int, has_image: bool, tokens_per_image: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    ids = torch.randint(2, vocab, (length,), generator=g)
    if has_image:
        ids[:tokens_per_image] = IMAGE_TOKEN_ID
    return ids


def pool_batches(tokens_per_image: int, vision, text, n: int, batch: int, budget: int | None, max_length: int,
                 device) -> tuple[list[dict], list[tuple[int, bool]]]:
    """``n`` samples from the NeXT-like length model as micro-batches: unpacked (``budget`` None:
    ``batch`` rows sorted by length, padded to the longest) or packed (one row of at most
    ``budget`` tokens per micro-batch, position ids restarting per sample, no attention mask).
    Returns the micro-batches and each sample's (tokens, has image)."""
    true, signed = sample_lengths(LengthModel(image_tokens=tokens_per_image, max_length=max_length), n, seed=0)
    samples = [(int(length), bool(s > 0)) for length, s in zip(true, signed)]
    g = torch.Generator().manual_seed(0)
    ids = [_sample(length, img, tokens_per_image, text.vocab_size, g) for length, img in samples]
    pixels = torch.randn(n, 3, vision.image_size, vision.image_size, generator=g)
    if budget is None:
        order = list(np.argsort([length for length, _ in samples], kind="stable"))
        groups = [order[i:i + batch] for i in range(0, n, batch)]
    else:
        groups = plan_packs([length for length, _ in samples], budget, seed=0)
    micro = []
    for group in groups:
        images = [pixels[i] for i in group if samples[i][1]]
        entry = {"pixel_values": torch.stack(images).to(device, torch.bfloat16) if images else None,
                 "use_cache": False}
        if budget is None:
            width = max(samples[i][0] for i in group)
            input_ids = torch.zeros((len(group), width), dtype=torch.long)
            mask = torch.zeros_like(input_ids)
            for r, i in enumerate(group):
                input_ids[r, :len(ids[i])], mask[r, :len(ids[i])] = ids[i], 1
            labels = torch.where((mask == 1) & (input_ids != IMAGE_TOKEN_ID), input_ids, -100)
            entry.update(input_ids=input_ids, attention_mask=mask, labels=labels)
        else:
            # the row's tail up to the budget is one more document of padding (its own positions,
            # no targets): every packed micro-batch has one shape
            tail = budget - sum(len(ids[i]) for i in group)
            row = torch.cat([ids[i] for i in group] + [torch.zeros(tail, dtype=torch.long)])[None]
            positions = torch.cat([torch.arange(len(ids[i])) for i in group] + [torch.arange(tail)])[None]
            labels = torch.where(row != IMAGE_TOKEN_ID, row, -100)
            labels[positions == 0] = -100  # a sample's first token is never a target (llava_norm/data/packing.py)
            labels[:, row.shape[1] - tail:] = -100
            entry.update(input_ids=row, position_ids=positions, labels=labels)
        micro.append({k: (v.to(device) if torch.is_tensor(v) and k != "pixel_values" else v)
                      for k, v in entry.items() if v is not None})
    return micro, samples


def pool_flops(vision, text, samples: list[tuple[int, bool]]) -> float:
    """Model FLOPs of the pool's real tokens: each sample attends to itself only, padding is not work."""
    return sum(train_flops(vision, text, length, 1, images=int(img)).total for length, img in samples)


@torch.no_grad()
def packing_logit_error(model, packed: dict, tokens_per_image: int, device) -> dict:
    """Largest |logit difference| between each sample of a packed row and the sample run alone,
    beside bf16's own error there: the alone logits against the same sample in fp32 (the model
    cast up and back, exactly). Packing is right when its difference is of bf16's size."""
    was_training = model.training
    model.eval()
    dtype = next(model.parameters()).dtype
    try:
        logits = model(**{k: v for k, v in packed.items() if k != "labels"}).logits[0]
        starts = (packed["position_ids"][0] == 0).nonzero().flatten().tolist() + [packed["input_ids"].shape[1]]
        samples, image = [], 0
        for a, b in zip(starts, starts[1:]):
            if not (packed["labels"][0, a + 1:b] != -100).any():
                continue  # the padding document
            ids = packed["input_ids"][:, a:b]
            n_images = int((ids == model.config.image_token_id).sum()) // tokens_per_image
            alone = {"input_ids": ids, "use_cache": False}
            if n_images:
                alone["pixel_values"] = packed["pixel_values"][image:image + n_images]
                image += n_images
            samples.append((a, b, alone, model(**alone).logits[0]))
        worst = floor = scale = 0.0
        model.float()
        for a, b, alone, ref in samples:
            exact = model(**{k: (v.float() if k == "pixel_values" else v) for k, v in alone.items()}).logits[0]
            got, ref = logits[a:b].float(), ref.float()
            if not (torch.isfinite(ref).all() and torch.isfinite(got).all() and torch.isfinite(exact).all()):
                raise ValueError("non-finite logits: nothing to compare")  # max() would read NaN as 0
            worst = max(worst, float((got - ref).abs().max()))
            floor = max(floor, float((ref - exact).abs().max()))
            scale = max(scale, float(ref.abs().max()))
    finally:
        model.to(dtype)
        model.train(was_training)
    if not samples or scale == 0:
        raise ValueError(f"{len(samples)} samples compared, largest logit {scale}: nothing to compare")
    return {"max_abs": worst, "max_logit": scale, "relative": worst / scale, "samples": len(samples),
            "bf16_floor": floor / scale, "over_floor": worst / max(floor, 1e-12)}


def _time(fn, device, repeats: int = 3) -> float:
    fn()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / repeats


def vision_share(model, micro: list[dict], device) -> float:
    """Seconds per step of the vision tower and projector alone, forward and backward."""
    def run():
        for batch in micro:
            if "pixel_values" in batch:
                features = model.model.get_image_features(pixel_values=batch["pixel_values"]).pooler_output
                torch.stack([f.float().sum() for f in features]).sum().backward()
        model.zero_grad(set_to_none=True)
    return _time(run, device)


def _operator(kernel_event) -> str:
    """The names of the CPU operators around a kernel (innermost first), joined."""
    names, event = [], getattr(kernel_event, "cpu_parent", None)
    while event is not None and len(names) < 4:
        names.append(event.name)
        event = event.cpu_parent
    return " ".join(names)


def profile_shares(model, micro: list[dict], loss_kind: str, device) -> dict:
    """Share of one optimizer step's device time (CPU time on CPU) per part, by profiler events."""
    from torch.profiler import ProfilerActivity, profile, record_function

    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, fused=device.type == "cuda")  # as timed_steps

    def step():
        for batch in micro:
            model(**batch, loss_kind=loss_kind, loss_kernel="liger").loss.backward()
        with record_function("optimizer"):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        step()  # optimizer state allocated outside the profiled step
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    finally:
        del optimizer
        model.zero_grad(set_to_none=True)
    totals = dict.fromkeys([name for name, _ in SHARE_PATTERNS] + ["other"], 0.0)
    # each kernel once, by its own name and the operators that launched it; an operator's self
    # time where the profiler gives no kernel events (CPU)
    kernels = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    if kernels:
        spans = [(e.name, _operator(e), e.time_range.elapsed_us()) for e in kernels]
    else:
        own = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        spans = [(e.key, "", getattr(e, own, 0.0) or 0.0) for e in prof.key_averages()]
    for kernel, operator, spent in spans:
        part = next((name for name, pattern in SHARE_PATTERNS
                     if re.search(pattern, kernel, re.I) or re.search(pattern, operator, re.I)), "other")
        totals[part] += spent
    whole = sum(totals.values()) or 1.0
    return {name: spent / whole for name, spent in totals.items()}
