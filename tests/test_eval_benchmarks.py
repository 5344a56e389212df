"""Loaders, prompts and scoring rules of the seven multimodal benchmarks.

Every fixture is written by the test in the official layout: VLMEvalKit TSVs with base64
PNG cells, HF / lmms-eval parquet with ``{"bytes", "path"}`` image structs. Expected
metrics are worked out by hand in the comments.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from llava_norm.evaluation.benchmarks import BENCHMARKS, GenerationItem, get_benchmark
from llava_norm.evaluation.benchmarks.base import first_argmax, per_character
from llava_norm.evaluation.benchmarks.pope import parse_yes_no
from llava_norm.evaluation.benchmarks.mcq import infer_option_letter
from llava_norm.evaluation.benchmarks.mmstar import split_inline_options

INSTR = "Answer with the option's letter from the given choices directly."
RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def png(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 3), color).save(buffer, format="PNG")
    return buffer.getvalue()


def b64(color: tuple[int, int, int]) -> str:
    return base64.b64encode(png(color)).decode()


def hf_image(color: tuple[int, int, int]) -> dict:
    return {"bytes": png(color), "path": "img.png"}


def write_tsv(path: Path, records: list[dict]) -> Path:
    pd.DataFrame(records).to_csv(path, sep="\t", index=False)
    return path


def write_parquet(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def color_of(item: GenerationItem) -> tuple[int, int, int]:
    image = item.image
    assert image is not None and image.mode == "RGB"
    return image.getpixel((0, 0))


def score(name: str, items, replies: dict, **options) -> dict:
    metrics = get_benchmark(name, **options).score(items, replies)
    json.dumps(metrics)  # must be JSON-serialisable
    return metrics


# ---------------------------------------------------------------------------- registry


def test_registry_names_and_unknown_name():
    assert set(BENCHMARKS) == {
        "mmbench_en_dev", "mmstar", "ocrbench", "seedbench2_plus", "scienceqa_img",
        "ai2d", "pope", "hellaswag", "mmlu",
    }
    with pytest.raises(ValueError, match="valid names: ai2d, hellaswag"):
        get_benchmark("mmbench")
    with pytest.raises(ValueError, match="accepted options: \\['variant'\\]"):
        get_benchmark("ai2d", varient="mask")
    for name in BENCHMARKS:
        settings = get_benchmark(name).settings()
        assert settings["benchmark"] == name
        json.dumps(settings)


# ---------------------------------------------------------------------------- letters


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("B", "B"),
        ("(B) a dog", "B"),
        ("B: dog", "B"),
        ("The answer is B.", "B"),
        ("It is a dog.", "B"),  # no letter token: the text of exactly one option
        ("A or B", None),  # two letters, and no option text
        ("cat or dog", None),  # two option texts
        ("I cannot tell", None),
        ("", None),
        ("A cat.", "A"),  # VLMEvalKit reads the article "A" as the letter, and so do we
    ],
)
def test_infer_option_letter_follows_can_infer(reply, expected):
    assert infer_option_letter(reply, {"A": "cat", "B": "dog", "C": "bird"}) == expected


ANIMALS = {"A": "dog", "B": "cat", "C": "bird", "D": "fish"}


@pytest.mark.parametrize(
    "reply, expected",
    [
        # the letter must be among the last four tokens (VLMEvalKit #1175), and text matching
        # then finds two options
        ("B. The cat is sitting on the mat next to the window.", None),
        ("B is correct because the cat sits on the mat in the picture", None),
        ("The cat. B", "B"),
        # a reply over twice the options' text is not read by text (#1175)
        ("I think it is the dog, since the animal has floppy ears and a wagging tail", None),
        ("I think it is the dog", "A"),
        # two letters, then "answer is X" (#1552), in any case: the article reads as A
        ("The answer is B, not A.", "B"),
        ("The correct answer is **C**, not A or B.", "C"),
        ("the answer is a cat", "A"),
        # refusals, and a lone Z, are no option before any text is read
        ("Cannot determine the answer. B", None),
        ("I can't process this file. B", None),
        ("Sorry, I can't help with images of people yet. B", None),
        ("I'm sorry, but without the image provided B", None),
        ("Z", None),
        ("Z dog", None),
        # the edges: the letter's first place fifth from the end, a reply exactly twice the options'
        # text and one just over it, the answer-is letters (A-D only), the letter's first place counts
        ("B is the dog now", "A"),
        ("It is a dog, I would say so!", "A"),
        ("I would say that it is the dog, yes", None),
        ("The answer is E, I think so now", None),
        ("B was my guess, and it stays: B", None),
    ],
)
def test_infer_option_letter_has_vlmevalkits_position_length_and_answer_is_rules(reply, expected):
    """Each reply read by VLMEvalKit's ``can_infer`` at e8e78f0 (vlmeval/utils/matching_util.py), run
    on these options (with E: cow for the answer-is case), gives ``expected``."""
    options = {**ANIMALS, "E": "cow"} if " E," in reply else ANIMALS
    assert infer_option_letter(reply, options) == expected


@pytest.mark.parametrize("scores, lengths, picked", [
    ([-0.5, -30.0, -31.0, -32.0], [0, 49, 40, 40], 1),  # an ending cleaned to nothing: -inf, never picked
    ([-30.0, 0.0, -31.0], [49, 0, 40], 1),  # 0/0 is nan, which numpy's argmax picks first
    ([-4.0, -6.0], [2, 4], 1),
])
def test_acc_norm_divides_as_lm_eval_does_a_choice_of_no_characters_included(scores, lengths, picked):
    """lm-eval's ``np.argmax(lls / completion_len)``, with numpy's division by zero."""
    with np.errstate(divide="ignore", invalid="ignore"):
        assert int(np.argmax(np.array(scores) / np.array(lengths, dtype=float))) == picked
    assert first_argmax(per_character(scores, lengths)) == picked


@pytest.mark.parametrize("values", [[-1.0, -1.0, -3.0], [-3.0, -2.0, -2.0, -2.0], [0.5, 0.5]])
def test_a_tie_goes_to_the_first_maximum_as_numpys_argmax(values):
    """Tied log-likelihoods (plausible in bf16): lm-eval's ``np.argmax`` picks the first."""
    assert first_argmax(values) == int(np.argmax(values))


