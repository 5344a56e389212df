"""Tests of the synthetic world (llava_norm_demo.synth): determinism, file formats, answer
correctness against the recorded scenes, train/benchmark disjointness, idempotence.

The answer oracles below re-derive every answer from the scene records with their own
grid arithmetic; they do not call the generator's question code.
"""

import base64
import collections
import hashlib
import io
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from PIL import Image

from llava_norm.evaluation.benchmarks import get_benchmark
from llava_norm_demo.synth import build_world
from llava_norm_demo.synth.render import render_scene
from llava_norm_demo.synth.world import COLOURS, Scene, sample_scene, split_of

SMALL = dict(n_pretrain=120, n_instruct=200, n_text=300, n_bench=24)
GRID = ["top left", "top middle", "top right", "middle left", "center", "middle right",
        "bottom left", "bottom middle", "bottom right"]
EXPECTED_COLUMNS = {
    "mmbench_en_dev": ["index", "question", "hint", "A", "B", "C", "D", "answer", "category", "image",
                "source", "l2-category", "comment", "split"],
    "mmstar": ["index", "question", "image", "answer", "category", "l2_category", "meta_info"],
    "ocrbench": ["dataset", "question", "question_type", "answer", "image"],
    "seedbench2_plus": ["question_id", "question", "choice_A", "choice_B", "choice_C", "choice_D", "answer",
                        "question_image_type", "question_image_subtype", "image"],
    "scienceqa_img": ["image", "question", "choices", "answer", "hint", "subject", "grade"],
    "ai2d": ["question", "options", "answer", "image"],
    "pope": ["id", "question_id", "question", "answer", "image_source", "image", "category"],
    "hellaswag": ["ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "label", "split"],
    "mmlu": ["question", "subject", "choices", "answer"],
}
LETTER_SUFFIX = "\nAnswer with the option's letter from the given choices directly."


# ------------------------------------------------------------------ fixtures and helpers
@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    base = tmp_path_factory.mktemp("synth")
    a, a2, b = base / "a", base / "a2", base / "b"
    t0 = time.perf_counter()
    ma = build_world(a, seed=7, **SMALL)
    build_world(a2, seed=7, **SMALL)
    mb = build_world(b, seed=8, **SMALL)
    return {"a": a, "a2": a2, "b": b, "ma": ma, "mb": mb, "build_s": (time.perf_counter() - t0) / 3}


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def read_bench(root: Path, entry: dict) -> pd.DataFrame:
    path = root / entry["path"]
    if entry["format"] == "vlmevalkit_tsv":
        return pd.read_csv(path, sep="\t")
    return pq.read_table(path).to_pandas()


def decode_image(value) -> Image.Image:
    data = base64.b64decode(value) if isinstance(value, str) else value["bytes"]
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def scene_records(root: Path, name: str) -> dict:
    recs = [json.loads(line) for line in (root / "meta" / name).read_text().splitlines()]
    return recs


def config_key(scene: dict) -> tuple:
    """The test's own notion of 'same scene configuration'."""
    shapes = frozenset((s["position"], s["size"], s["colour"], s["shape"]) for s in scene["shapes"])
    return shapes, scene["background"], scene["text"] or ""


def rc(pos: str) -> tuple[int, int]:
    return divmod(GRID.index(pos), 3)


def oracle(scene: dict, question: str) -> str | None:
    """The true short answer to a world question, derived from the scene record."""
    shapes = scene["shapes"]
    q = question.split("\n")[0].strip()
    m = re.fullmatch(r"How many (\w+)s are there in the (?:image|diagram)\?", q)
    if m:
        return str(len(shapes) if m[1] == "shape" else sum(s["shape"] == m[1] for s in shapes))
    m = re.fullmatch(r"What colour is the (\w+)\?", q)
    if m:
        (hit,) = [s for s in shapes if s["shape"] == m[1]]
        return hit["colour"]
    m = re.fullmatch(r"What shape is the (\w+) object\?", q)
    if m:
        (hit,) = [s for s in shapes if s["colour"] == m[1]]
        return hit["shape"]
    m = re.fullmatch(r"(Where is|Is) the (\w+) (\w+)( small or large)?\?", q)
    if m:
        (hit,) = [s for s in shapes if (s["colour"], s["shape"]) == (m[2], m[3])]
        return hit["size"] if m[4] else hit["position"]
    m = re.fullmatch(r"Is there an? (\w+) (\w+) in the image\?", q)
    if m:
        return "yes" if any((s["colour"], s["shape"]) == (m[1], m[2]) for s in shapes) else "no"
    m = re.fullmatch(r"What is directly (above|below|to the left of|to the right of) the (\w+) (\w+)\?", q)
    if m:
        (hit,) = [s for s in shapes if (s["colour"], s["shape"]) == (m[2], m[3])]
        r, c = rc(hit["position"])
        dr, dc = {"above": (-1, 0), "below": (1, 0), "to the left of": (0, -1), "to the right of": (0, 1)}[m[1]]
        assert 0 <= r + dr < 3 and 0 <= c + dc < 3, "question points off the grid"
        other = [s for s in shapes if rc(s["position"]) == (r + dr, c + dc)]
        return f"the {other[0]['colour']} {other[0]['shape']}" if other else "nothing"
    if q == "What does the background of the image look like?":
        return scene["background"]
    if re.search(r"written|the number in the image|expression of the formula", q):
        assert scene["text"], "reading question on an image without text"
        return scene["text"]
    return None


def parse_mc(prompt: str) -> tuple[str, list[str]]:
    """(question, options) from any of the multiple-choice layouts used in the corpora."""
    body = prompt.replace(LETTER_SUFFIX, "").replace(LETTER_SUFFIX.rstrip("."), "").rstrip()
    if "\nOptions: " in body:
        q, opts = body.split("\nOptions: ")
        return q, [o.split(": ", 1)[1] for o in re.split(r", (?=[A-D]: )", opts)]
    lines = body.split("\n")
    opts = [ln[3:] for ln in lines if re.match(r"[A-H]\. ", ln)]
    q = lines[0].replace(" There are several options:", "")
    return q, opts


# ------------------------------------------------------------------------- determinism
def test_same_seed_is_byte_identical(worlds):
    ha, ha2 = tree_hashes(worlds["a"]), tree_hashes(worlds["a2"])
    assert len(ha) > 300 and ha == ha2


def test_different_seed_differs(worlds):
    ha, hb = tree_hashes(worlds["a"]), tree_hashes(worlds["b"])
    for entry in list(worlds["ma"]["corpora"].values()) + list(worlds["ma"]["benchmarks"].values()):
        files = [p for p in ha if p == entry["path"] or p.startswith(entry["path"] + "/data/")]  # a file or shards
        assert files and all(ha[p] != hb[p] for p in files), entry["path"]
    imgs = [p for p in ha if p.startswith("images/")]
    assert sum(ha[p] != hb.get(p) for p in imgs) > 0.9 * len(imgs)


def test_manifest_lists_exactly_the_files(worlds):
    root, m = worlds["a"], worlds["ma"]
    on_disk = tree_hashes(root)
    on_disk.pop("manifest.json")
    assert on_disk == {p: meta["sha256"] for p, meta in m["files"].items()}
    assert m["settings"]["seed"] == 7 and m["settings"]["image_size"] == 64


# ----------------------------------------------------------------------------- formats
@pytest.mark.parametrize("name", ["pretrain", "instruct"])
def test_conversation_rows(worlds, name):
    root, m = worlds["a"], worlds["ma"]
    entry = m["corpora"][name]
    rows = json.loads((root / entry["path"]).read_text())
    assert len(rows) == entry["rows"] and len({r["id"] for r in rows}) == len(rows)
    text_only = 0
    for r in rows:
        assert set(r) in ({"id", "image", "conversations"}, {"id", "conversations"})
        conv = r["conversations"]
        assert conv and len(conv) % 2 == 0
        assert [t["from"] for t in conv] == ["human", "gpt"] * (len(conv) // 2)
        assert all(isinstance(t["value"], str) and t["value"] for t in conv)
        n_img = sum(t["value"].count("<image>") for t in conv)
        if "image" in r:
            assert n_img == 1 and conv[0]["value"].startswith("<image>\n")
            img = Image.open(root / entry["image_folder"] / r["image"])
            assert img.size == (64, 64) and img.mode == "RGB"
        else:
            assert n_img == 0
            text_only += 1
    if name == "pretrain":
        assert text_only == 0 and all(len(r["conversations"]) == 2 for r in rows)
    else:
        assert text_only == entry["text_only_rows"] and 0.05 <= text_only / len(rows) <= 0.15
        assert max(len(r["conversations"]) for r in rows) >= 6  # multi-turn present


def test_next_layout_holds_the_instruct_rows(worlds):
    """The parquet shards hold the JSON corpus row for row, in order, each image's own bytes
    embedded ({bytes, path}) and null for text-only rows, with the hub card naming the files."""
    root, m = worlds["a"], worlds["ma"]
    rows = json.loads((root / m["corpora"]["instruct"]["path"]).read_text())
    folder = root / m["corpora"]["instruct_next"]["path"]
    shards = sorted((folder / "data").glob("train-*.parquet"))
    assert [s.name for s in shards] == [f"train-{i:05d}-of-00004.parquet" for i in range(4)]
    table = [r for s in shards for r in pq.read_table(s).to_pylist()]
    assert [(r["id"], r["conversations"]) for r in table] == [(r["id"], r["conversations"]) for r in rows]
    for parquet_row, row in zip(table, rows):
        if "image" in row:
            assert parquet_row["image"] == {"bytes": (root / "images" / row["image"]).read_bytes(), "path": row["image"]}
        else:
            assert parquet_row["image"] is None
    assert "path: data/train-*" in (folder / "README.md").read_text()
    assert f"num_examples: {len(rows)}" in (folder / "README.md").read_text()


def test_text_corpus(worlds):
    entry = worlds["ma"]["corpora"]["text"]
    lines = (worlds["a"] / entry["path"]).read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == entry["rows"] and all(set(r) == {"text"} and r["text"].strip() for r in rows)
    joined = "\n".join(r["text"] for r in rows)
    assert "The following are multiple choice questions (with answers) about" in joined
    assert re.search(r"\nAnswer: [ABCD]", joined)


@pytest.mark.parametrize("name", sorted(EXPECTED_COLUMNS))
def test_benchmark_files(worlds, name):
    root, entry = worlds["a"], worlds["ma"]["benchmarks"][name]
    df = read_bench(root, entry)
    assert list(df.columns) == EXPECTED_COLUMNS[name] == entry["columns"]
    assert len(df) == entry["items"] > 0
    if "image" in df:
        for v in df["image"].iloc[:5]:
            img = decode_image(v)
            assert img.format == "PNG" and img.size == (64, 64)
    if entry["format"] == "hf_parquet":
        meta = json.loads(pq.read_schema(root / entry["path"]).metadata[b"huggingface"])
        feats = meta["info"]["features"]
        assert set(feats) == set(EXPECTED_COLUMNS[name])
        if "image" in feats:
            assert feats["image"] == {"_type": "Image"}
            assert df["image"].iloc[0]["path"] is None
    if name == "mmlu":
        dev = pq.read_table(root / entry["dev_path"]).to_pandas()
        assert list(dev.columns) == EXPECTED_COLUMNS["mmlu"]
        assert dev.groupby("subject").size().to_dict() == {s: 5 for s in entry["subjects"]}
        assert all(len(c) == 4 for c in df["choices"]) and set(df["answer"]) <= {0, 1, 2, 3}
    if name == "ocrbench":
        assert all(len(a) >= 1 for a in df["answer"]) and "HME100k" in set(df["dataset"])
    if name == "hellaswag":
        assert all(len(e) == 4 for e in df["endings"]) and set(df["label"]) <= {"0", "1", "2", "3"}
        assert (df["ctx"] == df["ctx_a"] + " " + df["ctx_b"]).all()
    if name == "ai2d":
        assert all(len(o) == 4 for o in df["options"]) and set(df["answer"]) <= {"0", "1", "2", "3"}
    if name == "scienceqa_img":
        assert all(2 <= len(c) <= 4 and 0 <= a < len(c) for c, a in zip(df["choices"], df["answer"]))
    if name == "seedbench2_plus":
        assert set(df["question_image_type"]) == {"chart", "map", "web"}


def test_mmbench_circular_copies(worlds):
    root, entry = worlds["a"], worlds["ma"]["benchmarks"]["mmbench_en_dev"]
    df = read_bench(root, entry)
    base = df[df["index"] < 1_000_000]
    assert len(base) == entry["questions"] and len(df) == 4 * len(base)
    for _, row in base.iterrows():
        copies = df[df["index"] % 1_000_000 == row["index"]]
        assert sorted(copies["index"] // 1_000_000) == [0, 1, 2, 3]
        answer_text = {r[r["answer"]] for _, r in copies.iterrows()}
        assert len(answer_text) == 1, "the answer's option text must survive rotation"
        assert len(set(copies["answer"])) == 4
        assert len({frozenset(r[x] for x in "ABCD") for _, r in copies.iterrows()}) == 1
        assert copies["image"].nunique() == 1 and copies["question"].nunique() == 1


def test_chance_levels(worlds):
    """Uniform guessing, as the declarations compute it on the world's files."""
    root, b = worlds["a"], worlds["ma"]["benchmarks"]

    def chance(name):  # (expected headline, scored units)
        bench = get_benchmark(name)
        per_unit = bench.declaration.chance(bench.load(root / "benchmarks" / bench.declaration.data_dir))
        return np.mean(per_unit), len(per_unit)

    assert chance("mmbench_en_dev") == (pytest.approx(1 / 256), b["mmbench_en_dev"]["questions"])
    assert chance("ocrbench") == (0.0, b["ocrbench"]["items"]) and chance("pope") == (0.5, b["pope"]["items"])
    for name in ("mmstar", "seedbench2_plus", "ai2d", "hellaswag", "mmlu"):
        assert chance(name) == (0.25, b[name]["items"])
    sqa = read_bench(root, b["scienceqa_img"])
    assert chance("scienceqa_img") == (pytest.approx(np.mean([1 / len(c) for c in sqa["choices"]])), len(sqa))


# ---------------------------------------------------------------------- answers are right
def test_benchmark_answers_match_scenes(worlds):
    root, bm = worlds["a"], worlds["ma"]["benchmarks"]
    recs = {}
    for r in scene_records(root, "bench_scenes.jsonl"):
        recs[(r["benchmark"], str(r["item"]))] = r["scene"]
    checked = {}

    def check(name, item, question, truth_text):
        got = oracle(recs[(name, str(item))], question)
        assert got is not None, f"{name}: no oracle for {question!r}"
        assert got == truth_text, f"{name} item {item}: {question!r} -> {truth_text!r}, scene says {got!r}"
        checked[name] = checked.get(name, 0) + 1

    for _, r in read_bench(root, bm["mmbench_en_dev"]).iterrows():
        check("mmbench_en_dev", r["index"] % 1_000_000, r["question"], r[r["answer"]])
    for _, r in read_bench(root, bm["mmstar"]).iterrows():
        q, opts = parse_mc(r["question"])
        check("mmstar", r["index"], q, opts["ABCD".index(r["answer"])])
    for _, r in read_bench(root, bm["seedbench2_plus"]).iterrows():
        check("seedbench2_plus", r["question_id"], r["question"], r["choice_" + r["answer"]])
    for i, r in read_bench(root, bm["scienceqa_img"]).iterrows():
        check("scienceqa_img", i, r["question"], r["choices"][r["answer"]])
    for i, r in read_bench(root, bm["ai2d"]).iterrows():
        check("ai2d", i, r["question"], r["options"][int(r["answer"])])
    for _, r in read_bench(root, bm["pope"]).iterrows():
        check("pope", r["id"], r["question"], r["answer"])
    for i, r in read_bench(root, bm["ocrbench"]).iterrows():
        check("ocrbench", i, r["question"], r["answer"][0])
    assert checked == {k: bm[k]["items"] for k in checked} and len(checked) == 7


def test_instruction_answers_match_scenes(worlds):
    root = worlds["a"]
    scenes = {r["image"]: r["scene"] for r in scene_records(root, "train_scenes.jsonl")}
    rows = json.loads((root / worlds["ma"]["corpora"]["instruct"]["path"]).read_text())
    n_short = n_mc = 0
    for r in rows:
        if "image" not in r:
            continue
        conv = r["conversations"]
        for h, g in zip(conv[::2], conv[1::2]):
            prompt = h["value"].replace("<image>\n", "")
            if prompt.endswith("\nAnswer the question using a single word or phrase."):
                truth = oracle(scenes[r["image"]], prompt)
                assert truth == g["value"], (prompt, g["value"], truth)
                n_short += 1
            elif "Answer with the option's letter" in prompt:
                q, opts = parse_mc(prompt)
                truth = oracle(scenes[r["image"]], q)
                assert truth is not None and opts["ABCDEFGH".index(g["value"])] == truth, (prompt, g["value"])
                assert opts.count(truth) == 1
                n_mc += 1
    assert n_short > 50 and n_mc > 30


def test_captions_mention_every_shape(worlds):
    root = worlds["a"]
    scenes = {r["image"]: r["scene"] for r in scene_records(root, "train_scenes.jsonl")}
    rows = json.loads((root / worlds["ma"]["corpora"]["pretrain"]["path"]).read_text())
    for r in rows:
        cap, sc = r["conversations"][1]["value"], scenes[r["image"]]
        for s in sc["shapes"]:
            assert f"{s['size']} {s['colour']} {s['shape']}" in cap and s["position"] in cap
        assert f"{sc['background']} background" in cap
        assert (sc["text"] is None) == (f'"{sc["text"]}"' not in cap)


def test_text_benchmark_answers(worlds):
    root, bm = worlds["a"], worlds["ma"]["benchmarks"]
    sides = {"triangle": 3, "square": 4, "pentagon": 5, "hexagon": 6, "octagon": 8}
    mixes = {frozenset(("red", "yellow")): "orange", frozenset(("blue", "yellow")): "green",
             frozenset(("red", "blue")): "purple"}
    checked = collections.Counter()
    for _, r in read_bench(root, bm["mmlu"]).iterrows():
        truth, q = r["choices"][r["answer"]], r["question"]
        if m := re.fullmatch(r"An? .+ draws an? \w+ (\w+) on the \w+\. How many (sides|corners) .*", q):
            assert int(truth) == sides[m[1]], q
        elif m := re.fullmatch(r"A box holds (\d) (\w+) and (\d) (\w+) beads\. How many beads .* not \2\?", q):
            assert truth == m[3], q
        elif m := re.fullmatch(r"An? \w+ \w+ starts in the ([a-z ]+) cell of a 3x3 grid and moves one cell (\w+)\. "
                               r"Where is it now\?", q):
            r0, c0 = rc(m[1])
            r0, c0 = r0 + {"up": -1, "down": 1}.get(m[2], 0), c0 + {"left": -1, "right": 1}.get(m[2], 0)
            assert truth == GRID[3 * r0 + c0], q
        elif m := re.fullmatch(r"An? .+ mixes (\w+) paint with (\w+) paint in .*", q):
            assert truth == mixes[frozenset(m.groups())], q
        else:
            continue
        checked[m.re.pattern] += 1
    assert len(checked) == 4 and sum(checked.values()) >= 8, checked  # every checked family is asked
    for _, r in read_bench(root, bm["hellaswag"]).iterrows():
        gold = r["endings"][int(r["label"])]
        m = re.search(r"in the ([a-z ]+) cell of a 3x3 grid\. He slides it one cell (\w+)\.", r["ctx_a"])
        if m:
            r0, c0 = rc(m[1])
            r0, c0 = r0 + {"up": -1, "down": 1}.get(m[2], 0), c0 + {"left": -1, "right": 1}.get(m[2], 0)
            assert gold == f"now sits in the {GRID[3 * r0 + c0]} cell."
        assert len(set(r["endings"])) == 4


def test_pope_categories(worlds):
    root, entry = worlds["a"], worlds["ma"]["benchmarks"]["pope"]
    df = read_bench(root, entry)
    recs = {r["item"]: r["scene"] for r in scene_records(root, "bench_scenes.jsonl") if r["benchmark"] == "pope"}
    assert set(df["category"]) == {"adversarial", "popular", "random"}
    for _, g in df.groupby("category"):
        assert (g["answer"] == "yes").mean() == 0.5
    for _, r in df[(df["category"] == "adversarial") & (df["answer"] == "no")].iterrows():
        colour, shape = re.fullmatch(r"Is there an? (\w+) (\w+) in the image\?", r["question"]).groups()
        present = recs[r["id"]]["shapes"]
        assert any(s["colour"] == colour or s["shape"] == shape for s in present)


def test_render_matches_scene():
    rng = np.random.default_rng(0)
    assert len(set(COLOURS.values())) == len(COLOURS)
    for _ in range(40):
        scene = sample_scene(rng)
        for size in (64, 96):
            arr = np.asarray(render_scene(scene, size))
            assert arr.shape == (size, size, 3)
            for s in scene.shapes:
                r, c = rc(s.position)
                y, x = int((r + 0.5) * size / 3), int((c + 0.5) * size / 3)
                assert tuple(arr[y, x]) == COLOURS[s.colour], (s, size)
            bottom = arr[2 * size // 3:]
            assert ((bottom < 40).all(axis=2).sum() > 20) == (scene.text is not None)


# ------------------------------------------------------------------------ disjointness
def test_train_and_benchmarks_are_disjoint(worlds):
    pct = worlds["ma"]["settings"]["holdout_pct"]
    bench, train = [], []
    for w in ("a", "b"):  # across seeds too: the split does not depend on the seed
        bench += [r["scene"] for r in scene_records(worlds[w], "bench_scenes.jsonl")]
        train += [r["scene"] for r in scene_records(worlds[w], "train_scenes.jsonl")]
    assert all(split_of(Scene.from_dict(s).key(), pct) == "bench" for s in bench)
    assert all(split_of(Scene.from_dict(s).key(), pct) == "train" for s in train)
    assert not {config_key(s) for s in bench} & {config_key(s) for s in train}
    # identical pixels never cross the split either
    root = worlds["a"]
    train_px = {hashlib.sha256(np.asarray(Image.open(p)).tobytes()).hexdigest()
                for p in (root / "images").rglob("*.png")}
    bm = worlds["ma"]["benchmarks"]
    for name in ("mmbench_en_dev", "mmstar", "ocrbench", "seedbench2_plus", "scienceqa_img", "ai2d", "pope"):
        for v in read_bench(root, bm[name])["image"]:
            assert hashlib.sha256(np.asarray(decode_image(v)).tobytes()).hexdigest() not in train_px
    # text benchmarks: no held-out stem / context appears in any training text
    corpus = (root / worlds["ma"]["corpora"]["text"]["path"]).read_text()
    corpus += (root / worlds["ma"]["corpora"]["instruct"]["path"]).read_text()
    corpus = corpus.replace("\\n", "\n")
    for q in read_bench(root, bm["mmlu"])["question"]:
        assert q not in corpus
    for q in pq.read_table(root / bm["mmlu"]["dev_path"]).to_pandas()["question"]:
        assert q not in corpus
    for c in read_bench(root, bm["hellaswag"])["ctx_a"]:
        assert c not in corpus


# ------------------------------------------------------------------------- idempotence
def test_idempotent_rebuild(worlds):
    root = worlds["a"]
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    t0 = time.perf_counter()
    again = build_world(root, seed=7, **SMALL)
    assert time.perf_counter() - t0 < 2.0
    assert again == worlds["ma"]
    after = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    assert after == before


def test_rebuild_on_change_or_damage(tmp_path):
    small = dict(n_pretrain=10, n_instruct=10, n_text=10, n_bench=4)
    m1 = build_world(tmp_path, seed=1, **small)
    victim = tmp_path / m1["corpora"]["pretrain"]["path"]
    victim.write_bytes(victim.read_bytes()[:-10])  # damaged -> incomplete -> rebuilt
    assert build_world(tmp_path, seed=1, **small) == m1
    assert hashlib.sha256(victim.read_bytes()).hexdigest() == m1["files"][m1["corpora"]["pretrain"]["path"]]["sha256"]
    (tmp_path / "keep.txt").write_text("not ours")
    m2 = build_world(tmp_path, seed=1, **{**small, "n_pretrain": 5})  # changed settings
    assert m2["settings"]["n_pretrain"] == 5
    files = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert files == set(m2["files"]) | {"manifest.json", "keep.txt"}  # stale files gone, others kept


def test_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError):
        build_world(tmp_path, holdout_pct=0)
    with pytest.raises(ValueError):
        build_world(tmp_path, bench_sizes={"mmbenchh": 3})
    assert not any(tmp_path.iterdir())


def test_small_build_is_fast(worlds):
    assert worlds["build_s"] < 3.0


@pytest.mark.skipif(not os.environ.get("SYNTH_DEFAULT_BUILD"), reason="set SYNTH_DEFAULT_BUILD=1 to time it")
def test_default_build_under_30s(tmp_path):
    t0 = time.perf_counter()
    build_world(tmp_path)
    assert time.perf_counter() - t0 < 30.0


def test_mmlu_test_questions_spread_over_families():
    """Each subject's test questions cycle through its question families, so a family with
    hundreds of templated variants (the bead counts) cannot crowd out one with a dozen."""
    from llava_norm_demo.synth.benchmarks import _interleave_families
    from llava_norm_demo.synth.facts import mmlu_split

    pool = [it for it in mmlu_split(20)["bench"] if it.subject == "colour_theory"]
    families = sorted({it.family for it in pool})
    assert len(families) >= 4
    order = _interleave_families(pool, np.random.default_rng(0))
    assert sorted(it.family for it in order[:len(families)]) == families  # one of each, then again
    smallest = min(collections.Counter(it.family for it in pool).values())
    rounds = [order[k * len(families):(k + 1) * len(families)] for k in range(smallest)]
    assert all(sorted(it.family for it in r) == families for r in rounds)
    assert sorted(map(id, order)) == sorted(map(id, pool))  # a reordering, nothing lost


def test_the_synth_command_builds_the_demos_world(tmp_path, monkeypatch):
    """``llava-norm synth DIR``, as the README's demo steps show it, is called with the demo's own
    world arguments (its items per benchmark above all), so the models the demo trained meet the
    benchmarks it scored them on; ``--n-bench`` sets another count."""
    import llava_norm_demo.synth as synth
    from llava_norm.cli import main
    from llava_norm_demo.driver import FULL
    from llava_norm_demo.report import SEED

    calls = []
    monkeypatch.setattr(synth, "build_world", lambda out, **kwargs: calls.append((out, kwargs)) or
                        {"benchmarks": {}, "corpora": {"pretrain": {"rows": 0}, "instruct": {"rows": 0}}})
    main(["synth", str(tmp_path / "w")])
    main(["synth", str(tmp_path / "w"), "--n-bench", "12"])
    assert calls == [(str(tmp_path / "w"), {"seed": SEED, **FULL.world}),
                     (str(tmp_path / "w"), {"seed": SEED, **FULL.world, "n_bench": 12})]
