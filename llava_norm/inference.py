"""Batched greedy generation and log-likelihood scoring with a LlavaNorm bundle.

Owns the inference-time use of the shared prompt path: prompts are built by
``data.prompts.PromptEncoder``, the class that builds training samples (with the generation
prompt appended), left-padded, and decoded up to the end-of-turn token. Log-likelihoods for
text-only tasks run the LLM inside the trained model on raw text and return true summed
log-probabilities.
"""

from __future__ import annotations

import torch

from llava_norm.data.collate import Example, collate
from llava_norm.data.conversation import IGNORE_INDEX
from llava_norm.data.prompts import Prompt, PromptEncoder, PromptSettings

__all__ = ["Predictor", "Prompt"]


class Predictor:
    def __init__(self, bundle, prompt_format: str = "chat", template_kwargs: dict | None = None,
                 image_aspect: str = "resize", device: str | torch.device | None = None,
                 system_prompt: str | None = None):
        """The prompt settings as ``PromptSettings`` fields (``template_kwargs`` None: the training
        default); ``from_settings`` takes them whole, e.g. ``training_prompt_settings(checkpoint)``."""
        kwargs = PromptSettings().template_kwargs if template_kwargs is None else dict(template_kwargs)
        self.settings = PromptSettings(prompt_format, kwargs, system_prompt, image_aspect)
        self.bundle = bundle
        self.model = bundle.model.eval()
        self.device = torch.device(device) if device else next(self.model.parameters()).device
        self.prompts = PromptEncoder.for_bundle(bundle, self.settings)
        tokenizer = bundle.tokenizer
        eos = self.model.generation_config.eos_token_id
        self.stop_ids = sorted({tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos] if eos else [])})

    @classmethod
    def from_settings(cls, bundle, settings: PromptSettings, device: str | torch.device | None = None) -> Predictor:
        return cls(bundle, settings.prompt_format, settings.template_kwargs, settings.image_aspect, device,
                   settings.system_prompt)

    def _to_device(self, batch: dict) -> dict:
        dtype = self.model.dtype
        return {k: (v.to(self.device, dtype) if k == "pixel_values" else v.to(self.device)) for k, v in batch.items()}

    def generate(self, prompts: list[Prompt], max_new_tokens: int, batch_size: int = 8) -> list[str]:
        decode = self.bundle.tokenizer.decode
        return [decode(ids, skip_special_tokens=True).strip()
                for ids in self.generate_ids(prompts, max_new_tokens, batch_size)]

    def generate_budgeted(self, prompts: list[Prompt], budgets: list[int]) -> list[str]:
        """Greedy replies when each prompt has its own ``max_new_tokens``: one batched call per
        distinct budget, replies returned in prompt order."""
        groups: dict[int, list[int]] = {}
        for index, budget in enumerate(budgets):
            groups.setdefault(budget, []).append(index)
        replies = [""] * len(prompts)
        for budget, indices in groups.items():
            texts = self.generate([prompts[i] for i in indices], budget, batch_size=len(indices))
            for i, text in zip(indices, texts):
                replies[i] = text
        return replies

    def stream(self, prompt: Prompt, max_new_tokens: int, write) -> str:
        """One greedy reply, its text handed to ``write`` piece by piece as it is decoded (what
        ``llava-norm chat`` prints); returns the reply as ``generate`` returns it."""
        from transformers import TextStreamer

        class Pieces(TextStreamer):
            def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
                write(text)

        streamer = Pieces(self.bundle.tokenizer, skip_prompt=True, skip_special_tokens=True)
        ids = self.generate_ids([prompt], max_new_tokens, batch_size=1, streamer=streamer)[0]
        return self.bundle.tokenizer.decode(ids, skip_special_tokens=True).strip()

    @torch.no_grad()
    def generate_ids(self, prompts: list[Prompt], max_new_tokens: int, batch_size: int = 8,
                     streamer=None) -> list[list[int]]:
        """Greedy continuations, cut before the first stop token."""
        tokenizer = self.bundle.tokenizer
        replies: list[list[int]] = []
        for start in range(0, len(prompts), batch_size):
            batch = self._to_device(self.prompts.prompt_batch(prompts[start:start + batch_size]))
            output = self.model.generate(
                **batch, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                eos_token_id=self.stop_ids, pad_token_id=tokenizer.pad_token_id, streamer=streamer,
            )
            for row in output[:, batch["input_ids"].shape[1]:].tolist():
                cut = next((i for i, t in enumerate(row) if t in self.stop_ids), len(row))
                replies.append(row[:cut])
        return replies

    def loglikelihood(self, pairs: list[tuple[str, str]], batch_size: int = 8) -> list[float]:
        """Summed log p(continuation | context) with the LLM on raw text (BOS first if the LLM has one)."""
        return [score for score, _ in self.loglikelihood_details(pairs, batch_size)]

    @torch.no_grad()
    def loglikelihood_details(self, pairs: list[tuple[str, str]], batch_size: int = 8) -> list[tuple[float, bool]]:
        """(summed log-probability, whether greedy decoding would produce exactly the continuation)."""
        tokenizer = self.bundle.tokenizer
        bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        results: list[tuple[float, bool]] = []
        for start in range(0, len(pairs), batch_size):
            examples = []
            for context, continuation in pairs[start:start + batch_size]:
                ctx, cont = encode_pair(tokenizer, context, continuation)
                # no context and no BOS (Qwen): lm-eval's model puts its end-of-text token first, so the
                # continuation's first token is scored too
                ctx = bos + ctx if bos or context else [tokenizer.eos_token_id]
                examples.append(Example(ctx + cont, [IGNORE_INDEX] * len(ctx) + cont, None))
            batch = self._to_device(collate(examples, tokenizer.pad_token_id, padding_side="right"))
            labels = batch.pop("labels")
            logits = self.model(**batch).logits.float()
            logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
            targets = labels[:, 1:]
            mask = targets != IGNORE_INDEX
            picked = logprobs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            greedy = (logprobs.argmax(-1) == targets) | ~mask
            for score, is_greedy in zip((picked * mask).sum(dim=-1).tolist(), greedy.all(dim=-1).tolist()):
                results.append((score, bool(is_greedy)))
        return results


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's HF model splits a pair (the results record it:
    ``benchmarks.base.PAIR_ENCODING``): whitespace ending the
    context moves to the continuation (so its log-probability is scored: a HellaSwag context
    can end in a space), and the continuation's ids are the whole text's after the context's,
    so a token spanning the boundary is the one the whole text has."""
    kept = context.rstrip()
    context, continuation = kept, context[len(kept):] + continuation
    ids = tokenizer.encode(context, add_special_tokens=False)
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    return ids, whole[len(ids):]