# ---------------------------------------------------------------------------- MMBench


def mmbench_tsv(tmp_path: Path) -> Path:
    def row(index, question, hint, options, answer, category, image):
        a, b, c, d = options
        return {"index": index, "question": question, "hint": hint, "A": a, "B": b, "C": c, "D": d,
                "answer": answer, "category": category, "l2-category": "perception", "split": "dev", "image": image}

    return write_tsv(tmp_path / "MMBench_DEV_EN.tsv", [
        row(0, "What color is it?", "", ("red", "green", "blue", "yellow"), "A", "color", b64(RED)),
        row(1, "How many sides?", "Look closely.", ("3", "4", "5", ""), "B", "count", b64(GREEN)),
        # circular copies: options rotated, image stored as the index of the original row
        row(1000000, "What color is it?", "nan", ("yellow", "red", "green", "blue"), "B", "color", "0"),
        row(1000001, "How many sides?", "Look closely.", ("5", "3", "4", ""), "C", "count", "1"),
    ])


def test_mmbench_tsv_loader_builds_llava_prompts(tmp_path):
    items = get_benchmark("mmbench_en_dev").load(mmbench_tsv(tmp_path))
    assert [i.item_id for i in items] == ["0", "1", "1000000", "1000001"]
    assert items[0].prompt == f"What color is it?\nA. red\nB. green\nC. blue\nD. yellow\n{INSTR}"
    assert items[1].prompt == f"Look closely.\nHow many sides?\nA. 3\nB. 4\nC. 5\n{INSTR}"  # no empty D
    assert items[2].prompt == f"What color is it?\nA. yellow\nB. red\nC. green\nD. blue\n{INSTR}"
    assert [color_of(i) for i in items] == [RED, GREEN, RED, GREEN]  # references resolved
    assert items[3].meta["group"] == 1 and items[3].meta["answer"] == "C"
    assert items[0].max_new_tokens == 1024


def test_mmbench_parquet_loader_lmms_eval_prompt_and_limit(tmp_path):
    base = {"category": "count", "L2-category": "perception", "source": "x", "split": "dev", "comment": None}
    records = [
        {"index": 1, "question": "How many sides?", "hint": None, "A": "3", "B": "4", "C": "5", "D": None,
         "answer": "B", "image": hf_image(GREEN), **base},
        {"index": 2, "question": "Which shape?", "hint": "A hint.", "A": "square", "B": "circle", "C": None, "D": None,
         "answer": "A", "image": hf_image(BLUE), **base},
        {"index": 1000001, "question": "How many sides?", "hint": None, "A": "5", "B": "3", "C": "4", "D": None,
         "answer": "C", "image": hf_image(GREEN), **base},
    ]
    path = write_parquet(tmp_path / "en" / "dev-00000-of-00001.parquet", records)
    items = get_benchmark("mmbench_en_dev", prompt_variant="lmms_eval").load(tmp_path)  # directory layout
    assert items[0].prompt == f"How many sides? There are several options:\nA. 3\nB. 4\nC. 5\n\n{INSTR}"
    assert items[1].prompt == f"A hint. Which shape? There are several options:\nA. square\nB. circle\n\n{INSTR}"
    assert color_of(items[1]) == BLUE
    limited = get_benchmark("mmbench_en_dev").load(path, limit=1)
    assert [i.item_id for i in limited] == ["1", "1000001"]  # the question and its rotation


