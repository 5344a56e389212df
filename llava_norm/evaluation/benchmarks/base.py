"""Item types, the benchmark declaration, the ``Benchmark`` contract and the registry.

Owns: ``GenerationItem`` / ``LoglikelihoodItem`` (what a model runner consumes),
``EncodedImage`` (an image kept compressed until someone reads ``item.image``),
``Declaration`` and ``Headline`` (every fact about a benchmark that code outside its module
reads: name, data directory, files, prompt, reply parser, headline metric, chance), the
abstract ``Benchmark`` every benchmark module implements, the name -> class registry
``BENCHMARKS`` with ``get_benchmark``, and the checks that predictions cover the items.
"""

from __future__ import annotations

import dataclasses
import io
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Union, dataclass_transform

import numpy as np
from PIL import Image

from llava_norm.stats import Statistic, mean_of

# How llava_norm.inference.encode_pair splits a (context, continuation) pair into token ids.
PAIR_ENCODING = ("context's trailing whitespace moved to the continuation; continuation ids = the whole text's "
                 "after the context's; no context and no BOS: the end-of-text token first (lm-eval's HF model)")

KINDS = ("generate", "loglikelihood")
SCALE = "0-1"  # how metrics ("scale") and settings ("headline_metric") mark a fraction in [0, 1]


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


@dataclass(frozen=True)
class UnitRows:
    """A benchmark's scored units for resampling (``Benchmark.unit_rows``)."""

    units: dict[str, list[Item]]  # unit key -> its items, in the rows' order
    rows: np.ndarray  # (n_units, k); column 0: the unit right (100) or wrong (0)
    statistic: Statistic  # rows of a resample -> headline in percent


@dataclass(frozen=True)
class Headline:
    """The one number a benchmark contributes to the results table (Table 4 layout)."""

    column: str  # column label, also the benchmark's name in messages
    metric: str  # dotted path into the metrics dict; the value is a fraction in [0, 1]
    legend: str  # what the number is, written under the table
    macro: bool = False  # a mean of group accuracies, so a count of items only approximates it

    def label(self, settings: dict) -> str:
        """The column label, naming the shot count or a non-default AI2D variant."""
        bench = settings.get("benchmark", {})
        if "num_fewshot" in bench:
            return f"{self.column} {bench['num_fewshot']}-shot"
        if bench.get("variant") not in (None, "mask"):
            return f"{self.column} ({bench['variant']})"
        return self.column

    def value(self, metrics: dict) -> float:
        """The headline in percent."""
        node = metrics
        for key in self.metric.split("."):
            node = node[key]
        return 100.0 * float(node)

    def describe(self) -> str:
        """How result files name the headline (their settings' ``headline_metric``)."""
        return f"{self.metric} ({SCALE})"


@dataclass(frozen=True, kw_only=True)
class Declaration:
    """Every fact about one benchmark that code outside its module reads.

    The runner takes ``data_dir`` (the layout under ``--data-root``, which ``llava-norm
    synth`` writes and eval/README.md documents), the loaders take ``files``, the table takes
    ``headline``, the demo report takes ``chance``; ``prompt`` and ``parser`` are the
    community prompt builder and reply rule the module's ``load`` and ``score`` use.
    """

    name: str  # registry key, result file <name>.json, table CSV column, --option prefix
    kind: str  # "generate" (free text) or "loglikelihood" (ranked continuations)
    data_dir: str = ""  # sub-directory of --data-root and of a synthetic world's benchmarks/; default: name
    files: tuple[str, ...]  # globs tried in order inside that directory; the first match wins
    source: str  # the published data the globs are for (settings' "data")
    prompt: Callable[..., str]  # builds an item's user turn (context for loglikelihood)
    parser: Callable[..., Any]  # reads a reply (or the log-probs) into what is scored
    headline: Headline
    chance: Callable[[Sequence[Item]], list[float]]  # guessing's chance of each scored unit
    mirrors: str  # the lmms-eval / lm-eval task whose prompt and scoring this follows
    max_new_tokens: int | None = None  # generate only: the community decoding budget

    def __post_init__(self) -> None:
        if not self.data_dir:
            object.__setattr__(self, "data_dir", self.name)
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if (self.kind == "generate") != (self.max_new_tokens is not None):
            raise ValueError(f"{self.name}: a generate benchmark, and only one, declares max_new_tokens")
        empty = [f.name for f in dataclasses.fields(self) if f.name != "max_new_tokens" and not getattr(self, f.name)]
        if empty:
            raise ValueError(f"{self.name or '<unnamed>'}: declaration leaves {empty} empty")


