"""The plan's activation bytes against bytes measured another way.

The plan traces one forward on the meta device with a stand-in for fused attention and counts
the tensors autograd saves through saved-tensor hooks (``llava_norm.plan.memory``). Here the
same model is built with real tensors and the model's own attention implementation (sdpa, whose
CPU kernel keeps what a fused GPU kernel keeps), runs one training forward on the CPU, and the
bytes it leaves on the C heap are read from glibc's allocator statistics: no hook, no stand-in.

Tolerances, each the plan's own error measured here (one run, 2026-11-26, a 2-core AMD EPYC),
with room, not an allowance for a wrong plan:
- the whole micro-batch within 5%: the plan counted 2.0% more than the heap held, on the tiny
  backbones and at real width, the difference lying outside the decoder layers (the heap also
  holds the autograd graph's own objects; the plan counts the inputs the caller allocated);
- two decoder layers at real width within 1% (0.3% apart), which leaves the logits out.
A plan that lost one layer's activations fails the totals (checked by removing one from the sum:
at real width and depth 1 it then fell 6% short of the measured bytes). The layers' difference cannot catch that loss, which
takes one layer from both depths; it holds the bytes of a layer itself to 1%.
The real-width model is Qwen2.5-0.5B with SigLIP-base at their published widths and
vocabulary, the depth cut, in bf16 as the plan assumes.
"""

import ctypes
import ctypes.util
import gc
import json
import shutil

import pytest
import torch

from llava_norm.config import load_config
from llava_norm.plan.backbones import SHIPPED_BACKBONES, meta_model
from llava_norm.plan.memory import PLAN_ATTENTION, trace_activations

TOTAL, LAYERS = 0.05, 0.01  # relative tolerances (module docstring)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_in_use() -> int:
    """Bytes the C heap holds (glibc's mallinfo2: allocated chunks plus mmapped blocks), which is
    where torch's CPU allocator gets every tensor's memory."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def _held_by_forward(model, batch: int, seq: int, images: int, tokens_per_image: int) -> int:
    """Bytes a real training forward leaves on the heap once its outputs are dropped: what
    autograd keeps for the backward, plus the autograd graph's own small objects. Every position
    is a label and the images' tokens come first, the shape the plan assumes."""
    config = model.config
    ids = torch.randint(1, config.text_config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    ids.view(-1)[: images * tokens_per_image] = config.image_token_id
    size = config.vision_config.image_size
    pixels = torch.randn(images, config.vision_config.num_channels, size, size, dtype=model.dtype)
    model.train()
    # a first step allocates once-per-process things (kernel workspaces, caches): not activations
    model(input_ids=ids, pixel_values=pixels, labels=ids, use_cache=False).loss.backward()
    model.zero_grad(set_to_none=False)  # the gradients stay allocated: they are not what is measured
    gc.collect()
    before = _heap_in_use()
    out = model(input_ids=ids, pixel_values=pixels, labels=ids, use_cache=False)
    loss = out.loss
    del out
    gc.collect()
    return _heap_in_use() - before - loss.untyped_storage().nbytes()


def _config(tmp_path, vision: str, llm: str):
    path = tmp_path / "c.yaml"
    path.write_text(f"model: {{vision_tower: {vision}, llm: {llm}, norm_alignment: ln_textnorm_gwc}}\n"
                    f"train: {{output_dir: {tmp_path}/out}}\ndata: {{mixture: [{{path: nowhere.json}}]}}\n")
    return load_config(path, check_paths=False)


def _cut(hub_id: str, out, layers: int):
    """A config-only folder of a shipped backbone with its depth cut (widths and vocabulary kept)."""
    shutil.copytree(SHIPPED_BACKBONES / hub_id, out)
    config = json.loads((out / "config.json").read_text())
    part = config.get("vision_config", config)
    part["num_hidden_layers"] = layers
    if "layer_types" in part:
        part["layer_types"] = part["layer_types"][:layers]
    if "max_window_layers" in part:
        part["max_window_layers"] = min(part["max_window_layers"], layers)
    (out / "config.json").write_text(json.dumps(config))
    return out


def _compare(config, batch: int, seq: int) -> tuple[int, int]:
    planned_model, tokens_per_image, _ = meta_model(config.model, attn_implementation=PLAN_ATTENTION)
    planned = trace_activations(planned_model, batch, seq, batch, tokens_per_image).total(False)
    torch.manual_seed(0)
    real, _, _ = meta_model(config.model, attn_implementation="sdpa", device="cpu")
    measured = _held_by_forward(real, batch, seq, batch, tokens_per_image)
    return planned, measured


def test_the_plan_matches_a_measured_forward_on_the_tiny_backbones(tmp_path, tiny_dir):
    planned, measured = _compare(_config(tmp_path, f"{tiny_dir}/siglip", f"{tiny_dir}/llama"), 2, 160)
    assert planned == pytest.approx(measured, rel=TOTAL), (planned, measured)


def test_the_plan_matches_a_measured_forward_at_real_width(tmp_path):
    """LLM depth 1 and 3 (vision tower 1 layer): the totals, and the two layers' difference,
    which leaves out what does not grow with depth (the 151,936-class logits above all)."""
    found = {}
    for depth in (1, 3):
        vision = _cut("google/siglip-base-patch16-224", tmp_path / f"siglip{depth}", 1)
        llm = _cut("Qwen/Qwen2.5-0.5B-Instruct", tmp_path / f"qwen{depth}", depth)
        found[depth] = _compare(_config(tmp_path, str(vision), str(llm)), 1, 384)
        planned, measured = found[depth]
        assert planned == pytest.approx(measured, rel=TOTAL), (depth, planned, measured)
    planned, measured = found[3][0] - found[1][0], found[3][1] - found[1][1]
    assert measured > 20 * 2 ** 20  # two layers of 384 positions at width 896 (MLP 4,864)
    assert planned == pytest.approx(measured, rel=LAYERS), (planned, measured)