def test_mmbench_circular_scoring_fails_a_question_on_one_wrong_rotation(tmp_path):
    items = get_benchmark("mmbench_en_dev").load(mmbench_tsv(tmp_path))
    replies = {"0": "A", "1000000": "B. red", "1": "B", "1000001": "A"}
    metrics = score("mmbench_en_dev", items, replies)
    # question 0: both copies right; question 1: its rotation is wrong -> 1 of 2 questions
    assert metrics["circular_accuracy"] == 0.5
    assert metrics["per_row_accuracy_not_mmbench_score"] == 0.75
    assert metrics["per_category"] == {"color": 1.0, "count": 0.0}
    assert metrics["per_l2_category"] == {"perception": 0.5}
    assert metrics["num_questions"] == 2 and metrics["unparsable_replies"] == 0


def test_mmbench_unparsable_replies_are_counted_and_wrong(tmp_path):
    items = get_benchmark("mmbench_en_dev").load(mmbench_tsv(tmp_path))
    replies = {"0": "red", "1000000": "It is red", "1": "four or five", "1000001": "I cannot tell"}
    metrics = score("mmbench_en_dev", items, replies)
    # "red" / "It is red" match exactly one option text; the other two match nothing
    assert metrics["unparsable_replies"] == 2
    assert metrics["circular_accuracy"] == 0.5


def test_mmbench_a_rotated_copy_without_its_question_row_is_refused(tmp_path):
    """VLMEvalKit and lmms-eval score a question only with its own row: a copy whose question row
    a filtered file lost is refused by name, not scored (with its categories) in its place."""
    rows = pd.read_csv(mmbench_tsv(tmp_path), sep="\t", dtype=str, keep_default_na=False)
    rows = rows[rows["index"] != "1"]  # question 1's own row gone; its copy's image is its own
    rows.loc[rows["index"] == "1000001", "image"] = b64(GREEN)
    cut = write_tsv(tmp_path / "cut.tsv", rows.to_dict("records"))
    with pytest.raises(ValueError, match=r"cut.tsv: MMBench rows at index \[1000001\] are rotated copies of questions "
                                         r"whose own row \(index 1, ...\) is not in the file"):
        get_benchmark("mmbench_en_dev").load(cut)


def test_missing_prediction_is_an_error(tmp_path):
    items = get_benchmark("mmbench_en_dev").load(mmbench_tsv(tmp_path))
    with pytest.raises(ValueError, match="no prediction for 1 item\\(s\\): '1000001'"):
        get_benchmark("mmbench_en_dev").score(items, {"0": "A", "1": "B", "1000000": "B"})
    # a reply that is not text (a hand-edited or foreign predictions file): named, not scored
    with pytest.raises(ValueError, match="mmbench_en_dev: prediction for item '1' must be a str, got int"):
        get_benchmark("mmbench_en_dev").score(items, {"0": "A", "1": 5, "1000000": "B", "1000001": "C"})


# ---------------------------------------------------------------------------- MMStar


def test_split_inline_options_keeps_commas():
    question = "What is shown?\nOptions: A: a cat, sitting, B: two dogs, C: 3, 4, and 5, D: none"
    assert split_inline_options(question) == {"A": "a cat, sitting", "B": "two dogs", "C": "3, 4, and 5", "D": "none"}
    assert split_inline_options("No options here") == {}


def mmstar_records() -> list[dict]:
    def row(index, category, l2, answer):
        question = f" Q{index}? Please answer yes or no.\nOptions: A: yes, B: no, C: maybe, D: never "
        return {"index": index, "question": question, "image": hf_image(RED), "answer": answer,
                "category": category, "l2_category": l2, "meta_info": {"source": "x"}}

    return [
        row(0, "math", "geometry", "A"),
        row(1, "math", "geometry", "B"),
        row(2, "math", "geometry", "C"),
        row(3, "math", "statistical reasoning", "D"),
        row(4, "coarse perception", "image emotion", "B"),
        row(5, "coarse perception", "image emotion", "A"),
    ]


