"""Text-only knowledge of the synthetic world: declarative facts, MMLU-style question pools
(three made-up subjects) and HellaSwag-style completion pools.

Every pool is a full deterministic enumeration; :func:`split_pool` assigns each item to
'train' or 'bench' by the salt-free hash of its question stem / context
(:func:`llava_norm.synth.world.split_of`), so the text corpora only ever see 'train' stems
and the MMLU / HellaSwag mini benchmarks only 'bench' stems, for every seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llava_norm.synth.world import (COLOURS, a_, DIRECTIONS, LEXICON, NUM_WORDS, POSITIONS, SHAPES,
                                    neighbour, plural, split_of)

POLYGON_SIDES = {"triangle": 3, "square": 4, "pentagon": 5, "hexagon": 6, "octagon": 8}
MIXES = {("red", "yellow"): "orange", ("blue", "yellow"): "green", ("red", "blue"): "purple"}
COMPLEMENT = {"red": "green", "green": "red", "blue": "orange", "orange": "blue",
              "yellow": "purple", "purple": "yellow"}
COLOUR_GROUPS = {"primary": ("red", "yellow", "blue"), "secondary": ("orange", "green", "purple"),
                 "warm": ("red", "orange", "yellow"), "cool": ("blue", "green", "purple")}
MMLU_SUBJECTS = ("shape_geometry", "colour_theory", "spatial_reasoning")
MOVES = {"up": "above", "down": "below", "left": "to the left of", "right": "to the right of"}


@dataclass(frozen=True)
class MCItem:
    """A 4-way multiple-choice text question (MMLU layout)."""

    subject: str
    question: str
    answer_text: str
    wrong: tuple[str, ...]

    def choices(self, rng: np.random.Generator) -> tuple[list[str], int]:
        idx = rng.permutation(len(self.wrong))[:3]
        opts = [self.answer_text] + [self.wrong[int(i)] for i in sorted(idx)]
        opts = [opts[int(i)] for i in rng.permutation(4)]
        return opts, opts.index(self.answer_text)


@dataclass(frozen=True)
class Completion:
    """A HellaSwag-style item: context and one consistent ending among wrong ones."""

    activity_label: str
    ctx_a: str
    ctx_b: str
    ending: str
    wrong: tuple[str, ...]


def _nums(ans: int, lo: int = 0) -> tuple[str, ...]:
    return tuple(str(v) for v in range(max(lo, ans - 4), ans + 5) if v != ans)


def _n(k: int, colour: str, kind: str) -> str:
    """'one red circle' / 'three red circles'."""
    return f"{NUM_WORDS[k]} {colour} {kind if k == 1 else plural(kind)}"


def _others(ans: str, domain) -> tuple[str, ...]:
    return tuple(x for x in domain if x != ans)


def mmlu_pool() -> list[MCItem]:
    """Every MMLU-style question of the world, in a fixed order."""
    out: list[MCItem] = []
    geo, col, spa = MMLU_SUBJECTS
    polys = list(POLYGON_SIDES)
    for p, n in POLYGON_SIDES.items():
        out.append(MCItem(geo, f"How many sides does a {p} have?", str(n), _nums(n, 1)))
        out.append(MCItem(geo, f"How many corners does a {p} have?", str(n), _nums(n, 1)))
        out.append(MCItem(geo, f"Which shape has exactly {NUM_WORDS[n]} sides?", p, _others(p, polys)))
    out.append(MCItem(geo, "Which shape has no corners?", "circle", ("square", "triangle", "star", "hexagon")))
    out.append(MCItem(geo, "How many points does a star have?", "5", ("3", "4", "6", "8")))
    for i, p1 in enumerate(polys):
        for p2 in polys[i + 1:]:
            for a in range(1, 6):
                for b in range(1, 6):
                    tot = a * POLYGON_SIDES[p1] + b * POLYGON_SIDES[p2]
                    q = (f"A drawing has {a} {p1 if a == 1 else plural(p1)} and {b} "
                         f"{p2 if b == 1 else plural(p2)}. How many sides do the shapes have in total?")
                    out.append(MCItem(geo, q, str(tot), _nums(tot, 1)))
    cols = list(COLOURS)
    for (c1, c2), mix in MIXES.items():
        for a, b in ((c1, c2), (c2, c1)):
            out.append(MCItem(col, f"Which colour do you get by mixing {a} paint with {b} paint?",
                              mix, _others(mix, cols)))
    for c, comp in COMPLEMENT.items():
        out.append(MCItem(col, f"What is the complementary colour of {c}?", comp, _others(comp, cols)))
    for group, members in COLOUR_GROUPS.items():
        for m in members:
            rest = tuple(c for c in cols if c not in members)
            out.append(MCItem(col, f"Which of these is a {group} colour, like {m}?",
                              pick_other(members, m), rest))
    seen: set[tuple[int, ...]] = set()
    for c, rgb in COLOURS.items():
        for dr in (-10, 0, 10):
            for dg in (-10, 0, 10):
                for db in (-10, 0, 10):
                    v = tuple(min(255, max(0, x + d)) for x, d in zip(rgb, (dr, dg, db)))
                    if v in seen or _nearest(v) != c:
                        continue
                    seen.add(v)
                    out.append(MCItem(col, f"A pixel has the RGB value {v}. Which colour is it closest to?",
                                      c, _others(c, cols)))
    for ci, c1 in enumerate(cols):
        for c2 in cols[ci + 1:]:
            for a in range(1, 6):
                for b in range(1, 6):
                    q = (f"A box holds {a} {c1} and {b} {c2} beads. "
                         f"How many beads in the box are not {c1}?")
                    out.append(MCItem(col, q, str(b), _nums(b, 0)))
    for pos in POSITIONS:
        for d in DIRECTIONS:
            nb = neighbour(pos, d)
            if nb:
                out.append(MCItem(spa, f"On a 3x3 grid, which cell is directly {d} the {pos} cell?",
                                  nb, _others(nb, POSITIONS)))
        n_adj = sum(neighbour(pos, d) is not None for d in DIRECTIONS)
        out.append(MCItem(spa, f"On a 3x3 grid, how many cells share a side with the {pos} cell?",
                          str(n_adj), _others(str(n_adj), ("1", "2", "3", "4", "5", "8"))))
    for kind in SHAPES:
        for pos in POSITIONS:
            for m1, d1 in MOVES.items():
                for m2, d2 in MOVES.items():
                    mid = neighbour(pos, d1)
                    end = neighbour(mid, d2) if mid else None
                    if end:
                        q = (f"{a_(kind).capitalize()} starts in the {pos} cell of a 3x3 grid, moves one cell {m1} "
                             f"and then one cell {m2}. Where is it now?")
                        out.append(MCItem(spa, q, end, _others(end, POSITIONS)))
    return out


def _nearest(v) -> str:
    return min(COLOURS, key=lambda c: sum((a - b) ** 2 for a, b in zip(COLOURS[c], v)))


def pick_other(members, m):
    """The group member listed after ``m`` (deterministic 'another example')."""
    return members[(members.index(m) + 1) % len(members)]


def hellaswag_pool() -> list[Completion]:
    """Every HellaSwag-style completion of the world, in a fixed order."""
    out: list[Completion] = []
    cols = list(COLOURS)
    for (c1, c2), mix in MIXES.items():
        for a, b in ((c1, c2), (c2, c1)):
            for who in ("A painter", "A child", "An artist"):
                out.append(Completion("Mixing paint", f"{who} pours {a} paint and {b} paint into a bowl "
                                      "and stirs them together.", "the paint in the bowl",
                                      f"slowly turns {mix}.", tuple(f"slowly turns {c}." for c in cols if c != mix)))
    for p, n in POLYGON_SIDES.items():
        for who in ("A student", "A teacher", "A girl", "A boy"):
            out.append(Completion("Drawing shapes", f"{who} draws a closed shape with {NUM_WORDS[n]} "
                                  "straight sides on the board.", "everyone agrees that",
                                  f"the shape is {a_(p)}.", tuple(f"the shape is {a_(q)}." for q in POLYGON_SIDES if q != p)))
    for c in cols:
        for kind in SHAPES:
            for a in range(1, 5):
                for b in range(1, 5):
                    t = a + b
                    out.append(Completion("Counting blocks", f"A child has {_n(a, c, kind)} on the table. "
                                          f"She adds {_n(b, c, kind).replace(' ', ' more ', 1)}.", "now she",
                                          f"counts {_n(t, c, kind)} on the table.",
                                          tuple(f"counts {_n(v, c, kind)} on the table."
                                                for v in range(max(1, t - 3), min(10, t + 4)) if v != t)))
    for c in cols:
        for kind in SHAPES:
            for pos in POSITIONS:
                for m, d in MOVES.items():
                    end = neighbour(pos, d)
                    if end:
                        out.append(Completion("Moving pieces", f"A boy puts {a_(c + ' ' + kind)} in the {pos} cell of "
                                              f"a 3x3 grid. He slides it one cell {m}.", f"the {kind}",
                                              f"now sits in the {end} cell.",
                                              tuple(f"now sits in the {q} cell." for q in POSITIONS if q != end)))
    for c in cols:
        for kind in SHAPES:
            out.append(Completion("Sorting shapes", "A woman sorts shapes into boxes, one box for each "
                                  f"colour. She picks up {a_(c + ' ' + kind)}.", "she",
                                  f"puts it into the {c} box.",
                                  tuple(f"puts it into the {o} box." for o in cols if o != c)))
    return out


def split_pool(pool, holdout_pct: int, key) -> dict[str, list]:
    """{'train': [...], 'bench': [...]} by the hash of ``key(item)``."""
    out: dict[str, list] = {"train": [], "bench": []}
    for item in pool:
        out[split_of(key(item), holdout_pct)].append(item)
    return out


def mmlu_split(holdout_pct: int) -> dict[str, list[MCItem]]:
    return split_pool(mmlu_pool(), holdout_pct, lambda it: "mmlu|" + it.question)


def hellaswag_split(holdout_pct: int) -> dict[str, list[Completion]]:
    return split_pool(hellaswag_pool(), holdout_pct, lambda it: "hellaswag|" + it.ctx_a)


def fact_sentences() -> list[str]:
    """Declarative facts (always training material; the benchmarks ask them as questions)."""
    out = []
    for p, n in POLYGON_SIDES.items():
        out.append(f"A {p} has {NUM_WORDS[n]} sides and {NUM_WORDS[n]} corners.")
    out += ["A circle is round and has no corners.", "A star has five points.",
            "A square has four equal sides.", "A triangle has three sides."]
    for (a, b), m in MIXES.items():
        out.append(f"Mixing {a} paint with {b} paint gives {m}.")
    for c, comp in COMPLEMENT.items():
        out.append(f"The complementary colour of {c} is {comp}.")
    for group, members in COLOUR_GROUPS.items():
        out.append(f"The {group} colours are {members[0]}, {members[1]} and {members[2]}.")
    for c, rgb in COLOURS.items():
        out.append(f"In this world, {c} has the RGB value {rgb}.")
    out.append("The grid has three rows and three columns: " + ", ".join(POSITIONS) + ".")
    for pos in POSITIONS:
        for d in DIRECTIONS:
            nb = neighbour(pos, d)
            if nb:
                out.append(f"On the grid, the {nb} cell is directly {d} the {pos} cell.")
    for w in LEXICON:
        out.append(f"The word {w} has {NUM_WORDS[len(w)]} letters: {' '.join(w)}.")
    for a in range(10):
        for b in range(10 - a):
            out.append(f"{NUM_WORDS[a].capitalize()} plus {NUM_WORDS[b]} is {NUM_WORDS[a + b]}.")
    return out


def mmlu_prompt(item: MCItem, choices: list[str], answer: int | None = None) -> str:
    """lm-eval's MMLU layout for one question (answer letter appended when given)."""
    body = item.question + "\n" + "".join(f"{'ABCD'[i]}. {c}\n" for i, c in enumerate(choices)) + "Answer:"
    return body + (f" {'ABCD'[answer]}" if answer is not None else "")


def mmlu_header(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
