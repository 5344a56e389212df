"""HellaSwag and MMLU: lm-eval preprocessing, exact prompt strings, acc / acc_norm rules.

Fixtures are written in the official layouts: Rowan/hellaswag JSONL and parquet,
cais/mmlu parquet (``all/test-*``, ``all/dev-*``) and the headerless hendrycks CSVs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llava_norm.evaluation.benchmarks import get_benchmark


def write_parquet(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


# ---------------------------------------------------------------------------- HellaSwag


HELLASWAG_ROWS = [
    {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
     "ctx": "A man is sitting on a roof. he", "split": "val", "split_type": "indomain", "label": 3,
     "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "source_id": "x"},
    {"ind": 92, "activity_label": "Clean and jerk", "ctx_a": "[header] How to lift  weights [title] Warm up.",
     "ctx_b": "", "ctx": "", "split": "val", "split_type": "zeroshot", "label": 1,
     "endings": ["Go.", "Stretch your arms [step] slowly and carefully.", "Run [substeps] away.", "Sit."],
     "source_id": "y"},
]


def test_hellaswag_jsonl_preprocessing(tmp_path):
    path = tmp_path / "hellaswag_val.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in HELLASWAG_ROWS))
    items = get_benchmark("hellaswag").load(tmp_path)  # directory: finds hellaswag_val.jsonl
    assert [i.item_id for i in items] == ["24", "92"]
    assert items[0].context == "Roof shingle removal: A man is sitting on a roof. He"
    assert items[0].continuations[3] == " starts pulling up roofing on a roof."
    assert items[0].gold == 3
    # strip (drops the space an empty ctx_b leaves), " [title]" -> ". ", [..] removed,
    # then the double spaces that leaves collapse
    assert items[1].context == "Clean and jerk: How to lift weights. Warm up."
    assert items[1].continuations == [" Go.", " Stretch your arms slowly and carefully.", " Run away.", " Sit."]


def test_hellaswag_parquet_with_string_labels(tmp_path):
    records = [dict(r, label=str(r["label"])) for r in HELLASWAG_ROWS]
    path = write_parquet(tmp_path / "data" / "validation-00000-of-00001.parquet", records)
    items = get_benchmark("hellaswag").load(tmp_path, limit=1)
    assert len(items) == 1 and items[0].gold == 3
    bad = write_parquet(tmp_path / "bad" / "validation-00000-of-00001.parquet", [dict(records[0], label="7")])
    with pytest.raises(ValueError, match=r"validation-00000-of-00001.parquet: row 0: column 'label' must be 0-3"):
        get_benchmark("hellaswag").load(bad)
    assert path.exists()


def test_hellaswag_acc_and_acc_norm_disagree_when_length_flips_the_argmax(tmp_path):
    rows = [dict(HELLASWAG_ROWS[0], ind=1, label=1, endings=["ab", "abcd", "other ending", "another one"])]
    path = tmp_path / "hellaswag_val.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = get_benchmark("hellaswag").load(path)
    # summed: ending 0 wins (-2.0 > -3.6). Per character of the ending itself (lm-eval):
    # -2.0/2 = -1.0 < -3.6/4 = -0.9, so ending 1 (gold) wins. Dividing by the continuation
    # with its leading space instead (-2.0/3 > -3.6/5) would pick ending 0 again.
    metrics = get_benchmark("hellaswag").score(items, {"1": [-2.0, -3.6, -30.0, -30.0]})
    assert metrics == {"acc": 0.0, "acc_norm": 1.0, "num_items": 1, "scale": "0-1"}
    with pytest.raises(ValueError, match="must be a list of 4 floats"):
        get_benchmark("hellaswag").score(items, {"1": [-1.0, -2.0]})


# ---------------------------------------------------------------------------- MMLU


def mmlu_question(n: int, subject: str, answer: int) -> dict:
    return {"question": f" Question {n} about {subject}? ", "subject": subject,
            "choices": [f"w{n}", f"x{n}", f"y{n}", f"z{n}"], "answer": answer}


def mmlu_dir(tmp_path: Path) -> Path:
    root = tmp_path / "cais_mmlu"
    write_parquet(root / "all" / "test-00000-of-00001.parquet", [
        mmlu_question(1, "high_school_biology", 2),
        mmlu_question(2, "high_school_biology", 0),
        mmlu_question(3, "virology", 1),
    ])
    write_parquet(root / "all" / "dev-00000-of-00001.parquet",
                  [mmlu_question(100 + k, "high_school_biology", k % 4) for k in range(5)]
                  + [mmlu_question(200 + k, "virology", 3) for k in range(5)])
    # a per-subject copy next to all/ must not be read twice
    write_parquet(root / "virology" / "test-00000-of-00001.parquet", [mmlu_question(3, "virology", 1)])
    return root


def block(n: int, subject: str) -> str:
    return f"Question {n} about {subject}?\nA. w{n}\nB. x{n}\nC. y{n}\nD. z{n}\nAnswer:"


def test_mmlu_zero_shot_prompt(tmp_path):
    items = get_benchmark("mmlu").load(mmlu_dir(tmp_path))
    assert [i.item_id for i in items] == ["high_school_biology#0", "high_school_biology#1", "virology#0"]
    assert items[0].context == (
        "The following are multiple choice questions (with answers) about high school biology.\n\n"
        "Question 1 about high_school_biology?\nA. w1\nB. x1\nC. y1\nD. z1\nAnswer:"
    )
    assert items[0].continuations == [" A", " B", " C", " D"] and items[0].gold == 2


def test_mmlu_five_shot_prompt_uses_first_dev_questions(tmp_path):
    items = get_benchmark("mmlu", num_fewshot=5).load(mmlu_dir(tmp_path))
    shots = "".join(f"{block(100 + k, 'high_school_biology')} {'ABCD'[k % 4]}\n\n" for k in range(5))
    assert items[0].context == (
        "The following are multiple choice questions (with answers) about high school biology.\n\n"
        + shots + block(1, "high_school_biology")
    )
    assert items[2].context.startswith(
        "The following are multiple choice questions (with answers) about virology.\n\n"
        "Question 200 about virology?\nA. w200\nB. x200\nC. y200\nD. z200\nAnswer: D\n\nQuestion 201"
    )
    assert items[2].context.endswith("Answer: D\n\n" + block(3, "virology"))
    assert get_benchmark("mmlu", num_fewshot=5).settings()["num_fewshot"] == 5


def test_mmlu_continuation_formulation_prompt_and_scoring(tmp_path):
    """lm-eval mmlu_continuation: no options in the prompt, the answer texts are the
    continuations, shots show the answer text; acc_norm divides by the text's characters."""
    bench = get_benchmark("mmlu", formulation="continuation", num_fewshot=1)
    items = bench.load(mmlu_dir(tmp_path))
    assert items[0].context == (
        "The following are questions (with answers) about high school biology.\n\n"
        "Question: Question 100 about high_school_biology?\nAnswer: w100\n\n"
        "Question: Question 1 about high_school_biology?\nAnswer:"
    )
    assert items[0].continuations == [" w1", " x1", " y1", " z1"] and items[0].gold == 2
    assert items[2].continuations == [" w3", " x3", " y3", " z3"] and items[2].gold == 1
    # acc_norm's lengths as the loader gives them: the answer texts' characters, as lm-eval counts
    # them, without the leading space (" w1" counts 2)
    assert [item.meta["choice_lengths"] for item in items] == [[2, 2, 2, 2]] * 3
    predictions = {
        "high_school_biology#0": [-4.0, -3.0, -1.0, -2.0],  # right either way
        "high_school_biology#1": [-2.0, -1.0, -3.0, -4.0],  # wrong either way (gold A)
        "virology#0": [-2.0, -0.5, -3.0, -4.0],
    }
    metrics = bench.score(items, predictions)
    assert metrics["acc"] == pytest.approx(2 / 3) and metrics["acc_norm"] == pytest.approx(2 / 3)
    assert metrics["formulation"] == "continuation"
    assert "mmlu_continuation" in bench.settings()["formulation"]
    assert "acc_norm" not in get_benchmark("mmlu").score(get_benchmark("mmlu").load(mmlu_dir(tmp_path)), predictions)
    with pytest.raises(ValueError, match="formulation must be one of"):
        get_benchmark("mmlu", formulation="cloze")


