"""LM warm-up: causal-LM pretraining of a tiny LLM on the synthetic world's text.

Owns the text the LLM learns from and its packing, the held-out loss and the norm
statistics. The training text is the world's plain-text corpus (``text/corpus.jsonl``:
scene descriptions with Q/A, world facts, MMLU- and HellaSwag-formatted training items)
plus the text-only rows of the instruction set rendered with the tokenizer's own chat
template. The chat rows stand in for the instruction tuning a real "-Instruct" checkpoint
has had, so the LLM already knows its turn format before the LLaVA stages; the image rows
are left to stage 2, where the answers can depend on the image. Every document is tokenised
(BOS included where the tokenizer adds one), closed with the end-of-text token and packed
into fixed-length blocks (GPT-style); every 20th document is held out for the before/after loss.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from llava_norm.config_schema import TEMPLATE_KWARGS
from llava_norm.data.dataset import ROLE_MAP
from llava_norm.model.norm_align import text_embedding_norm
from llava_norm_demo.tiny import make_llama3_tokenizer, make_qwen25_tokenizer
from llava_norm_demo.synth.build import read_manifest
from llava_norm_demo.warmup.loop import LoopConfig, holdout_split, train_steps

END_OF_TEXT = ("<|end_of_text|>", "<|endoftext|>")  # Llama-3, Qwen2 document separators


@dataclass(frozen=True)
class LMData:
    train_docs: list[str]
    heldout_docs: list[str]


def world_lm_documents(world: str | Path, template_kwargs: dict | None, tokenizer) -> LMData:
    """The LM warm-up's documents from a synthetic world directory (see the module docstring)."""
    world = Path(world)
    corpora = read_manifest(world)["corpora"]
    docs = [json.loads(line)["text"] for line in (world / corpora["text"]["path"]).read_text().splitlines() if line]
    for row in json.loads((world / corpora["instruct"]["path"]).read_text()):
        if "image" in row:
            continue
        messages = [{"role": ROLE_MAP[turn["from"]], "content": turn["value"]} for turn in row["conversations"]]
        docs.append(tokenizer.apply_chat_template(messages, tokenize=False, **(template_kwargs or {})))
    return LMData(*holdout_split(docs))


def end_of_text_id(tokenizer) -> int:
    vocab = tokenizer.get_vocab()
    return next((vocab[t] for t in END_OF_TEXT if t in vocab), tokenizer.eos_token_id)


def pack(docs: list[str], tokenizer, block: int) -> torch.Tensor:
    """Documents -> (n_blocks, block) token ids; the last partial block is dropped."""
    eot = end_of_text_id(tokenizer)
    stream: list[int] = []
    for doc in docs:
        # Chat renderings already start with the template's own BOS; plain text gets the tokenizer's.
        has_bos = tokenizer.bos_token is not None and doc.startswith(tokenizer.bos_token)
        stream += tokenizer(doc, add_special_tokens=not has_bos).input_ids + [eot]
    n = len(stream) // block
    if n == 0:
        raise ValueError(f"{len(stream)} tokens cannot fill one block of {block}")
    return torch.tensor(stream[: n * block]).view(n, block)


@torch.no_grad()
def heldout_stats(model, blocks: torch.Tensor, batch_size: int) -> dict:
    """Mean next-token loss on held-out blocks, T, and the mean hidden-state norm per layer
    (embeddings first; transformers returns the last layer's output after the final RMSNorm)."""
    losses, layer_norms = [], None
    for start in range(0, len(blocks), batch_size):
        ids = blocks[start:start + batch_size]
        out = model(input_ids=ids, labels=ids, output_hidden_states=True)
        losses.append(float(out.loss) * len(ids))
        norms = torch.stack([h.norm(dim=-1).mean() for h in out.hidden_states]) * len(ids)
        layer_norms = norms if layer_norms is None else layer_norms + norms
    n = len(blocks)
    return {"loss": sum(losses) / n, "text_norm_T": text_embedding_norm(model.get_input_embeddings().weight),
            "hidden_norm_per_layer": [round(float(x) / n, 4) for x in layer_norms]}


def warm_lm(source: str | Path, out_dir: str | Path, data: LMData, config: LoopConfig, block: int) -> dict:
    """Pretrain the causal LM in ``source`` on ``data``; save it (HF format) to ``out_dir``."""
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    train, heldout = pack(data.train_docs, tokenizer, block), pack(data.heldout_docs, tokenizer, block)
    before = heldout_stats(model, heldout, config.batch_size)
    start = time.perf_counter()

    def loss_of(indices: torch.Tensor) -> torch.Tensor:
        ids = train[indices]
        return model(input_ids=ids, labels=ids).loss

    losses = train_steps(model, len(train), loss_of, config, desc=f"LM warm-up {Path(source).name}")
    seconds = time.perf_counter() - start
    after = heldout_stats(model, heldout, config.batch_size)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {"kind": "causal_lm", "source": str(source), "train_blocks": len(train), "heldout_blocks": len(heldout),
            "block_tokens": block, "steps": config.steps, "seconds": round(seconds, 1),
            "train_loss_first": losses[0], "train_loss_last": losses[-1], "before": before, "after": after}


def world_tokenizer_corpus(world: str | Path) -> list[str]:
    """Every training text of a world for ``make_tiny``'s tokenizers: the text corpus, the
    captions, and the instruction conversations rendered through both tiny chat templates
    (Llama-3.2 and Qwen2.5), so the BPE merges cover the words the pipeline uses and the
    templates' fixed text (headers, system blocks) instead of spelling them byte by byte."""
    world = Path(world)
    corpora = read_manifest(world)["corpora"]
    texts = [json.loads(line)["text"] for line in (world / corpora["text"]["path"]).read_text().splitlines() if line]
    texts += [t["value"] for row in json.loads((world / corpora["pretrain"]["path"]).read_text())
              for t in row["conversations"]]
    # Throwaway tokenizers: only their chat templates are used, to render the conversations as text.
    renderers = [make(["a"], 300) for make in (make_llama3_tokenizer, make_qwen25_tokenizer)]
    for row in json.loads((world / corpora["instruct"]["path"]).read_text()):
        messages = [{"role": ROLE_MAP[t["from"]], "content": t["value"]} for t in row["conversations"]]
        texts += [r.apply_chat_template(messages, tokenize=False, **TEMPLATE_KWARGS) for r in renderers]
    return texts