def test_mmstar_parquet_prompt(tmp_path):
    items = get_benchmark("mmstar").load(write_parquet(tmp_path / "mmstar.parquet", mmstar_records()))
    assert items[0].item_id == "0"
    assert items[0].prompt == (
        "Q0?\nOptions: A: yes, B: no, C: maybe, D: never"
        "\nAnswer with the option's letter from the given choices directly"
    )
    assert items[0].meta["options"] == {"A": "yes", "B": "no", "C": "maybe", "D": "never"}


def test_mmstar_tsv_rebuilds_inline_options(tmp_path):
    path = write_tsv(tmp_path / "MMStar.tsv", [
        {"index": 7, "question": "Which animal?", "A": "cat", "B": "dog, big", "C": "cow", "D": "eel",
         "answer": "B", "category": "math", "l2-category": "geometry", "image": b64(BLUE)},
    ])
    (item,) = get_benchmark("mmstar").load(path)
    assert item.prompt == (
        "Which animal?\nOptions: A: cat, B: dog, big, C: cow, D: eel"
        "\nAnswer with the option's letter from the given choices directly"
    )
    assert color_of(item) == BLUE and item.meta["l2_category"] == "geometry"


def test_mmstar_paper_era_rule_and_category_averages(tmp_path):
    items = get_benchmark("mmstar").load(write_parquet(tmp_path / "mmstar.parquet", mmstar_records()))
    replies = {
        "0": "A",  # first character
        "1": "(b) no",  # "(x"
        "2": "Option C",  # "option x"
        "3": "Answer: D",  # paper-era rule cannot read this -> wrong
        "4": "The answer is B.",  # "the answer is x"
        "5": "B",  # wrong letter
    }
    metrics = score("mmstar", items, replies)
    # geometry 3/3, statistical reasoning 0/1, image emotion 1/2
    assert metrics["per_l2_category"] == {"geometry": 1.0, "image emotion": 0.5, "statistical reasoning": 0.0}
    assert metrics["per_category_micro"] == {"coarse perception": 0.5, "math": 0.75}
    assert metrics["per_category_macro_l2"] == {"coarse perception": 0.5, "math": 0.5}
    assert metrics["accuracy_micro"] == pytest.approx(4 / 6)
    assert metrics["average_macro_l2"] == pytest.approx(0.5)  # (1 + 0 + 0.5) / 3
    # VLMEvalKit's can_infer reads "Answer: D" (a lone letter token)
    other = score("mmstar", items, replies, scoring="vlmevalkit_can_infer")
    assert other["per_l2_category"]["statistical reasoning"] == 1.0


# ---------------------------------------------------------------------------- OCRBench


HMER = "Handwritten Mathematical Expression Recognition"


def test_ocrbench_tsv_literal_answers_and_scoring(tmp_path):
    path = write_tsv(tmp_path / "OCRBench.tsv", [
        {"index": 0, "image": b64(RED), "question": " what is written? ", "answer": "['Hello World', 'hi']",
         "category": "Regular Text Recognition"},
        {"index": 1, "image": b64(RED), "question": "Transcribe the formula.", "answer": "['\\\\frac{a}{B}']",
         "category": HMER},
        {"index": 2, "image": b64(RED), "question": "Transcribe the formula.", "answer": "['x^{2}']", "category": HMER},
        {"index": 3, "image": b64(RED), "question": "What is the total?", "answer": "['12.50']",
         "category": "Key Information Extraction"},
    ])
    items = get_benchmark("ocrbench").load(path)
    assert items[0].prompt == "what is written?" and items[0].max_new_tokens == 128
    assert items[1].meta["answers"] == ["\\frac{a}{B}"] and items[1].meta["handwritten_math"]
    replies = {
        "0": "The text says HELLO\nWORLD.",  # lowercase, newline -> space, substring
        "1": "\\frac { a } \n{ B }",  # HME: spaces and newlines removed, case kept -> right
        "2": "X^{2}",  # HME keeps case -> wrong
        "3": "It is 12.5",  # "12.50" is not a substring -> wrong
    }
    metrics = score("ocrbench", items, replies)
    assert metrics["final_score"] == 2 and metrics["final_score_norm"] == 0.2
    assert metrics["text_recognition"] == 1
    assert metrics["per_question_type"][HMER] == 1
    assert metrics["per_question_type"]["Key Information Extraction"] == 0
    assert metrics["items_per_question_type"][HMER] == 2


def test_ocrbench_parquet_list_answers_and_hme_source(tmp_path):
    path = write_parquet(tmp_path / "test-00000-of-00001.parquet", [
        {"dataset": "HME100k", "question": "Formula?", "question_type": HMER, "answer": ["a+B"], "image": hf_image(RED)},
        {"dataset": "IIIT5K", "question": "Word?", "question_type": "Regular Text Recognition",
         "answer": ["Cat", "cats"], "image": hf_image(RED)},
    ])
    items = get_benchmark("ocrbench").load(path)
    assert items[0].item_id == "test-00000-of-00001.parquet#0"  # no id column: file#row
    metrics = score("ocrbench", items, {items[0].item_id: "a + b", items[1].item_id: "CAT"})
    assert metrics["final_score"] == 1  # "a+b" lacks the capital B; "cat" matches


