"""The one prompt path: a conversation plus its images, with one run's prompt settings, as an Example.

Owns three things every consumer shares:

- ``PromptSettings``: what a model was trained to read (prompt format, chat-template kwargs,
  system prompt, image aspect). Its defaults are the training config's (``DataConfig``), and
  ``training_prompt_settings`` reads them back from a run's ``config.yaml``.
- The layout of a user turn with an image, ``<image>\\n`` then the text, as LLaVA's data (and
  ours) writes it (``Prompt``).
- ``PromptEncoder``: messages or a ``Prompt`` plus images -> ``Example`` (ids, labels, pixel
  values), on the tokenizer's chat template through ``ConversationTokenizer``.

Training samples (``data.dataset``), evaluation prompts (``inference.Predictor``, so the
``llava-norm eval`` runner and the lmms-eval plugin) and every diagnostic (``analysis``) are
built by ``PromptEncoder.example``: an evaluation prompt is the exact prefix of a training
sample with the same turns, and a diagnostic sees exactly what evaluation sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from llava_norm.config_schema import DataConfig
from llava_norm.data.collate import Example, collate
from llava_norm.data.conversation import (IMAGE_PLACEHOLDER, ConversationTokenizer, PlainFormat, conversation_tokenizer,
                                          truncate)
from llava_norm.data.images import open_image, preprocess
from llava_norm.layout import CONFIG_FILE

# Training's defaults are the one source: a model saved outside a run (no config.yaml) is read
# with what a run that set nothing would have trained it with.
_TRAINING = DataConfig()
# What goes before the user's text when the turn has an image.
IMAGE_PREFIX = f"{IMAGE_PLACEHOLDER}\n"


@dataclass
class PromptSettings:
    prompt_format: str = _TRAINING.prompt_format
    template_kwargs: dict[str, Any] = field(default_factory=lambda: dict(DataConfig().template_kwargs))
    system_prompt: str | None = _TRAINING.system_prompt
    image_aspect: str = _TRAINING.image_aspect

    @classmethod
    def from_data(cls, data) -> PromptSettings:
        """From a run config's ``data`` section (any mapping with ``.get``); missing keys keep the defaults."""
        default = cls()
        kwargs = data.get("template_kwargs")
        return cls(prompt_format=data.get("prompt_format") or default.prompt_format,
                   template_kwargs=dict(default.template_kwargs if kwargs is None else kwargs),
                   system_prompt=data.get("system_prompt") or None,
                   image_aspect=data.get("image_aspect") or default.image_aspect)


def run_config_file(checkpoint: str | Path) -> Path | None:
    """The training run's config.yaml: beside ``model/`` or a ``checkpoint-N/``, or inside the
    given directory (a merged LoRA model carries its run's); None for a model saved outside a run."""
    for candidate in (Path(checkpoint) / CONFIG_FILE, Path(checkpoint).parent / CONFIG_FILE):
        if candidate.is_file():
            return candidate
    return None


def run_config(checkpoint: str | Path):
    """``run_config_file`` as an OmegaConf tree, or None."""
    from omegaconf import OmegaConf

    found = run_config_file(checkpoint)
    return OmegaConf.load(found) if found is not None else None


def training_prompt_settings(checkpoint: str | Path) -> PromptSettings:
    """The prompt settings the model was trained with (``data.*`` of the run's config.yaml),
    else the training defaults."""
    tree = run_config(checkpoint)
    if tree is None:
        return PromptSettings()
    return PromptSettings.from_data(tree.get("data") or {})


def with_system(messages: list[dict], system_prompt: str | None) -> list[dict]:
    """The messages with ``system_prompt`` as their first turn, unless they bring a system turn of their own."""
    if not system_prompt or any(m["role"] == "system" for m in messages):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


@dataclass
class Prompt:
    text: str  # the user turn, without <image>
    image: Image.Image | None = None
    system: str | None = None  # a system turn of its own; None: the settings' system prompt

    def messages(self) -> list[dict]:
        content = IMAGE_PREFIX + self.text if self.image is not None else self.text
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [{"role": "user", "content": content}]

    def images(self) -> list[Image.Image]:
        return [self.image] if self.image is not None else []


class PromptEncoder:
    """Messages (or a ``Prompt``) plus images -> ``Example``, with one run's prompt settings."""

    def __init__(self, tokenizer: ConversationTokenizer, image_processor, system_prompt: str | None = None,
                 image_aspect: str = "resize"):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.system_prompt = system_prompt
        self.image_aspect = image_aspect

    @classmethod
    def for_bundle(cls, bundle, settings: PromptSettings | None = None) -> PromptEncoder:
        settings = settings or PromptSettings()
        return cls(conversation_tokenizer(bundle, settings.prompt_format, settings.template_kwargs),
                   bundle.image_processor, settings.system_prompt, settings.image_aspect)

    def example(self, messages: list[dict], images: Sequence[Image.Image | str | Path] = (),
                add_generation_prompt: bool = False, max_length: int | None = None,
                sample_id: str = "") -> Example | None:
        """The tokenised conversation (the settings' system prompt first unless it has its own)
        and its preprocessed images. Images given as paths are opened only once the tokens fit
        ``max_length``; None if even the first assistant turn does not fit (see ``truncate``)."""
        encoded = self.tokenizer.encode(with_system(messages, self.system_prompt), add_generation_prompt)
        if encoded.n_images != len(images):
            raise ValueError(f"{encoded.n_images} {IMAGE_PLACEHOLDER!r} placeholders for {len(images)} image(s)")
        if max_length is not None:
            encoded = truncate(encoded, max_length)
            if encoded is None:
                return None
        pixels = None
        if images:
            opened = [i if isinstance(i, Image.Image) else open_image(i) for i in images]  # paths, embedded images
            pixels = preprocess(opened, self.image_processor, self.image_aspect)
        return Example(encoded.input_ids, encoded.labels, pixels, sample_id=sample_id)

    def prompt_example(self, prompt: Prompt) -> Example:
        """What the model is asked: the prompt's turns and the generation prompt, nothing supervised."""
        return self.example(prompt.messages(), prompt.images(), add_generation_prompt=True)

    def reading_example(self, prompt: Prompt) -> Example:
        """What the diagnostics feed a model: its evaluation prompt, except in the 'plain' stage-1
        format, whose prompt keeps no text (BOS and the image). There the prompt's text stands
        where a stage-1 sample's caption stands, so the model reads image and text tokens laid
        out exactly as in its training samples (paper App. F measures both during pretraining)."""
        if not isinstance(self.tokenizer.format, PlainFormat):
            return self.prompt_example(prompt)
        turns = [*prompt.messages(), {"role": "assistant", "content": prompt.text}]
        return self.example(turns, prompt.images(), add_generation_prompt=False)

    def prompt_batch(self, prompts: list[Prompt], reading: bool = False) -> dict:
        """Left-padded (as generation needs) ``input_ids``, ``attention_mask`` and ``pixel_values``
        of the prompts (``reading``: of what the diagnostics feed, see ``reading_example``)."""
        build = self.reading_example if reading else self.prompt_example
        batch = collate([build(p) for p in prompts], self.tokenizer.tokenizer.pad_token_id, padding_side="left")
        batch.pop("labels")
        return batch
