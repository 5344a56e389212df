"""Training corpora of the synthetic world, in the real LLaVA file formats.

- captions and stage-1 rows (``blip_laion_cc_sbu_558k.json`` layout: ``id``, ``image``,
  ``conversations`` with one human caption request and one gpt caption);
- stage-2 instruction rows (LLaVA-NeXT converted layout, multi-turn; short-answer, sentence
  and multiple-choice turns with the benchmarks' own instructions; ~10 % text-only rows);
- a plain-text corpus (``{"text": ...}`` rows) for LLM pretraining: scene descriptions, world
  facts, Q/A, and MMLU- and HellaSwag-formatted training items.

Only 'train'-split material reaches this module (see ``world.split_of``).
"""

from __future__ import annotations

import numpy as np

from llava_norm.data.prompts import IMAGE_PREFIX
from llava_norm.evaluation.benchmarks import ai2d, mmbench, mmstar
from llava_norm.evaluation.benchmarks.mcq import LETTERS
from llava_norm.evaluation.benchmarks.pope import INSTRUCTION as SHORT_SUFFIX
from llava_norm_demo.synth.facts import (Completion, MCItem, fact_sentences, mmlu_header, mmlu_prompt)
from llava_norm_demo.synth.world import (LEXICON, QTYPES, POSITIONS, QA, Scene, a_, cell_phrase, make_qa,
                                    mc_options, pick)

CAPTION_PROMPTS = (
    "Describe the image briefly.",
    "Give a short caption for the image.",
    "Write a brief description of this picture.",
    "What does the image show? Answer briefly.",
    "Summarize the picture in a few words.",
    "Provide a concise caption of the image.",
)
DETAIL_PROMPTS = (
    "Describe the image in detail.",
    "What is in this picture? Describe every shape.",
    "Explain what you see in the image.",
)
# Question-type weights for instruction turns (same order as world.QTYPES).
QTYPE_WEIGHTS = (3, 1, 3, 2, 3, 1, 2, 3, 2, 1)


def object_list(scene: Scene) -> str:
    """'a large red circle at the top left and a small blue square in the center'."""
    order = sorted(scene.shapes, key=lambda s: POSITIONS.index(s.position))
    parts = [f"{a_(f'{s.size} {s.colour} {s.shape}')} {cell_phrase(s.position)}" for s in order]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def caption(scene: Scene, rng: np.random.Generator) -> str:
    """A one-sentence description of everything in the scene (three phrasings)."""
    objs, bg = object_list(scene), f"{a_(scene.background)} background"
    style = int(rng.integers(3))
    if style == 0:
        text = f"{objs} on {bg}"
    elif style == 1:
        text = f"{bg} with {objs}"
    else:
        n = len(scene.shapes)
        text = f"{('one shape' if n == 1 else f'{n} shapes')} on {bg}: {objs}"
    if scene.text:
        noun = "word" if scene.text in LEXICON else "text"
        text += f', with the {noun} "{scene.text}" written at the bottom'
    return text


def pretrain_row(row_id: str, image: str, scene: Scene, rng: np.random.Generator) -> dict:
    return {"id": row_id, "image": image, "conversations": [
        {"from": "human", "value": IMAGE_PREFIX + pick(rng, CAPTION_PROMPTS)},
        {"from": "gpt", "value": caption(scene, rng)},
    ]}


def format_mc(question: str, options: list[str], style: str) -> str:
    """Multiple-choice prompt in one of the benchmark layouts, built by the benchmark's own
    prompt builder: "inline" (MMStar), "lmms_mmbench" (lmms-eval MMBench), "lines" (AI2D,
    SEED-Bench-2-Plus, LLaVA's MMBench)."""
    lettered = dict(zip(LETTERS, options))
    if style == "inline":
        return mmstar.build_prompt(question + "\nOptions: " + ", ".join(f"{k}: {v}" for k, v in lettered.items()))
    if style == "lmms_mmbench":
        return mmbench.build_prompt(question, None, lettered, "lmms_eval")
    return ai2d.build_prompt(question, lettered)