@pytest.mark.parametrize("answer", [[""], ["cat", "  "], []])
def test_ocrbench_a_blank_or_missing_gold_answer_is_refused(tmp_path, answer):
    """Right means a gold answer is a substring of the reply: a blank one is in every reply."""
    path = write_parquet(tmp_path / "test-00000-of-00001.parquet", [
        {"dataset": "IIIT5K", "question": "Word?", "question_type": "Regular Text Recognition", "answer": answer,
         "image": hf_image(RED)}])
    with pytest.raises(ValueError, match=r"test-00000-of-00001.parquet: row 0: column 'answer' must list at least one "
                                         r"answer, none of them blank"):
        get_benchmark("ocrbench").load(path)


def test_ocrbench_answer_is_parsed_never_evaluated(tmp_path):
    path = write_tsv(tmp_path / "OCRBench.tsv", [
        {"index": 5, "image": b64(RED), "question": "q", "answer": "[__import__('os').getcwd()]",
         "category": "Doc-oriented VQA"},
    ])
    with pytest.raises(ValueError, match=r"OCRBench.tsv: row 0 \(index 5\): column 'answer' is not a Python list literal"):
        get_benchmark("ocrbench").load(path)


# ---------------------------------------------------------------------------- SEED-Bench-2-Plus


def test_seedbench2_plus_prompt_and_first_letter_rule(tmp_path):
    def row(qid, kind, answer):
        return {"question_id": qid, "question": f"Q{qid}?", "choice_A": "a", "choice_B": "b", "choice_C": "c",
                "choice_D": "d", "answer": answer, "question_image_type": kind, "image": hf_image(RED)}

    path = write_parquet(tmp_path / "test-00000-of-00001.parquet",
                         [row("c1", "chart", "B"), row("c2", "chart", "A"), row("m1", "map", "C"), row("w1", "web", "D")])
    items = get_benchmark("seedbench2_plus").load(path)
    assert items[0].prompt == f"Qc1?\nA. a\nB. b\nC. c\nD. d\n{INSTR}"
    assert items[0].max_new_tokens == 16
    replies = {"c1": " b) because", "c2": "The answer is A", "m1": "C", "w1": ""}
    metrics = score("seedbench2_plus", items, replies)
    # first char: "b" right, "T" wrong, "C" right, "" wrong
    assert metrics["all"] == 0.5
    assert (metrics["chart"], metrics["map"], metrics["web"]) == (0.5, 1.0, 0.0)


# ---------------------------------------------------------------------------- ScienceQA-IMG


def test_scienceqa_img_prompt_skips_text_only_rows_and_scores_letter_dot(tmp_path):
    def row(question, hint, answer, image):
        return {"image": image, "question": question, "choices": ["cat", "dog", "eel"], "answer": answer,
                "hint": hint, "subject": "natural science"}

    write_parquet(tmp_path / "ScienceQA-IMG" / "test-00000-of-00001.parquet", [
        row("Which is a mammal?", "", 1, hf_image(RED)),
        row("Text only?", "", 0, None),  # no image: not part of -IMG
        row("Which swims?", "Look at the picture.", 2, hf_image(GREEN)),
        row("Which purrs?", "", 0, hf_image(BLUE)),
        row("Which barks?", "", 1, hf_image(BLUE)),
        row("Which bites?", "", 1, hf_image(BLUE)),
    ])
    items = get_benchmark("scienceqa_img").load(tmp_path)
    assert [i.item_id for i in items] == [f"test-00000-of-00001.parquet#{n}" for n in (0, 2, 3, 4, 5)]
    assert items[0].prompt == f"Which is a mammal?\nA. cat\nB. dog\nC. eel\n{INSTR}"
    assert items[1].prompt == f"Context: Look at the picture.\nWhich swims?\nA. cat\nB. dog\nC. eel\n{INSTR}"
    ids = [i.item_id for i in items]
    replies = dict(zip(ids, ["B. dog", "c", "A.", "The answer is B", "B)"]))
    # "B." form right, lone lowercase letter right, "A." right; prose and "B)" wrong
    assert score("scienceqa_img", items, replies)["accuracy"] == pytest.approx(3 / 5)
    assert len(get_benchmark("scienceqa_img").load(tmp_path, limit=2)) == 2
    # a file without the image column at all is another layout, named, not "holds no items"
    no_column = write_parquet(tmp_path / "other" / "test-00000-of-00001.parquet",
                              [{k: v for k, v in row("Q?", "", 0, None).items() if k != "image"}])
    with pytest.raises(ValueError, match=r"row 0: no column 'image' \(its columns: 'question', 'choices'"):
        get_benchmark("scienceqa_img").load(no_column)


