"""The paper's two real stacks at full width, one training step on CPU in bf16: do the shapes line up?

Owns the check a user would otherwise first make on a cluster, after the queue. For
SigLIP-SO400M + Llama-3.2-3B-Instruct and SigLIP-SO400M + Qwen2.5-7B-Instruct it writes local
backbone folders from the published configs (configs/backbones) at full width, depth truncated
to fit a 24 GB machine (``--llm-layers``, ``--vision-layers``), random weights in bf16, and
tokenizers with the real special tokens and chat templates (bench/real_width.py). Then, through
the builder path a hub id takes (``build_model``) and the one prompt path (``PromptEncoder``),
one multimodal training sample runs forward and backward, and it checks:

1. shapes: logits of (1, tokens, the real vocabulary), a finite loss, a gradient on every
   trained parameter group;
2. the image tokens are scattered where the chat template puts ``<image>``: the LLM's input
   embeddings hold the projected image features exactly at the positions of the image tokens,
   whose preceding text is the template's rendering up to the placeholder, and the embedding
   rows of their ids everywhere else;
3. T (``config.text_norm``) is the mean norm of the LLM's saved input embeddings;
4. GWC stays exact at width 3072 / 3584: the gradient leaving the norm-alignment layer is the
   plain LayerNorm's, divided by s = max(mean|g|, clamp).

    .venv/bin/python bench/dry_run.py                          # both stacks, about 1.5 minutes on 2 cores
    .venv/bin/python bench/dry_run.py --stacks llama-3.2-3b --keep runs/dry_run
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from real_width import write_backbone
from safetensors import safe_open

from llava_norm.config_schema import TEMPLATE_KWARGS
from llava_norm.data.collate import collate
from llava_norm.data.prompts import IMAGE_PREFIX, PromptEncoder
from llava_norm.model.builder import ModelSpec, build_model
from llava_norm.model.norm_align import text_embedding_norm

VISION = "google/siglip-so400m-patch14-384"
STACKS = {"llama-3.2-3b": "meta-llama/Llama-3.2-3B-Instruct", "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct"}
ARM = "ln_textnorm_gwc"


def sample_messages() -> list[dict]:
    return [{"role": "user", "content": IMAGE_PREFIX + "What colour is the shape in the top left?"},
            {"role": "assistant", "content": "The shape in the top left is a red circle."}]


def embedding_weight(llm_dir: Path) -> torch.Tensor:
    with safe_open(str(llm_dir / "model.safetensors"), framework="pt") as f:
        key = next(k for k in f.keys() if k.endswith("embed_tokens.weight"))
        return f.get_tensor(key)


def check_stack(vision_dir: Path, llm_dir: Path, dtype: str = "bfloat16") -> list[str]:
    """One sample forward and backward through the real path; returns the checks' verdict lines
    (raises AssertionError on the first that fails)."""
    bundle = build_model(ModelSpec(vision_tower=str(vision_dir), llm=str(llm_dir), norm_alignment=ARM, dtype=dtype))
    model, config = bundle.model.train(), bundle.model.config
    for p in model.parameters():
        p.requires_grad_(True)
    encoder = PromptEncoder.for_bundle(bundle)
    size = config.vision_config.image_size
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8))
    example = encoder.example(sample_messages(), [image])
    batch = collate([example], bundle.tokenizer.pad_token_id)
    captured = {}
    lm_hook = model.model.language_model.register_forward_pre_hook(
        lambda m, a, kw: captured.__setitem__("embeds", kw["inputs_embeds"]), with_kwargs=True)

    def keep_norm(module, args, output):
        args[0].retain_grad()
        output.retain_grad()
        captured["norm_in"], captured["norm_out"] = args[0], output

    norm_hook = model.model.multi_modal_projector.norm.register_forward_hook(keep_norm)
    out = model(**batch)
    out.loss.backward()
    lm_hook.remove()
    norm_hook.remove()
    lines = []

    ids = batch["input_ids"][0]
    vocab = config.text_config.vocab_size
    assert out.logits.shape == (1, len(ids), vocab), out.logits.shape
    assert torch.isfinite(out.loss), out.loss
    for group in ("vision_tower", "multi_modal_projector", "language_model"):
        grads = [p.grad for n, p in model.named_parameters() if group in n and p.grad is not None]
        assert grads and all(torch.isfinite(g.float()).all() for g in grads), group
    lines.append(f"shapes: logits {tuple(out.logits.shape)} (vocabulary {vocab:,}), loss {out.loss.item():.3f}, "
                 f"finite gradients in the vision tower, projector and LLM")

    where = (ids == config.image_token_id).nonzero().flatten()
    start, n = int(where[0]), len(where)
    assert n == config.image_seq_length and int(where[-1]) == start + n - 1, "one contiguous block per image"
    rendered = bundle.tokenizer.apply_chat_template(sample_messages(), tokenize=False, **TEMPLATE_KWARGS)
    before = rendered[:rendered.index("<image>")]
    decoded = bundle.tokenizer.decode(ids[:start])
    assert decoded == before, (decoded[-80:], before[-80:])
    embeds = captured["embeds"][0]
    features = model.model.get_image_features(pixel_values=batch["pixel_values"]).pooler_output[0]
    torch.testing.assert_close(embeds[start:start + n], features.to(embeds.dtype), rtol=0, atol=0)
    text = torch.cat([ids[:start], ids[start + n:]])
    table = model.get_input_embeddings()(text)
    torch.testing.assert_close(torch.cat([embeds[:start], embeds[start + n:]]), table, rtol=0, atol=0)
    lines.append(f"image tokens: {n} at positions {start}-{start + n - 1}, right after the template's text "
                 f"{before[-40:]!r}; their input embeddings are the projected features, every other position "
                 f"its id's embedding row")

    expected_t = text_embedding_norm(embedding_weight(llm_dir))
    assert abs(config.text_norm - expected_t) <= 1e-6 * expected_t, (config.text_norm, expected_t)
    lines.append(f"T = {config.text_norm:.6f}, the mean norm of the saved input embeddings ({expected_t:.6f})")

    norm = model.model.multi_modal_projector.norm
    x = captured["norm_in"].detach().clone().requires_grad_()
    plain = F.layer_norm(x, (norm.hidden_size,), norm.weight.detach(), norm.bias.detach(), norm.eps)
    (reference,) = torch.autograd.grad(plain, x, captured["norm_out"].grad)
    s = norm.compensation_scale()
    expected = (reference * (1.0 / norm._scale())).to(reference.dtype)
    torch.testing.assert_close(captured["norm_in"].grad, expected, rtol=0, atol=0,
                               msg=lambda said: f"GWC check: the gradient into the projector is not the plain "
                                                f"LayerNorm's / W ({said})")
    lines.append(f"GWC at width {norm.hidden_size}: the gradient into the projector is the plain LayerNorm's / "
                 f"s = {s:.6f} (bit-identical in {dtype})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stacks", nargs="+", choices=sorted(STACKS), default=list(STACKS))
    parser.add_argument("--llm-layers", type=int, default=2, help="LLM depth kept (width is always the real one)")
    parser.add_argument("--vision-layers", type=int, default=3, help="vision tower depth kept (>= 2: layer -2 is read)")
    parser.add_argument("--keep", help="write the backbone folders here (default: a temporary directory)")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="dry-run-") as tmp:
        work = Path(args.keep or tmp)
        vision = write_backbone(VISION, work / "siglip-so400m", layers=args.vision_layers)
        for stack in args.stacks:
            start = time.perf_counter()
            llm = write_backbone(STACKS[stack], work / stack, layers=args.llm_layers)
            print(f"[{stack}] SigLIP-SO400M ({args.vision_layers} of 27 layers) + {STACKS[stack]} "
                  f"({args.llm_layers} layers), full width, bf16, arm {ARM}")
            for line in check_stack(vision, llm):
                print(f"  ok  {line}")
            print(f"  took {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