class Benchmark(ABC):
    """A benchmark: loads items from published files, scores predictions, names its settings.

    Subclasses declare a ``declaration`` (``name``, ``kind`` and ``max_new_tokens`` are read
    from it) and are registered with ``@register_benchmark``, which makes them frozen
    dataclasses whose fields are the user-selectable options.
    """

    declaration: ClassVar[Declaration]
    name: ClassVar[str]
    kind: ClassVar[str]
    max_new_tokens: ClassVar[int | None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declaration = cls.__dict__.get("declaration")
        if declaration is not None:
            cls.name, cls.kind, cls.max_new_tokens = declaration.name, declaration.kind, declaration.max_new_tokens

    @abstractmethod
    def load(self, path: str | Path, limit: int | None = None) -> list[Item]:
        """Items in file order; ``limit`` keeps the first ``limit`` (see each benchmark)."""

    @abstractmethod
    def score(self, items: Sequence[Item], predictions: Mapping[str, Any]) -> dict[str, Any]:
        """JSON-serialisable metrics. ``predictions[item_id]`` is the generated text
        (generate) or one summed log-probability per continuation (loglikelihood)."""

    @abstractmethod
    def details(self) -> dict[str, Any]:
        """Prompt, options and scoring rule of this instance, for ``settings``."""

    def unit_rows(self, items: Sequence[Item], predictions: Mapping[str, Any]) -> UnitRows:
        """The scored units, one row of numbers each, and the statistic that recomputes the
        headline (percent) from the rows of any resample of units: what intervals resample.

        A unit is an item, or a question with all its copies (``meta["group"]``, scored together
        as CircularEval does). Column 0 is the unit's own score, 100 right or 0 wrong. This default
        serves a headline that is the mean over units; a benchmark whose headline is not (an F1,
        a macro average) overrides it with the columns its statistic needs."""
        groups: dict[str, list[Item]] = {}
        for item in items:
            groups.setdefault(str(item.meta.get("group", item.item_id)), []).append(item)
        headline = self.declaration.headline
        rows = np.array([[headline.value(self.score(unit, predictions))] for unit in groups.values()])
        return UnitRows(groups, rows, mean_of(0))

    def settings(self) -> dict[str, Any]:
        """The exact variant used (data, prompt, split, shots, scoring rule), for result files."""
        declared: dict[str, Any] = {"benchmark": self.name, "data": self.declaration.source}
        if self.max_new_tokens is not None:
            declared["max_new_tokens"] = self.max_new_tokens
        if self.kind == "loglikelihood":  # a result scored with another tokenisation of its pairs is another result
            declared["pair_encoding"] = PAIR_ENCODING
        return {**declared, **self.details(), "headline_metric": self.declaration.headline.describe()}

    def check_option(self, option: str, allowed: Iterable[str]) -> None:
        """A clear error for an option value outside ``allowed`` (called from __post_init__)."""
        allowed = list(allowed)
        if getattr(self, option) not in allowed:
            raise ValueError(f"{self.name}: {option} must be one of {allowed}, got {getattr(self, option)!r}")


BENCHMARKS: dict[str, type[Benchmark]] = {}


@dataclass_transform(frozen_default=True)
def register_benchmark(cls: type[Benchmark]) -> type[Benchmark]:
    """Class decorator: makes the benchmark a frozen dataclass (its fields are its options,
    which ``get_benchmark`` checks) and adds it to ``BENCHMARKS`` under its declared name."""
    if not isinstance(cls.__dict__.get("declaration"), Declaration):
        raise TypeError(f"{cls.__name__}: a registered benchmark needs its own Declaration")
    if cls.name in BENCHMARKS:
        raise ValueError(f"benchmark name {cls.name!r} registered twice")
    BENCHMARKS[cls.name] = dataclass(frozen=True)(cls)
    return BENCHMARKS[cls.name]


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
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"limit must be a positive int or None (no items, no score), got {limit!r}")


# ----------------------------------------------------------------------------------------
# predictions


def listed(ids: Sequence[str], first: int = 5) -> str:
    """Item ids as a message names them: the first few quoted, then how many more."""
    return ", ".join(repr(i) for i in ids[:first]) + (f" and {len(ids) - first} more" if len(ids) > first else "")


