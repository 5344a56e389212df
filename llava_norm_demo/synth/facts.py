"""Text-only knowledge of the synthetic world: declarative facts, MMLU-style question pools
(three made-up subjects) and HellaSwag-style completion pools.

Every pool is a full deterministic enumeration; :func:`split_pool` assigns each item to
'train' or 'bench' by the salt-free hash of its question stem / context
(:func:`llava_norm_demo.synth.world.split_of`), so the text corpora only ever see 'train' stems
and the MMLU / HellaSwag mini benchmarks only 'bench' stems, for every seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llava_norm_demo.synth.world import (COLOURS, a_, DIRECTIONS, LEXICON, NUM_WORDS, POSITIONS, SHAPES,
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
    """A 4-way multiple-choice text question (MMLU layout); ``family`` names its template."""

    subject: str
    question: str
    answer_text: str
    wrong: tuple[str, ...]
    family: str = ""

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


# Who does what, where: slots that change a question's wording but not its answer. A held-out
# question asks a fact the training text states and asks in other wordings, the way real MMLU
# asks knowledge from pretraining; no held-out question needs arithmetic the corpus never shows.
WHO = ("A student", "A teacher", "A girl", "A boy")
SURFACES = ("board", "paper", "wall")
CONTAINERS = ("a bowl", "a cup", "a jar")


def _geometry() -> list[MCItem]:
    geo, polys, out = MMLU_SUBJECTS[0], list(POLYGON_SIDES), []
    for p, n in POLYGON_SIDES.items():
        out.append(MCItem(geo, f"How many sides does a {p} have?", str(n), _nums(n, 1), "facts"))
        out.append(MCItem(geo, f"How many corners does a {p} have?", str(n), _nums(n, 1), "facts"))
        out.append(MCItem(geo, f"Which shape has exactly {NUM_WORDS[n]} sides?", p, _others(p, polys), "facts"))
    out.append(MCItem(geo, "Which shape has no corners?", "circle", ("square", "triangle", "star", "hexagon"), "facts"))
    out.append(MCItem(geo, "How many points does a star have?", "5", ("3", "4", "6", "8"), "facts"))
    for who in WHO:
        for c in COLOURS:
            for p, n in POLYGON_SIDES.items():
                for where in SURFACES:
                    for part in ("sides", "corners"):
                        out.append(MCItem(geo, f"{who} draws {a_(c + ' ' + p)} on the {where}. How many {part} "
                                          "does the shape have?", str(n), _nums(n, 1), "count_sides"))
                out.append(MCItem(geo, f"{who} wants to draw {a_(c)} shape with exactly {NUM_WORDS[n]} straight "
                                  "sides. Which shape should they draw?", p, _others(p, polys), "name_shape"))
    return out


def _colour_theory() -> list[MCItem]:
    col, cols, out = MMLU_SUBJECTS[1], list(COLOURS), []
    for (c1, c2), mix in MIXES.items():
        for a, b in ((c1, c2), (c2, c1)):
            out.append(MCItem(col, f"Which colour do you get by mixing {a} paint with {b} paint?",
                              mix, _others(mix, cols), "mixing"))
            for who in WHO:
                for where in CONTAINERS:
                    out.append(MCItem(col, f"{who} mixes {a} paint with {b} paint in {where}. Which colour "
                                      "does the paint turn?", mix, _others(mix, cols), "mixing"))
    for c, comp in COMPLEMENT.items():
        out.append(MCItem(col, f"What is the complementary colour of {c}?", comp, _others(comp, cols), "complement"))
        for who in WHO:
            for kind in SHAPES:
                out.append(MCItem(col, f"{who} paints {a_(kind)} {c}. What is the complementary colour of the "
                                  f"{kind}'s colour?", comp, _others(comp, cols), "complement"))
    for group, members in COLOUR_GROUPS.items():
        for m in members:
            rest = tuple(c for c in cols if c not in members)
            out.append(MCItem(col, f"Which of these is a {group} colour, like {m}?",
                              pick_other(members, m), rest, "groups"))
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
                                      c, _others(c, cols), "pixel"))
    for ci, c1 in enumerate(cols):
        for c2 in cols[ci + 1:]:
            for a in range(1, 6):
                for b in range(1, 6):
                    q = (f"A box holds {a} {c1} and {b} {c2} beads. "
                         f"How many beads in the box are not {c1}?")
                    out.append(MCItem(col, q, str(b), _nums(b, 0), "beads"))
    return out


def _spatial_reasoning() -> list[MCItem]:
    spa, out = MMLU_SUBJECTS[2], []
    for pos in POSITIONS:
        n_adj = str(sum(neighbour(pos, d) is not None for d in DIRECTIONS))
        for kind in SHAPES:
            out.append(MCItem(spa, f"{a_(kind).capitalize()} sits in the {pos} cell of a 3x3 grid. How many cells "
                              "share a side with its cell?", n_adj, _others(n_adj, ("1", "2", "3", "4", "5", "8")),
                              "adjacent"))
            for c in COLOURS:
                thing = a_(f"{c} {kind}").capitalize()
                for d in DIRECTIONS:
                    nb = neighbour(pos, d)
                    if nb:
                        out.append(MCItem(spa, f"{thing} sits in the {pos} cell of a 3x3 grid. Which cell is "
                                          f"directly {d} it?", nb, _others(nb, POSITIONS), "neighbour"))
                for m, d in MOVES.items():
                    end = neighbour(pos, d)
                    if end:
                        out.append(MCItem(spa, f"{thing} starts in the {pos} cell of a 3x3 grid and moves one "
                                          f"cell {m}. Where is it now?", end, _others(end, POSITIONS), "move"))
    return out


def mmlu_pool() -> list[MCItem]:
    """Every MMLU-style question of the world, in a fixed order (three subjects, several
    question families each; see ``WHO``)."""
    return _geometry() + _colour_theory() + _spatial_reasoning()


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