def test_mmlu_continuation_acc_norm_divides_by_characters():
    from llava_norm.evaluation.benchmarks.base import LoglikelihoodItem

    def item(choices, gold):
        return LoglikelihoodItem("mmlu", "s#0", "ctx", [f" {c}" for c in choices], gold=gold,
                                 meta={"subject": "s", "choice_lengths": [len(c) for c in choices]})

    bench = get_benchmark("mmlu", formulation="continuation")
    # summed log-probs favour the short " a"; per character the long right answer wins
    metrics = bench.score([item(["a", "longer answer", "b", "c"], 1)], {"s#0": [-1.0, -2.8, -3.0, -3.0]})
    assert metrics["acc"] == 0.0 and metrics["acc_norm"] == 1.0
    # per character of the lengths given (the loader's, without the leading space, are checked in
    # test_mmlu_continuation_formulation_prompt_and_scoring): -0.9/1 < -2.0/3, where lengths with
    # the space, -0.9/2 > -2.0/4, would pick "a"
    metrics = bench.score([item(["a", "bbb", "cccccc", "dddddd"], 1)], {"s#0": [-0.9, -2.0, -9.0, -9.0]})
    assert metrics["acc_norm"] == 1.0


def test_mmlu_scoring_micro_and_macro(tmp_path):
    items = get_benchmark("mmlu").load(mmlu_dir(tmp_path))
    predictions = {
        "high_school_biology#0": [-4.0, -3.0, -1.0, -2.0],  # C: right
        "high_school_biology#1": [-2.0, -1.0, -3.0, -4.0],  # B: wrong (gold A)
        "virology#0": [-2.0, -0.5, -3.0, -4.0],  # B: right
    }
    metrics = get_benchmark("mmlu").score(items, predictions)
    assert metrics["acc"] == pytest.approx(2 / 3)
    assert metrics["per_subject"] == {"high_school_biology": 0.5, "virology": 1.0}
    assert metrics["acc_macro_subjects"] == pytest.approx(0.75)