def _in_item_order(benchmark: str, items: Sequence[Item], predictions: Mapping[str, Any],
                   read: Callable[[Item, Any], tuple[Any, str | None]]) -> list[Any]:
    """``read(item, prediction)`` for each item in order; it returns (value, None) or
    (None, what the prediction must be). A missing or malformed prediction is an error
    (silently scoring it wrong would hide a runner bug)."""
    missing = [item.item_id for item in items if item.item_id not in predictions]
    if missing:
        raise ValueError(f"{benchmark}: no prediction for {len(missing)} item(s): {listed(missing)}")
    values = []
    for item in items:
        value, expected = read(item, predictions[item.item_id])
        if expected is not None:
            raise ValueError(f"{benchmark}: prediction for item {item.item_id!r} must be {expected}")
        values.append(value)
    return values


def _reply(item: Item, reply: Any) -> tuple[str | None, str | None]:
    return (reply, None) if isinstance(reply, str) else (None, f"a str, got {type(reply).__name__}")


def _logprobs(item: LoglikelihoodItem, values: Any) -> tuple[list[float] | None, str | None]:
    n = len(item.continuations)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != n:
        return None, f"a list of {n} floats (one per continuation), got {values!r}"
    return [float(v) for v in values], None


def generated_replies(benchmark: str, items: Sequence[Item], predictions: Mapping[str, Any]) -> list[str]:
    """The reply for each item, in item order; a missing or non-string reply is an error."""
    return _in_item_order(benchmark, items, predictions, _reply)


def continuation_logprobs(
    benchmark: str, items: Sequence[LoglikelihoodItem], predictions: Mapping[str, Any]
) -> list[list[float]]:
    """One summed log-probability per continuation for each item, validated."""
    return _in_item_order(benchmark, items, predictions, _logprobs)


# ----------------------------------------------------------------------------------------
# numbers


def mean(values: Sequence[float]) -> float:
    """Mean of a non-empty sequence; 0.0 for an empty one (a group with no items)."""
    return float(sum(values) / len(values)) if values else 0.0


def accuracy(correct: Iterable[bool]) -> float:
    """Share of true values; 0.0 for none."""
    return mean([float(ok) for ok in correct])


def first_argmax(values: Sequence[float]) -> int:
    """Index of the largest value; the first maximum wins, and a nan before any, like
    numpy.argmax (lm-eval's rule)."""
    nan = [i for i, value in enumerate(values) if math.isnan(value)]
    return nan[0] if nan else max(range(len(values)), key=lambda i: (values[i], -i))


def per_character(scores: Sequence[float], lengths: Sequence[int]) -> list[float]:
    """lm-eval's acc_norm scores: each summed log-prob divided by its choice's character count.
    A choice of no characters (a HellaSwag ending its cleaning empties) gets numpy's quotient:
    -inf for a log-prob below 0 (never picked), nan for 0."""
    return [score / length if length else (math.copysign(math.inf, score) if score else math.nan)
            for score, length in zip(scores, lengths)]


def picked_gold(items: Sequence[LoglikelihoodItem], logprobs: Sequence[Sequence[float]],
                per_char: bool = False) -> list[bool]:
    """Whether the highest-scoring continuation is the gold one: lm-eval's acc, or with
    ``per_char`` its acc_norm (lengths from ``meta["choice_lengths"]``)."""
    return [first_argmax(per_character(scores, item.meta["choice_lengths"]) if per_char else scores) == item.gold
            for item, scores in zip(items, logprobs)]


# ----------------------------------------------------------------------------------------
# chance: uniform guessing's chance of getting each scored unit right


def _choices(item: Item) -> int:
    return len(item.continuations) if isinstance(item, LoglikelihoodItem) else len(item.meta["options"])


def one_of_the_choices(items: Sequence[Item]) -> list[float]:
    """Each item: one of its options (generate, ``meta["options"]``) or continuations."""
    return [1 / _choices(item) for item in items]


def every_copy_right(items: Sequence[Item]) -> list[float]:
    """Each question (``meta["group"]``): every one of its copies answered right, as
    CircularEval demands; the guesses are independent, so the chances multiply."""
    groups: dict[Any, list[float]] = defaultdict(list)
    for item in items:
        groups[item.meta["group"]].append(1 / _choices(item))
    return [math.prod(groups[group]) for group in sorted(groups)]


def never(items: Sequence[Item]) -> list[float]:
    """Free-form answers: guessing never produces the gold text."""
    return [0.0] * len(items)


def yes_or_no(items: Sequence[Item]) -> list[float]:
    """Each item: one of two answers."""
    return [1 / 2] * len(items)
