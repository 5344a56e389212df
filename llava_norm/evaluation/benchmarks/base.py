"""Item types, the ``Benchmark`` contract and the benchmark registry.

Owns: ``GenerationItem`` / ``LoglikelihoodItem`` (what a model runner consumes),
``EncodedImage`` (an image kept compressed until someone reads ``item.image``), the
abstract ``Benchmark`` every benchmark module implements, the name -> class registry
``BENCHMARKS`` with ``get_benchmark``, and the checks that predictions cover the items.
"""

from __future__ import annotations

import dataclasses
import io
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Union

from PIL import Image


@dataclass(frozen=True)
class EncodedImage:
    """Compressed image bytes plus where they came from (for error messages).

    Benchmarks hold thousands of images; keeping them compressed until use keeps a loaded
    benchmark at roughly the size of its files instead of the size of its decoded pixels.
    """

    data: bytes
    origin: str

    def decode(self) -> Image.Image:
        try:
            with Image.open(io.BytesIO(self.data)) as image:
                return image.convert("RGB")
        except Exception as exc:  # PIL raises many types; callers need the origin
            raise ValueError(f"{self.origin}: image bytes cannot be decoded ({exc})") from exc


class _DecodedOnRead:
    """Data descriptor behind ``GenerationItem.image``.

    Stores a PIL image, ``None`` or an ``EncodedImage``; reading returns a PIL RGB image or
    ``None``. Encoded images are decoded afresh on every read and never cached, so a list of
    items never accumulates decoded pixels while a runner walks through it.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = "_" + name

    def __get__(self, obj: object, objtype: type | None = None) -> Image.Image | None:
        if obj is None:
            # dataclasses read the class attribute to find a default; AttributeError
            # tells them there is none, so ``image`` stays a required field.
            raise AttributeError("image")
        stored = obj.__dict__[self._slot]
        return stored.decode() if isinstance(stored, EncodedImage) else stored

    def __set__(self, obj: object, value: Image.Image | EncodedImage | None) -> None:
        if value is not None and not isinstance(value, (Image.Image, EncodedImage)):
            raise TypeError(f"image must be a PIL image, an EncodedImage or None, got {type(value)!r}")
        obj.__dict__[self._slot] = value


@dataclass
class GenerationItem:
    """One multimodal item answered by free generation.

    ``prompt`` is the user-turn text exactly as the community prompt builds it, without any
    ``<image>`` token (the runner's chat template places the image).
    """

    benchmark: str
    item_id: str
    prompt: str
    image: Image.Image | None = _DecodedOnRead()  # type: ignore[assignment]
    max_new_tokens: int
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def has_image(self) -> bool:
        """Whether an image is attached, without decoding it."""
        return self.__dict__["_image"] is not None


@dataclass
class LoglikelihoodItem:
    """One text-only item scored by comparing the log-probabilities of continuations."""

    benchmark: str
    item_id: str
    context: str
    continuations: list[str]
    gold: int
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


Item = Union[GenerationItem, LoglikelihoodItem]


class Benchmark(ABC):
    """A benchmark: loads items from published files, scores predictions, names its settings.

    Subclasses are frozen dataclasses whose fields are the user-selectable options.
    """

    name: ClassVar[str]
    kind: ClassVar[str]  # "generate" or "loglikelihood"

    @abstractmethod
    def load(self, path: str | Path, limit: int | None = None) -> list[Item]:
        """Items in file order; ``limit`` keeps the first ``limit`` (see each benchmark)."""

    @abstractmethod
    def score(self, items: Sequence[Item], predictions: Mapping[str, Any]) -> dict[str, Any]:
        """JSON-serialisable metrics. ``predictions[item_id]`` is the generated text
        (generate) or one summed log-probability per continuation (loglikelihood)."""

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """The exact variant used (prompt, split, shots, scoring rule), for result files."""


BENCHMARKS: dict[str, type[Benchmark]] = {}


def register_benchmark(cls: type[Benchmark]) -> type[Benchmark]:
    """Class decorator adding a benchmark to ``BENCHMARKS`` under ``cls.name``."""
    if cls.name in BENCHMARKS:
        raise ValueError(f"benchmark name {cls.name!r} registered twice")
    BENCHMARKS[cls.name] = cls
    return cls


def get_benchmark(name: str, **options: Any) -> Benchmark:
    """Instantiate a registered benchmark; options are its dataclass fields."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; valid names: {', '.join(sorted(BENCHMARKS))}")
    cls = BENCHMARKS[name]
    accepted = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"benchmark {name!r} has no option(s) {unknown}; accepted options: {accepted or 'none'}"
        )
    return cls(**options)


def check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")


def _missing_ids_error(benchmark: str, missing: list[str]) -> ValueError:
    shown = ", ".join(repr(m) for m in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    return ValueError(f"{benchmark}: no prediction for {len(missing)} item(s): {shown}{more}")


def generated_replies(benchmark: str, items: Sequence[Item], predictions: Mapping[str, Any]) -> list[str]:
    """The reply for each item, in item order; a missing or non-string reply is an error
    (silently scoring it wrong would hide a runner bug)."""
    missing = [item.item_id for item in items if item.item_id not in predictions]
    if missing:
        raise _missing_ids_error(benchmark, missing)
    replies = []
    for item in items:
        reply = predictions[item.item_id]
        if not isinstance(reply, str):
            raise ValueError(f"{benchmark}: prediction for item {item.item_id!r} must be a str, got {type(reply).__name__}")
        replies.append(reply)
    return replies


def continuation_logprobs(
    benchmark: str, items: Sequence[LoglikelihoodItem], predictions: Mapping[str, Any]
) -> list[list[float]]:
    """One summed log-probability per continuation for each item, validated."""
    missing = [item.item_id for item in items if item.item_id not in predictions]
    if missing:
        raise _missing_ids_error(benchmark, missing)
    scores = []
    for item in items:
        values = predictions[item.item_id]
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != len(item.continuations):
            raise ValueError(
                f"{benchmark}: prediction for item {item.item_id!r} must be a list of "
                f"{len(item.continuations)} floats (one per continuation), got {values!r}"
            )
        scores.append([float(v) for v in values])
    return scores


def mean(values: Sequence[float]) -> float:
    """Mean of a non-empty sequence; 0.0 for an empty one (a group with no items)."""
    return float(sum(values) / len(values)) if values else 0.0


def first_argmax(values: Sequence[float]) -> int:
    """Index of the largest value; the first maximum wins, like numpy.argmax (lm-eval's rule)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def per_character(scores: Sequence[float], lengths: Sequence[int]) -> list[float]:
    """lm-eval's acc_norm scores: each summed log-prob divided by its choice's character count."""
    return [score / max(length, 1) for score, length in zip(scores, lengths)]