def test_vlmevalkit_sibling_sets_in_one_folder_are_never_read_as_one_benchmark(tmp_path):
    """VLMEvalKit's data folder holds OCRBench.tsv beside OCRBench_MINI.tsv, AI2D_TEST.tsv beside
    AI2D_TEST_NO_MASK.tsv: the benchmark's own file is read alone, and a folder whose TSVs are
    only other sets is refused by name, not merged (their ids collide and fall back silently)."""
    def ocr(path, n):
        path.parent.mkdir(exist_ok=True)
        return write_tsv(path, [{"index": i, "image": b64(RED), "question": f"q{i}", "answer": "['a']",
                                 "category": "Regular Text Recognition"} for i in range(n)])

    ocr(tmp_path / "lmu" / "OCRBench.tsv", 2)
    ocr(tmp_path / "lmu" / "OCRBench_MINI.tsv", 3)
    assert len(get_benchmark("ocrbench").load(tmp_path / "lmu")) == 2
    (tmp_path / "lmu" / "OCRBench.tsv").unlink()
    with pytest.raises(ValueError, match=r"lmu: OCRBench_MINI\.tsv is another VLMEvalKit set than OCRBench\.tsv, not "
                                         r"read as OCRBench by a folder's globs; give the file's own path"):
        get_benchmark("ocrbench").load(tmp_path / "lmu")
    assert len(get_benchmark("ocrbench").load(tmp_path / "lmu" / "OCRBench_MINI.tsv")) == 3  # given, it is read
    ocr(tmp_path / "lmu" / "OCRBench_X.tsv", 1)
    with pytest.raises(ValueError, match=r"lmu: 2 TSV files match '\*\.tsv' \(OCRBench_MINI\.tsv, OCRBench_X\.tsv\)"):
        get_benchmark("ocrbench").load(tmp_path / "lmu")

    def ai2d(path, n):
        path.parent.mkdir(exist_ok=True)
        return write_tsv(path, [{"index": i, "image": b64(RED), "question": f"q{i}", "A": "stem", "B": "leaf",
                                 "answer": "B", "category": "c"} for i in range(n)])

    ai2d(tmp_path / "both" / "AI2D_TEST.tsv", 2)
    ai2d(tmp_path / "both" / "AI2D_TEST_NO_MASK.tsv", 3)
    assert len(get_benchmark("ai2d").load(tmp_path / "both")) == 2
    assert len(get_benchmark("ai2d", variant="no_mask").load(tmp_path / "both")) == 3
    (tmp_path / "both" / "AI2D_TEST_NO_MASK.tsv").unlink()
    with pytest.raises(ValueError, match=r"AI2D_TEST\.tsv is VLMEvalKit's masked data but variant='no_mask'"):
        get_benchmark("ai2d", variant="no_mask").load(tmp_path / "both")


# ---------------------------------------------------------------------------- AI2D


def test_ai2d_prompt_filter_and_variant(tmp_path):
    records = [{"question": f"Label {n}?", "options": ["stem", "leaf", "root"], "answer": "1", "image": hf_image(RED)}
               for n in range(5)]
    path = write_parquet(tmp_path / "test-00000-of-00001.parquet", records)
    items = get_benchmark("ai2d").load(path)
    assert items[0].prompt == f"Label 0?\nA. stem\nB. leaf\nC. root\n{INSTR}"
    assert items[0].meta["answer"] == "B"
    ids = [i.item_id for i in items]
    replies = dict(zip(ids, ["B. leaf", "b", "(B)", "B is correct", "A. stem"]))
    # "X." filter -> B; "b" and "(B)" equal B ignoring case/punctuation; prose is kept raw -> wrong
    metrics = score("ai2d", items, replies, variant="no_mask")
    assert metrics["accuracy"] == pytest.approx(3 / 5) and metrics["variant"] == "no_mask"
    assert get_benchmark("ai2d", variant="no_mask").settings()["variant"] == "no_mask"
    no_mask_file = write_parquet(tmp_path / "ai2d-no-mask" / "test-00000-of-00001.parquet", records)
    with pytest.raises(ValueError, match="variant='no_mask'"):
        get_benchmark("ai2d").load(no_mask_file)
    with pytest.raises(ValueError, match="variant must be one of"):
        get_benchmark("ai2d", variant="masked")


