"""lmms-eval model plugin: ``python -m lmms_eval --model llava_norm --model_args pretrained=DIR``.

Owns the adapter between lmms-eval's "simple" model protocol and ``Predictor``, so a
llava-norm checkpoint is prompted exactly as in training and in ``llava-norm eval``: the
training run's prompt settings (``data.prompts.training_prompt_settings``) through the one
prompt path (``data.prompts.PromptEncoder``). Registered through lmms-eval's
entry-point group ``lmms_eval.models`` (see pyproject.toml); importing this module needs
lmms-eval installed, which llava-norm itself never requires.

Model args: ``pretrained`` (checkpoint dir), ``dtype`` (auto|float32|bfloat16),
``batch_size``, ``prompt_format`` / ``system_prompt`` (default: the training config's),
``trust_remote_code``. Data parallelism follows lmms-eval's launcher (``accelerate launch``
or torchrun): each process takes the rank and world size from the environment.
"""

from __future__ import annotations

import os

import torch
from lmms_eval.api.model import lmms

from llava_norm.data.prompts import Prompt, training_prompt_settings
from llava_norm.inference import Predictor
from llava_norm.config_schema import resolve_dtype
from llava_norm.model.builder import load_bundle

MODEL_ID = "llava_norm"
DEFAULT_BATCH_SIZE = 8


def manifest():
    """Entry-point payload: lmms-eval's registry calls this and registers the returned manifest."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_ID, simple_class_path=f"{__name__}.LlavaNormLmms")


def _as_bool(value, name: str = "option") -> bool:
    """A --model_args flag: true/false (1/0, yes/no); anything else is refused, naming it, rather
    than read as false (stop_at_until=flase would have cut the replies it was to keep)."""
    if isinstance(value, bool):
        return value
    word = str(value).lower()
    if word not in ("1", "true", "yes", "0", "false", "no"):
        raise ValueError(f"llava_norm model_args: {name}={value!r}; give true or false")
    return word in ("1", "true", "yes")


def _cut_at_stop_strings(text: str, until) -> str:
    for stop in [until] if isinstance(until, str) else (until or []):
        if stop and stop in text:
            text = text[:text.index(stop)]
    return text


class LlavaNormLmms(lmms):
    is_simple = True

    def __init__(self, pretrained: str, dtype: str = "auto", batch_size: int | str = DEFAULT_BATCH_SIZE,
                 prompt_format: str | None = None, system_prompt: str | None = None,
                 trust_remote_code: bool | str = False, device: str | None = None,
                 stop_at_until: bool | str = True, **unused) -> None:
        super().__init__()
        # lmms-eval gives every task that names no stop strings until=["\n\n"]; its own llava
        # wrapper ignores them (and ``llava-norm eval`` cuts nothing), so a reply with a blank
        # line scores as there only with stop_at_until=false
        self.stop_at_until = _as_bool(stop_at_until, "stop_at_until")

        self._rank = int(os.environ.get("RANK", "0"))
        self._world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", "0"))
            self._device = torch.device("cuda", local)
        else:
            self._device = torch.device(device if device and device != "cuda" else "cpu")
        bundle = load_bundle(pretrained, dtype=resolve_dtype(dtype, self._device),
                             trust_remote_code=_as_bool(trust_remote_code, "trust_remote_code"))
        bundle.model.to(self._device)
        settings = training_prompt_settings(pretrained)
        if prompt_format:
            settings.prompt_format = prompt_format
        if system_prompt is not None:
            settings.system_prompt = system_prompt or None
        self.batch_size_per_gpu = int(batch_size) if str(batch_size).isdigit() else DEFAULT_BATCH_SIZE
        self.predictor = Predictor.from_settings(bundle, settings, device=self._device)

    @property
    def device(self) -> torch.device:
        return self._device

    def _doc(self, task, split, doc_id):
        return self.task_dict[task][split][doc_id]

    def generate_until(self, requests) -> list[str]:
        replies: list[str] = []
        for start in range(0, len(requests), self.batch_size_per_gpu):
            chunk = [r.args for r in requests[start:start + self.batch_size_per_gpu]]
            prompts, budgets, stops = [], [], []
            for context, gen_kwargs, doc_to_visual, doc_id, task, split in chunk:
                visuals = [v for v in (doc_to_visual(self._doc(task, split, doc_id)) or []) if v is not None]
                if len(visuals) > 1:
                    raise ValueError(f"{task} doc {doc_id}: {len(visuals)} images; llava-norm models take one image")
                prompts.append(Prompt(context, visuals[0].convert("RGB") if visuals else None))
                budgets.append(int(gen_kwargs.get("max_new_tokens", 1024)))
                stops.append(gen_kwargs.get("until"))
            # Greedy everywhere, as the paper evaluates.
            texts = self.predictor.generate_budgeted(prompts, budgets)
            if self.stop_at_until:
                texts = [_cut_at_stop_strings(text, stop) for text, stop in zip(texts, stops)]
            replies.extend(texts)
        return replies

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """(the continuation's negative log-likelihood, whether it is the greedy one) per request.

        Why negated: lmms-eval's multiple-choice scoring takes the *smallest* value (``argmin``,
        and ``argmin`` over value / characters for acc_norm), as its own wrappers return a loss;
        a log-likelihood, where larger is better, would be scored backwards. The summed loss
        picks lm-eval's acc and acc_norm choices. (lmms-eval's perplexity and acc_mutual_info
        read the value as a log-likelihood: inverted here, as with its own wrappers.)"""
        pairs = []
        for context, doc_to_target, doc_to_visual, doc_id, task, split in [r.args for r in requests]:
            doc = self._doc(task, split, doc_id)
            if doc_to_visual is not None and any(v is not None for v in (doc_to_visual(doc) or [])):
                raise ValueError(f"{task} doc {doc_id}: log-likelihood with an image is not supported; "
                                 "llava-norm scores text-only tasks with the LLM inside the model")
            continuation = doc_to_target(doc) if callable(doc_to_target) else doc_to_target
            pairs.append((context, continuation))
        return [(-logprob, greedy) for logprob, greedy in
                self.predictor.loglikelihood_details(pairs, batch_size=self.batch_size_per_gpu)]

    def generate_until_multi_round(self, requests) -> list[str]:
        raise NotImplementedError("llava_norm: multi-round generation is not supported by this plugin")