def qa_turn(qa: QA, rng: np.random.Generator) -> tuple[str, str]:
    """(human, gpt) for one question, in short-answer, sentence or multiple-choice form."""
    u = rng.random()
    if u < 0.4:
        return qa.question + SHORT_SUFFIX, qa.answer
    if u < 0.65 or not qa.wrong:
        return qa.question, qa.sentence
    n = min(4, 1 + len(qa.wrong)) if rng.random() < 0.8 else 2
    opts, ans = mc_options(qa, rng, n)
    style = pick(rng, ("lines", "lines", "inline", "lmms_mmbench"))
    return format_mc(qa.question, opts, style), LETTERS[ans]


def instruct_row(row_id: str, image: str, scene: Scene, rng: np.random.Generator) -> dict:
    """A 1-4 turn conversation about one image; ``<image>`` opens the first human turn."""
    turns: list[tuple[str, str]] = []
    asked: set[str] = set()
    n_turns = int(rng.integers(1, 5))
    if scene.text and rng.random() < 0.6:
        qa = make_qa(scene, "read", rng)
        turns.append(qa_turn(qa, rng))
        asked.add(qa.question)
    for _ in range(40):
        if len(turns) >= n_turns:
            break
        if rng.random() < 0.08 and not any(t[0] in DETAIL_PROMPTS for t in turns):
            turns.append((pick(rng, DETAIL_PROMPTS), "The image shows " + caption(scene, rng) + "."))
            continue
        qa = make_qa(scene, pick(rng, QTYPES, QTYPE_WEIGHTS), rng)
        if qa is None or qa.question in asked:
            continue
        asked.add(qa.question)
        turns.append(qa_turn(qa, rng))
    conv = []
    for i, (h, g) in enumerate(turns):
        conv.append({"from": "human", "value": (IMAGE_PREFIX + h) if i == 0 else h})
        conv.append({"from": "gpt", "value": g})
    return {"id": row_id, "image": image, "conversations": conv}


def text_instruct_row(row_id: str, items: list[MCItem], facts: list[str],
                      rng: np.random.Generator) -> dict:
    """A text-only conversation (no ``image`` key) about world facts."""
    conv = []
    for _ in range(int(rng.integers(1, 4))):
        it = pick(rng, items)
        u = rng.random()
        if u < 0.4:
            h, g = it.question + SHORT_SUFFIX, it.answer_text
        elif u < 0.7:
            opts, ans = it.choices(rng)
            h, g = format_mc(it.question, opts, "lines"), LETTERS[ans]
        else:
            h, g = "Tell me a fact about shapes, colours or the grid.", pick(rng, facts)
        conv += [{"from": "human", "value": h}, {"from": "gpt", "value": g}]
    return {"id": row_id, "conversations": conv}


def text_corpus(n: int, scenes: list[Scene], mmlu_train: list[MCItem], hs_train: list[Completion],
                rng: np.random.Generator) -> list[dict]:
    """``n`` rows of ``{"text": ...}`` mixing descriptions, facts, Q/A, MMLU and HellaSwag text."""
    facts = fact_sentences()
    rows = []
    for i in range(n):
        u = rng.random()
        if u < 0.2:
            scene = scenes[i % len(scenes)]
            text = "The picture shows " + caption(scene, rng) + "."
            qa = make_qa(scene, pick(rng, ("count", "total", "colour", "position", "exist")), rng)
            if qa is not None:
                text += f" Question: {qa.question} Answer: {qa.sentence}"
        elif u < 0.4:
            text = " ".join(pick(rng, facts) for _ in range(int(rng.integers(2, 6))))
        elif u < 0.55:
            it = pick(rng, mmlu_train)
            text = f"Question: {it.question}\nAnswer: {it.answer_text}"
        elif u < 0.78:
            subject = pick(rng, sorted({it.subject for it in mmlu_train}))
            pool = [it for it in mmlu_train if it.subject == subject]
            shots = []
            for _ in range(int(rng.integers(1, 4))):
                it = pick(rng, pool)
                opts, ans = it.choices(rng)
                shots.append(mmlu_prompt(it, opts, ans))
            text = mmlu_header(subject) + "\n\n".join(shots)
        else:
            c = pick(rng, hs_train)
            text = f"{c.activity_label}: {c.ctx_a} {c.ctx_b.capitalize()} {c.ending}"
        rows.append({"text": text})
    return rows