# ---------------------------------------------------------------------------- POPE


def pope_parquet(tmp_path: Path) -> Path:
    rows = [("adversarial", "yes"), ("adversarial", "no"), ("adversarial", "no"), ("adversarial", "no"),
            ("popular", "yes"), ("popular", "yes"), ("popular", "no"), ("popular", "no"),
            ("random", "yes"), ("random", "no")]
    records = [{"id": str(n), "question_id": n % 4 + 1, "question": f" Is there a thing {n}? ", "answer": gold,
                "image_source": "COCO_val2014_x", "image": hf_image(RED), "category": split}
               for n, (split, gold) in enumerate(rows)]
    return write_parquet(tmp_path / "data" / "test-00000-of-00001.parquet", records)


POPE_REPLIES = {
    "0": "yes", "1": "yes", "2": "Yes", "3": "no",  # adversarial: two false yes
    "4": "Yes", "5": "yes.", "6": "no", "7": " NO ",  # popular: "yes." is unparsable under strict
    "8": "yes", "9": "no",  # random: all right
}


def test_eval_says_how_many_replies_its_rule_could_not_read(tmp_path):
    """`llava-norm eval`'s headline line: a POPE or MMBench score over replies its rule partly could
    not read says how many, one with every reply read says nothing more."""
    from llava_norm.cli import headline_line
    from llava_norm.evaluation.table import headline

    items = get_benchmark("pope").load(pope_parquet(tmp_path))
    settings = get_benchmark("pope").settings()
    for replies, said in ((POPE_REPLIES, "; 1 reply its answer rule could not read)"),
                          ({**POPE_REPLIES, "5": "yes"}, "percent)")):
        line = headline_line(headline("pope"), {"settings": {"benchmark": settings}, "metrics": score("pope", items, replies)})
        assert line.endswith(said), line
    mmbench = get_benchmark("mmbench_en_dev")
    items = mmbench.load(mmbench_tsv(tmp_path))
    for replies, said in (({"0": "red", "1000000": "It is red", "1": "four or five", "1000001": "I cannot tell"},
                           "; 2 replies its answer rule could not read)"),
                          ({"0": "A", "1000000": "B", "1": "B", "1000001": "C"}, "percent)")):
        metrics = score("mmbench_en_dev", items, replies)
        line = headline_line(headline("mmbench_en_dev"), {"settings": {"benchmark": mmbench.settings()}, "metrics": metrics})
        assert line.endswith(said), line


def test_pope_loader_prompt_and_split_filter(tmp_path):
    pope_parquet(tmp_path)
    items = get_benchmark("pope").load(tmp_path)
    assert len(items) == 10 and items[0].item_id == "0"
    assert items[0].prompt == "Is there a thing 0?\nAnswer the question using a single word or phrase."
    assert items[0].meta["splits"] == ["adversarial"] and items[0].max_new_tokens == 128
    popular = get_benchmark("pope", split="popular").load(tmp_path)
    assert [i.item_id for i in popular] == ["4", "5", "6", "7"]


def test_pope_metrics_report_predicted_yes_share(tmp_path):
    items = get_benchmark("pope").load(pope_parquet(tmp_path))
    metrics = score("pope", items, POPE_REPLIES)
    adversarial, popular, random = (metrics["per_split"][s] for s in ("adversarial", "popular", "random"))
    # adversarial: TP 1, FP 2, FN 0 -> precision 1/3, recall 1, f1 0.5; 3 of 4 replies are yes
    assert adversarial["accuracy"] == 0.5 and adversarial["precision"] == pytest.approx(1 / 3)
    assert adversarial["recall"] == 1.0 and adversarial["f1"] == pytest.approx(0.5)
    assert adversarial["predicted_yes_share"] == 0.75 and adversarial["gold_yes_share"] == 0.25
    # popular: the unparsable "yes." is wrong, and (lmms-eval) drops out of precision and recall
    assert popular["accuracy"] == 0.75 and popular["unparsable"] == 1
    assert popular["precision"] == 1.0 and popular["recall"] == 1.0 and popular["f1"] == 1.0
    assert random["f1"] == 1.0
    assert metrics["mean_over_splits"]["f1"] == pytest.approx((0.5 + 1.0 + 1.0) / 3)
    assert metrics["mean_over_splits"]["accuracy"] == pytest.approx(0.75)
    pooled = metrics["pooled"]
    assert pooled["accuracy"] == pytest.approx(0.7)
    assert (pooled["precision"], pooled["recall"]) == (pytest.approx(0.6), 1.0)
    assert pooled["predicted_yes_share"] == 0.5 and pooled["gold_yes_share"] == 0.4  # they differ
    assert metrics["unparsable_replies"] == 1