def test_mmlu_hendrycks_csv_layout_and_fewshot_errors(tmp_path):
    data = tmp_path / "data"
    (data / "test").mkdir(parents=True)
    (data / "dev").mkdir()
    (data / "test" / "virology_test.csv").write_text('"What, exactly?",a,b,c,d,C\n')
    (data / "dev" / "virology_dev.csv").write_text("Shot?,e,f,g,h,A\n")
    (item,) = get_benchmark("mmlu", num_fewshot=1).load(tmp_path)
    assert item.context == (
        "The following are multiple choice questions (with answers) about virology.\n\n"
        "Shot?\nA. e\nB. f\nC. g\nD. h\nAnswer: A\n\n"
        "What, exactly?\nA. a\nB. b\nC. c\nD. d\nAnswer:"
    )
    assert item.gold == 2 and item.item_id == "virology#0"
    with pytest.raises(ValueError, match="fewer than 2 questions for subject\\(s\\) \\['virology'\\]"):
        get_benchmark("mmlu", num_fewshot=2).load(tmp_path)
    with pytest.raises(ValueError, match="needs the dev split"):
        get_benchmark("mmlu", num_fewshot=1).load(data / "test" / "virology_test.csv")
    single = get_benchmark("mmlu", num_fewshot=1, dev_path=str(data / "dev")).load(data / "test" / "virology_test.csv")
    assert single[0].context == item.context
    with pytest.raises(ValueError, match="num_fewshot must be an int in 0..5"):
        get_benchmark("mmlu", num_fewshot=6)
