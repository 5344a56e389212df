"""The synthetic visual world: scene model, seeded scene sampling, train/benchmark split,
and the ground truth of every question that can be asked about a scene.

A scene is 1-4 coloured shapes on a 3x3 grid, a background (plain, striped or noisy) and,
on about a quarter of the images, a short rendered text in the bottom row. Everything is
drawn from an explicit ``numpy.random.Generator``; nothing touches global RNG state.

Hold-out: whether a scene (or a text-only question stem) belongs to training or to the
benchmarks is decided by a salt-free SHA-256 of its canonical key (:func:`split_of`), so the
split is the same for every seed and every world size: a benchmark configuration can never
be drawn by a training generator, whichever seeds the two were built with.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate

import numpy as np

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 200, 0),
    "purple": (140, 50, 180),
    "orange": (250, 130, 0),
}
SHAPES = ("circle", "square", "triangle", "star")
SIZES = ("small", "large")
BACKGROUNDS = ("plain", "striped", "noisy")
POSITIONS = (
    "top left", "top middle", "top right",
    "middle left", "center", "middle right",
    "bottom left", "bottom middle", "bottom right",
)
# Non-uniform priors, so POPE's "popular" objects are really the frequent ones.
SHAPE_WEIGHTS = (0.34, 0.28, 0.22, 0.16)
COLOUR_WEIGHTS = (0.24, 0.20, 0.17, 0.15, 0.13, 0.11)
BACKGROUND_WEIGHTS = (0.5, 0.25, 0.25)
LEXICON = (
    "CAT", "DOG", "SUN", "HAT", "BOX", "KEY", "CUP", "PEN", "BUS", "OWL",
    "MOON", "TREE", "FISH", "BIRD", "BOAT", "CAKE", "LAMP", "RAIN", "ROSE", "FROG",
    "MILK", "KITE", "APPLE", "HOUSE", "TIGER", "ZEBRA", "LEMON", "PIANO", "ROBOT", "TRAIN",
)
TEXT_KINDS = ("word", "nonsense", "digits", "math")
TEXT_KIND_WEIGHTS = (0.7, 0.1, 0.1, 0.1)
NUM_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIRECTIONS = {"above": (-1, 0), "below": (1, 0), "to the left of": (0, -1), "to the right of": (0, 1)}


@lru_cache(maxsize=None)
def _cumulative(p: tuple[float, ...]) -> tuple[float, ...]:
    total = sum(p)
    return tuple(accumulate(x / total for x in p))


def pick(rng: np.random.Generator, seq, p: tuple[float, ...] | None = None):
    """One element of ``seq`` (a plain Python object, never a numpy scalar); ``p`` are
    optional (unnormalised) weights, given as a tuple."""
    if p is None:
        return seq[int(rng.integers(len(seq)))]
    return seq[min(bisect_right(_cumulative(tuple(p)), rng.random()), len(seq) - 1)]


def a_(phrase: str) -> str:
    """Phrase with its indefinite article: 'a red star', 'an orange star'."""
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def plural(kind: str) -> str:
    return kind + "s"


def cell_phrase(pos: str) -> str:
    return "in the center" if pos == "center" else f"at the {pos}"


def neighbour(pos: str, direction: str) -> str | None:
    """Grid cell next to ``pos`` in ``direction`` ("above", "left of", ...), or None."""
    r, c = divmod(POSITIONS.index(pos), 3)
    dr, dc = DIRECTIONS[direction]
    r, c = r + dr, c + dc
    return POSITIONS[3 * r + c] if 0 <= r < 3 and 0 <= c < 3 else None


@dataclass(frozen=True)
class Shape:
    shape: str
    colour: str
    size: str
    position: str

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


@dataclass(frozen=True)
class Scene:
    shapes: tuple[Shape, ...]
    background: str = "plain"
    text: str | None = None
    noise_seed: int = field(default=0, compare=False)

    def key(self) -> str:
        """Canonical description (the noise seed excluded): identical keys look identical."""
        parts = [f"{s.position}:{s.size}:{s.colour}:{s.shape}" for s in self.shapes]
        return "|".join(sorted(parts)) + f"|bg={self.background}|text={self.text or ''}"

    def to_dict(self) -> dict:
        return {"shapes": [vars(s).copy() for s in self.shapes], "background": self.background,
                "text": self.text, "noise_seed": self.noise_seed}

    @classmethod
    def from_dict(cls, d: dict) -> "Scene":
        return cls(tuple(Shape(**s) for s in d["shapes"]), d["background"], d["text"],
                   d.get("noise_seed", 0))

    def count(self, shape: str | None = None, colour: str | None = None) -> int:
        return sum((shape is None or s.shape == shape) and (colour is None or s.colour == colour)
                   for s in self.shapes)

    def objects(self) -> set[str]:
        return {s.name for s in self.shapes}

    def at(self, pos: str | None) -> Shape | None:
        return next((s for s in self.shapes if s.position == pos), None)


def split_of(key: str, holdout_pct: int) -> str:
    """'bench' for about ``holdout_pct`` % of keys, 'train' for the rest; seed-independent."""
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return "bench" if h % 100 < holdout_pct else "train"


def sample_text(rng: np.random.Generator, kind: str | None = None) -> str:
    """A short text of 3-5 characters: lexicon word, nonsense letters, digits, or a sum."""
    kind = kind or pick(rng, TEXT_KINDS, TEXT_KIND_WEIGHTS)
    n = int(rng.integers(3, 6))
    if kind == "word":
        return pick(rng, LEXICON)
    if kind == "nonsense":
        while True:
            s = "".join(chr(65 + int(i)) for i in rng.integers(0, 26, n))
            if s not in LEXICON:
                return s
    if kind == "digits":
        return str(int(rng.integers(1, 10))) + "".join(str(int(i)) for i in rng.integers(0, 10, n - 1))
    a, b = int(rng.integers(1, 20)), int(rng.integers(1, 10))
    return f"{max(a, b)}{pick(rng, '+-')}{min(a, b)}"


def sample_scene(rng: np.random.Generator, *, text_prob: float = 0.25, text_kind: str | None = None,
                 force_text: bool = False, n_shapes: int | None = None) -> Scene:
    """Draw one scene. With text, shapes keep to the top two rows; the text takes the bottom."""
    has_text = force_text or text_kind is not None or rng.random() < text_prob
    n = n_shapes or int(rng.integers(1, 5))
    cells = POSITIONS[:6] if has_text else POSITIONS
    chosen = sorted(int(i) for i in rng.choice(len(cells), size=n, replace=False))
    shapes = tuple(
        Shape(pick(rng, SHAPES, SHAPE_WEIGHTS), pick(rng, list(COLOURS), COLOUR_WEIGHTS),
              pick(rng, SIZES), cells[i])
        for i in chosen
    )
    background = pick(rng, BACKGROUNDS, BACKGROUND_WEIGHTS)
    noise_seed = int(rng.integers(2**31)) if background == "noisy" else 0
    text = sample_text(rng, text_kind) if has_text else None
    return Scene(shapes, background, text, noise_seed)


def sample_split_scene(rng: np.random.Generator, split: str, holdout_pct: int, **kw) -> Scene:
    """Rejection-sample a scene whose key falls in ``split`` ('train' or 'bench')."""
    while True:
        scene = sample_scene(rng, **kw)
        if split_of(scene.key(), holdout_pct) == split:
            return scene


# ----------------------------------------------------------------------------- questions
@dataclass
class QA:
    """One question about a scene: short answer, sentence answer and wrong-answer pool."""

    qtype: str
    question: str
    answer: str
    sentence: str
    wrong: list[str]


def text_distractors(text: str, rng: np.random.Generator, k: int = 3) -> list[str]:
    """Near-miss texts: one character changed (same class), or other lexicon words."""
    out: list[str] = []
    pool = [w for w in LEXICON if w != text and len(w) == len(text)] if text in LEXICON else []
    while len(out) < k:
        if pool and rng.random() < 0.5:
            cand = pick(rng, pool)
        else:
            i = int(rng.integers(len(text)))
            ch = text[i]
            alphabet = "0123456789" if ch.isdigit() else ("+-" if ch in "+-" else "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
            cand = text[:i] + pick(rng, [a for a in alphabet if a != ch]) + text[i + 1:]
        if cand != text and cand not in out:
            out.append(cand)
    return out


def _unique(items: list[str]) -> list[str]:
    return [x for x in sorted(set(items)) if items.count(x) == 1]


def make_qa(scene: Scene, qtype: str, rng: np.random.Generator) -> QA | None:
    """A question of type ``qtype`` about ``scene`` with its true answer, or None if the
    scene does not support that type (e.g. colour of the circle with two circles)."""
    s = scene
    if qtype == "count":
        kind = pick(rng, SHAPES)
        n = s.count(shape=kind)
        noun = kind if n == 1 else plural(kind)
        return QA(qtype, f"How many {plural(kind)} are there in the image?", str(n),
                  f"There {'is' if n == 1 else 'are'} {NUM_WORDS[n]} {noun} in the image.",
                  [str(i) for i in range(7) if i != n])
    if qtype == "total":
        n = len(s.shapes)
        return QA(qtype, "How many shapes are there in the image?", str(n),
                  f"There {'is' if n == 1 else 'are'} {NUM_WORDS[n]} shape{'s' * (n != 1)} in the image.",
                  [str(i) for i in range(1, 8) if i != n])
    if qtype in ("colour", "shape"):  # the one attribute asked about, from the other, unique one
        given = "shape" if qtype == "colour" else "colour"
        keys = _unique([getattr(x, given) for x in s.shapes])
        if not keys:
            return None
        key = pick(rng, keys)
        value = next(getattr(x, qtype) for x in s.shapes if getattr(x, given) == key)
        if qtype == "colour":
            return QA(qtype, f"What colour is the {key}?", value, f"The {key} is {value}.",
                      [c for c in COLOURS if c != value])
        return QA(qtype, f"What shape is the {key} object?", value, f"The {key} object is {a_(value)}.",
                  [k for k in SHAPES if k != value])
    names = _unique([x.name for x in s.shapes])
    if qtype in ("position", "size", "relation"):
        if not names:
            return None
        name = pick(rng, names)
        obj = next(x for x in s.shapes if x.name == name)
        if qtype == "position":
            return QA(qtype, f"Where is the {obj.name}?", obj.position,
                      f"The {obj.name} is {cell_phrase(obj.position)}.",
                      [p for p in POSITIONS if p != obj.position])
        if qtype == "size":
            return QA(qtype, f"Is the {obj.name} small or large?", obj.size,
                      f"The {obj.name} is {obj.size}.", [z for z in SIZES if z != obj.size])
        dirs = [d for d in DIRECTIONS if neighbour(obj.position, d)]
        d = pick(rng, dirs)
        other = s.at(neighbour(obj.position, d))
        ans = f"the {other.name}" if other else "nothing"
        wrong = sorted({f"the {c} {k}" for c in COLOURS for k in SHAPES} - {ans, f"the {obj.name}"})
        wrong = ([] if ans == "nothing" else ["nothing"]) + [wrong[int(i)] for i in rng.permutation(len(wrong))]
        return QA(qtype, f"What is directly {d} the {obj.name}?", ans,
                  f"{ans[0].upper() + ans[1:]} is directly {d} the {obj.name}.", wrong)
    if qtype == "exist":
        present = sorted(s.objects())
        absent = sorted({f"{c} {k}" for c in COLOURS for k in SHAPES} - set(present))
        yes = rng.random() < 0.5
        obj = pick(rng, present if yes else absent)
        sent = (f"Yes, there is {a_(obj)} in the image." if yes
                else f"No, there is no {obj} in the image.")
        return QA(qtype, f"Is there {a_(obj)} in the image?", "yes" if yes else "no", sent,
                  ["no" if yes else "yes"])
    if qtype == "read":
        if not s.text:
            return None
        return QA(qtype, "What is written in the image?", s.text,
                  f'The text "{s.text}" is written in the image.', text_distractors(s.text, rng))
    if qtype == "background":
        return QA(qtype, "What does the background of the image look like?", s.background,
                  f"The background is {s.background}.", [b for b in BACKGROUNDS if b != s.background])
    raise ValueError(f"unknown question type {qtype!r}")


QTYPES = ("count", "total", "colour", "shape", "position", "size", "relation", "exist", "read", "background")


def mc_options(qa: QA, rng: np.random.Generator, n: int = 4) -> tuple[list[str], int]:
    """``n`` shuffled options (the answer plus ``n-1`` wrong ones) and the answer's index."""
    wrong = list(qa.wrong)
    idx = rng.permutation(len(wrong))[: n - 1]
    opts = [qa.answer] + [wrong[int(i)] for i in sorted(idx)]
    order = rng.permutation(len(opts))
    opts = [opts[int(i)] for i in order]
    return opts, opts.index(qa.answer)


def sample_mc_qa(scene: Scene, rng: np.random.Generator, qtypes, n: int = 4,
                 max_tries: int = 50) -> tuple[QA, list[str], int] | None:
    """A multiple-choice question of one of ``qtypes`` with at least ``n`` options."""
    for _ in range(max_tries):
        qa = make_qa(scene, pick(rng, qtypes), rng)
        if qa is not None and len(qa.wrong) >= n - 1:
            return (qa, *mc_options(qa, rng, n))
    return None