def test_pope_llava_reply_rule_reads_sentences(tmp_path):
    items = get_benchmark("pope").load(pope_parquet(tmp_path))
    replies = dict(POPE_REPLIES, **{"5": "Yes, there is a thing.", "7": "There is no thing."})
    metrics = score("pope", items, replies, reply_rule="llava_first_sentence")
    assert metrics["unparsable_replies"] == 0
    assert metrics["per_split"]["popular"]["accuracy"] == 1.0
    assert get_benchmark("pope", reply_rule="llava_first_sentence").settings()["reply_rule"] == "llava_first_sentence"
    # the first sentence only, and 'not' is a no, as LLaVA's eval_pope reads them
    rule = "llava_first_sentence"
    assert parse_yes_no("Yes. There is no dog in the picture.", rule) == "yes"
    assert parse_yes_no("There is not a dog.", rule) == "no"
    assert parse_yes_no("No, there is a dog.", rule) == "no"


def test_pope_vlmevalkit_tsv_with_joined_categories(tmp_path):
    path = write_tsv(tmp_path / "POPE.tsv", [
        {"index": 0, "image": b64(GREEN), "question": "Is there a dog?", "answer": "Yes", "category": "adversarial,popular"},
        {"index": 1, "image": "0", "question": "Is there a cat?", "answer": "No", "category": "random"},
    ])
    items = get_benchmark("pope").load(path)
    assert items[0].meta == {"answer": "yes", "splits": ["adversarial", "popular"], "question_id": None}
    assert color_of(items[1]) == GREEN
    metrics = score("pope", items, {"0": "yes", "1": "yes"})
    assert set(metrics["per_split"]) == {"adversarial", "popular", "random"}
    assert metrics["pooled"]["num_items"] == 3  # the two-split item counts in both
    assert [i.item_id for i in get_benchmark("pope", split="popular").load(path)] == ["0"]


# ---------------------------------------------------------------------------- bad input


def test_bad_input_errors_name_file_row_and_column(tmp_path):
    good = {"index": 0, "question": "q", "hint": "", "A": "a", "B": "b", "answer": "A", "category": "c",
            "l2-category": "l", "image": b64(RED)}
    no_category = write_tsv(tmp_path / "a.tsv", [{k: v for k, v in good.items() if k != "category"}])
    # a column the file lacks is said to be absent, with the columns it has (not "missing or empty" on row 0)
    with pytest.raises(ValueError, match=r"a.tsv: row 0 \(index 0\): no column 'category' \(its columns: 'index', "):
        get_benchmark("mmbench_en_dev").load(no_category)
    empty_category = write_tsv(tmp_path / "e.tsv", [dict(good, category="")])
    with pytest.raises(ValueError, match=r"e.tsv: row 0 \(index 0\): missing or empty column 'category'"):
        get_benchmark("mmbench_en_dev").load(empty_category)
    bad_image = write_tsv(tmp_path / "b.tsv", [good, dict(good, index=1, image="@@" * 40)])
    with pytest.raises(ValueError, match=r"b.tsv: row 1 \(index 1\): column 'image' is not valid base64"):
        get_benchmark("mmbench_en_dev").load(bad_image)
    not_png = write_tsv(tmp_path / "c.tsv", [dict(good, image=base64.b64encode(b"x" * 80).decode())])
    with pytest.raises(ValueError, match=r"c.tsv: row 0 \(index 0\): column 'image' does not hold a decodable image "
                                         r"\(cannot identify image file of 80 bytes\)"):
        get_benchmark("mmbench_en_dev").load(not_png)
    bad_answer = write_tsv(tmp_path / "d.tsv", [dict(good, answer="E")])
    with pytest.raises(ValueError, match=r"d.tsv: row 0 \(index 0\): column 'answer' must be one of \['A', 'B'\]"):
        get_benchmark("mmbench_en_dev").load(bad_answer)
    pope = write_tsv(tmp_path / "POPE.tsv", [{"index": 3, "image": b64(RED), "question": "q", "answer": "maybe",
                                              "category": "random"}])
    with pytest.raises(ValueError, match=r"POPE.tsv: row 0 \(index 3\): column 'answer' must be yes or no, got 'maybe'"):
        get_benchmark("pope").load(pope)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(ValueError, match="no OCRBench data file found"):
        get_benchmark("ocrbench").load(empty_dir)
    with pytest.raises(ValueError, match="no such file or directory"):
        get_benchmark("ai2d").load(tmp_path / "missing.parquet")
