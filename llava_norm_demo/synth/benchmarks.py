"""Mini benchmarks of the synthetic world, each in its official file layout.

Writers for MMBench-EN dev (VLMEvalKit TSV with circular copies), MMStar, OCRBench,
SEED-Bench-2-Plus, ScienceQA-IMG, AI2D, POPE (HF-datasets parquet, images as
``{"bytes", "path"}`` structs) and the text-only HellaSwag and MMLU (parquet). Every image
comes from a scene in the held-out 'bench' split; every text item from a held-out stem.
Each writer returns ``(manifest entry, files {relpath: bytes}, scene records)``; writers are
keyed by the benchmark's registered name and write under ``benchmarks/<its data_dir>/``, the
layout ``llava-norm eval --data-root`` reads, with file names its ``files`` globs accept.
"""

from __future__ import annotations

import base64
import io
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from llava_norm.evaluation.benchmarks import BENCHMARKS
from llava_norm.evaluation.benchmarks.mcq import LETTERS as ALL_LETTERS
from llava_norm.evaluation.benchmarks.mmbench import CIRCULAR_STRIDE
from llava_norm.evaluation.benchmarks.pope import SPLITS as POPE_SPLITS
from llava_norm_demo.synth.facts import MMLU_SUBJECTS, hellaswag_split, mmlu_split
from llava_norm_demo.synth.render import scene_png
from llava_norm_demo.synth.world import (COLOURS, COLOUR_WEIGHTS, SHAPES, SHAPE_WEIGHTS, Scene, a_, pick,
                                    sample_mc_qa, sample_split_scene)

FOLDER = "benchmarks"  # under the world's root: the --data-root of its evaluations
LETTERS = ALL_LETTERS[:4]  # four options per question (ScienceQA: two to four)
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
MMBENCH_CATS = {
    "colour": ("attribute_recognition", "finegrained_perception (instance-level)"),
    "shape": ("attribute_recognition", "finegrained_perception (instance-level)"),
    "position": ("object_localization", "finegrained_perception (instance-level)"),
    "read": ("ocr", "finegrained_perception (instance-level)"),
    "count": ("object_counting", "finegrained_perception (cross-instance)"),
    "total": ("object_counting", "finegrained_perception (cross-instance)"),
    "relation": ("spatial_relationship", "finegrained_perception (cross-instance)"),
}
MMSTAR_CATS = {
    "colour": ("fine-grained perception", "attribute & celebrity recognition"),
    "shape": ("fine-grained perception", "attribute & celebrity recognition"),
    "count": ("fine-grained perception", "object counting"),
    "position": ("fine-grained perception", "localization"),
    "relation": ("instance reasoning", "cross-instance relation reasoning"),
    "read": ("instance reasoning", "single-instance reasoning"),
    "total": ("math", "numeric commonsense & calculation"),
}
OCR_TYPES = (  # (question_type, dataset, text kind, question)
    ("Regular Text Recognition", "IIIT5K", "word", "what is written in the image?"),
    ("Non-Semantic Text Recognition", "Non-Semantic Text", "nonsense", "what is written in the image?"),
    ("Digit String Recognition", "ORAND", "digits", "what is the number in the image?"),
    ("Scene Text-centric VQA", "textVQA", "word", "What word is written on the white sign below the shapes?"),
    ("Handwritten Mathematical Expression Recognition", "HME100k", "math",
     "Please write out the expression of the formula in the image using LaTeX format."),
)
SEED_KINDS = (("chart", "counting", ("count", "total")), ("map", "grid", ("position", "relation")),
              ("web", "text", ("read",)))
SQA_KINDS = (("natural science", ("colour", "shape", "count")), ("social science", ("position", "relation")),
             ("language science", ("read",)))


def _hf_feature(t: pa.DataType):
    if t == IMAGE:
        return {"_type": "Image"}
    if pa.types.is_list(t):
        return {"feature": _hf_feature(t.value_type), "_type": "Sequence"}
    if pa.types.is_struct(t):
        return {f.name: _hf_feature(f.type) for f in t}
    return {"dtype": {"large_string": "string"}.get(str(t), str(t)), "_type": "Value"}


def parquet_bytes(rows: list[dict], schema: pa.Schema) -> bytes:
    """Parquet with HF ``datasets`` feature metadata, so images decode as Image features."""
    feats = {f.name: _hf_feature(f.type) for f in schema}
    schema = schema.with_metadata({"huggingface": json.dumps({"info": {"features": feats}})})
    table = pa.Table.from_pylist(rows, schema=schema)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="snappy")
    return buf.getvalue()


def hf_image(png: bytes) -> dict:
    return {"bytes": png, "path": None}


def _scenes(rng, n, holdout_pct, **kw) -> list[Scene]:
    return [sample_split_scene(rng, "bench", holdout_pct, **kw) for _ in range(n)]


def _scene_mc(rng, holdout_pct, qtypes, n_opts=4, **scene_kw):
    """A held-out scene and a multiple-choice question about it of one of ``qtypes``
    (a new scene is drawn when this one supports none of them)."""
    while True:
        scene = sample_split_scene(rng, "bench", holdout_pct, **scene_kw)
        got = sample_mc_qa(scene, rng, qtypes, n_opts, max_tries=20)
        if got is not None:
            return (scene, *got)


def bench_path(name: str, *parts: str) -> str:
    """A file of benchmark ``name`` relative to the world's root, in its declared data_dir."""
    return "/".join((FOLDER, BENCHMARKS[name].declaration.data_dir, *parts))


def _entry(path, fmt, rows, columns, **extra) -> dict:
    return {"path": path, "format": fmt, "items": rows, "columns": columns, **extra}


def _rec(bench, item, scene):
    return {"benchmark": bench, "item": item, "scene": scene.to_dict()}


def write_mmbench(rng, n, size, holdout_pct):
    cols = ["index", "question", "hint", *LETTERS, "answer", "category", "image",
            "source", "l2-category", "comment", "split"]
    rows, recs = [], []
    for i in range(n):
        scene, qa, opts, ans = _scene_mc(rng, holdout_pct, tuple(MMBENCH_CATS), text_prob=0.3)
        img = base64.b64encode(scene_png(scene, size)).decode()
        hint = "The picture shows coloured shapes on a 3x3 grid." if rng.random() < 0.3 else ""
        cat, l2 = MMBENCH_CATS[qa.qtype]
        recs.append(_rec("mmbench_en_dev", i, scene))
        for k in range(4):  # circular copies: option j of copy k is option (j + k) % 4
            rot = [opts[(j + k) % 4] for j in range(4)]
            rows.append({"index": i + k * CIRCULAR_STRIDE, "question": qa.question, "hint": hint,
                         **dict(zip(LETTERS, rot)), "answer": LETTERS[(ans - k) % 4], "category": cat,
                         "image": img, "source": "synth", "l2-category": l2, "comment": "", "split": "dev"})
    df = pd.DataFrame(rows, columns=cols).sort_values("index", kind="stable")
    data = df.to_csv(sep="\t", index=False, lineterminator="\n").encode()
    path = bench_path("mmbench_en_dev", "MMBench_DEV_EN.tsv")
    return (_entry(path, "vlmevalkit_tsv", len(rows), cols, questions=n, split="dev",
                   metric="CircularEval over index % 1e6"), {path: data}, recs)


def write_mmstar(rng, n, size, holdout_pct):
    schema = pa.schema([("index", pa.int64()), ("question", pa.string()), ("image", IMAGE),
                        ("answer", pa.string()), ("category", pa.string()), ("l2_category", pa.string()),
                        ("meta_info", pa.struct([("source", pa.string()), ("split", pa.string()),
                                                 ("image_path", pa.string())]))])
    rows, recs = [], []
    for i in range(n):
        scene, qa, opts, ans = _scene_mc(rng, holdout_pct, tuple(MMSTAR_CATS), text_prob=0.3)
        q = qa.question + "\nOptions: " + ", ".join(f"{LETTERS[j]}: {o}" for j, o in enumerate(opts))
        cat, l2 = MMSTAR_CATS[qa.qtype]
        rows.append({"index": i, "question": q, "image": hf_image(scene_png(scene, size)),
                     "answer": LETTERS[ans], "category": cat, "l2_category": l2,
                     "meta_info": {"source": "synth", "split": "val", "image_path": f"images/{i}.png"}})
        recs.append(_rec("mmstar", i, scene))
    path = bench_path("mmstar", "mmstar.parquet")
    return (_entry(path, "hf_parquet", n, schema.names, split="val"),
            {path: parquet_bytes(rows, schema)}, recs)


def write_ocrbench(rng, n, size, holdout_pct):
    schema = pa.schema([("dataset", pa.string()), ("question", pa.string()), ("question_type", pa.string()),
                        ("answer", pa.list_(pa.string())), ("image", IMAGE)])
    rows, recs = [], []
    for i in range(n):
        qtype, source, kind, question = OCR_TYPES[i % len(OCR_TYPES)]
        scene = _scenes(rng, 1, holdout_pct, text_kind=kind)[0]
        answers = [scene.text] + ([scene.text.lower()] if scene.text.lower() != scene.text else [])
        rows.append({"dataset": source, "question": question, "question_type": qtype, "answer": answers,
                     "image": hf_image(scene_png(scene, size))})
        recs.append(_rec("ocrbench", i, scene))
    path = bench_path("ocrbench", "test-00000-of-00001.parquet")
    return (_entry(path, "hf_parquet", n, schema.names, split="test", max_score=n),
            {path: parquet_bytes(rows, schema)}, recs)


def write_seedbench2plus(rng, n, size, holdout_pct):
    schema = pa.schema([("question_id", pa.string()), ("question", pa.string())]
                       + [(f"choice_{x}", pa.string()) for x in LETTERS]
                       + [("answer", pa.string()), ("question_image_type", pa.string()),
                          ("question_image_subtype", pa.string()), ("image", IMAGE)])
    rows, recs = [], []
    for i in range(n):
        itype, subtype, qtypes = SEED_KINDS[i % 3]
        scene, qa, opts, ans = _scene_mc(rng, holdout_pct, qtypes, force_text=itype == "web", text_prob=0.0)
        rows.append({"question_id": f"synth_{i}", "question": qa.question,
                     **{f"choice_{x}": o for x, o in zip(LETTERS, opts)}, "answer": LETTERS[ans],
                     "question_image_type": itype, "question_image_subtype": subtype,
                     "image": hf_image(scene_png(scene, size))})
        recs.append(_rec("seedbench2_plus", f"synth_{i}", scene))
    path = bench_path("seedbench2_plus", "test-00000-of-00001.parquet")
    return (_entry(path, "hf_parquet", n, schema.names, split="test"),
            {path: parquet_bytes(rows, schema)}, recs)


def write_scienceqa(rng, n, size, holdout_pct):
    schema = pa.schema([("image", IMAGE), ("question", pa.string()), ("choices", pa.list_(pa.string())),
                        ("answer", pa.int64()), ("hint", pa.string()), ("subject", pa.string()),
                        ("grade", pa.string())])
    rows, recs = [], []
    for i in range(n):
        subject, qtypes = SQA_KINDS[i % 3]
        scene, qa, choices, ans = _scene_mc(rng, holdout_pct, qtypes, int(rng.integers(2, 5)),
                                            force_text=subject == "language science", text_prob=0.0)
        hint = "Look at the picture of shapes on a 3x3 grid." if rng.random() < 0.4 else ""
        rows.append({"image": hf_image(scene_png(scene, size)), "question": qa.question, "choices": choices,
                     "answer": ans, "hint": hint, "subject": subject, "grade": f"grade{int(rng.integers(1, 7))}"})
        recs.append(_rec("scienceqa_img", i, scene))
    path = bench_path("scienceqa_img", "ScienceQA-IMG", "test-00000-of-00001.parquet")
    return (_entry(path, "hf_parquet", n, schema.names, split="test", config="ScienceQA-IMG"),
            {path: parquet_bytes(rows, schema)}, recs)


def write_ai2d(rng, n, size, holdout_pct):
    schema = pa.schema([("question", pa.string()), ("options", pa.list_(pa.string())),
                        ("answer", pa.string()), ("image", IMAGE)])
    rows, recs = [], []
    for i in range(n):
        scene, qa, opts, ans = _scene_mc(rng, holdout_pct, ("relation", "relation", "position", "total"),
                                         text_prob=0.0, n_shapes=int(rng.integers(2, 5)))
        rows.append({"question": qa.question.replace("in the image", "in the diagram"), "options": opts,
                     "answer": str(ans), "image": hf_image(scene_png(scene, size))})
        recs.append(_rec("ai2d", i, scene))
    path = bench_path("ai2d", "test-00000-of-00001.parquet")
    return (_entry(path, "hf_parquet", n, schema.names, split="test"),
            {path: parquet_bytes(rows, schema)}, recs)


POPULARITY = sorted((f"{c} {k}" for c in COLOURS for k in SHAPES),
                    key=lambda o: -COLOUR_WEIGHTS[list(COLOURS).index(o.split()[0])]
                    * SHAPE_WEIGHTS[SHAPES.index(o.split()[1])])


def pope_negative(scene: Scene, category: str, rng) -> str:
    """An absent object: random (uniform), popular (most frequent a priori) or adversarial
    (near miss: shares the colour or the shape of an object in the image)."""
    present = scene.objects()
    absent = [o for o in POPULARITY if o not in present]
    if category == "popular":
        return pick(rng, absent[:3])
    if category == "adversarial":
        near = [o for o in absent if any(set(o.split()) & set(p.split()) for p in present)]
        return pick(rng, near or absent)
    return pick(rng, absent)


def write_pope(rng, n, size, holdout_pct):
    """``n`` questions per category on ``ceil(n/2)`` shared images: one yes, one no each."""
    schema = pa.schema([("id", pa.string()), ("question_id", pa.string()), ("question", pa.string()),
                        ("answer", pa.string()), ("image_source", pa.string()), ("image", IMAGE),
                        ("category", pa.string())])
    scenes = _scenes(rng, (n + 1) // 2, holdout_pct, text_prob=0.0)
    pngs = [scene_png(s, size) for s in scenes]
    rows, recs = [], []
    for category in POPE_SPLITS:
        for j in range(n):
            scene, yes = scenes[j // 2], j % 2 == 0
            obj = pick(rng, sorted(scene.objects())) if yes else pope_negative(scene, category, rng)
            qid = str(len(rows))
            rows.append({"id": qid, "question_id": qid, "question": f"Is there {a_(obj)} in the image?",
                         "answer": "yes" if yes else "no", "image_source": f"synth_{j // 2:05d}",
                         "image": hf_image(pngs[j // 2]), "category": category})
            recs.append(_rec("pope", qid, scene))
    path = bench_path("pope", "test-00000-of-00001.parquet")
    yes_ratio = sum(r["answer"] == "yes" for r in rows) / len(rows) if rows else 0.0
    return (_entry(path, "hf_parquet", len(rows), schema.names, split="test", images=len(scenes),
                   yes_ratio=yes_ratio, categories=list(POPE_SPLITS)),
            {path: parquet_bytes(rows, schema)}, recs)


def write_hellaswag(rng, n, holdout_pct):
    schema = pa.schema([("ind", pa.int64()), ("activity_label", pa.string()), ("ctx_a", pa.string()),
                        ("ctx_b", pa.string()), ("ctx", pa.string()), ("endings", pa.list_(pa.string())),
                        ("label", pa.string()), ("split", pa.string())])
    pool = hellaswag_split(holdout_pct)["bench"]
    chosen = [pool[int(i)] for i in rng.permutation(len(pool))[:n]]
    rows = []
    for i, c in enumerate(chosen):
        wrong = [c.wrong[int(k)] for k in rng.permutation(len(c.wrong))[:3]]
        endings = [c.ending] + wrong
        endings = [endings[int(k)] for k in rng.permutation(4)]
        rows.append({"ind": i, "activity_label": c.activity_label, "ctx_a": c.ctx_a, "ctx_b": c.ctx_b,
                     "ctx": f"{c.ctx_a} {c.ctx_b}", "endings": endings, "label": str(endings.index(c.ending)),
                     "split": "val"})
    path = bench_path("hellaswag", "validation-00000-of-00001.parquet")
    return (_entry(path, "hf_parquet", len(rows), schema.names, split="validation"),
            {path: parquet_bytes(rows, schema)}, [])


def _interleave_families(items: list, rng) -> list:
    """Items shuffled within each question family, then taken family by family in turn, so
    every family is asked about equally often (as MMLU weighs its subjects, not its templates)."""
    families: dict[str, list] = {}
    for it in items:
        families.setdefault(it.family, []).append(it)
    queues = [[group[int(i)] for i in rng.permutation(len(group))] for _, group in sorted(families.items())]
    out = []
    while any(queues):
        out += [q.pop(0) for q in queues if q]
    return out


def write_mmlu(rng, n, holdout_pct):
    """About ``n`` test questions split evenly over the subjects (and over the question
    families within a subject), plus 5 dev per subject."""
    n_per_subject = -(-n // len(MMLU_SUBJECTS))
    schema = pa.schema([("question", pa.string()), ("subject", pa.string()),
                        ("choices", pa.list_(pa.string())), ("answer", pa.int64())])
    pool = mmlu_split(holdout_pct)["bench"]
    splits: dict[str, list[dict]] = {"dev": [], "test": []}
    files = {}
    for subject in MMLU_SUBJECTS:
        items = _interleave_families([it for it in pool if it.subject == subject], rng)
        per = {"dev": items[:5], "test": items[5:5 + n_per_subject]}
        for split, chosen in per.items():
            rows = []
            for it in chosen:
                choices, ans = it.choices(rng)
                rows.append({"question": it.question, "subject": subject, "choices": choices, "answer": ans})
            files[_mmlu_file(subject, split)] = parquet_bytes(rows, schema)
            splits[split] += rows
    for split, rows in splits.items():
        files[_mmlu_file("all", split)] = parquet_bytes(rows, schema)
    return (_entry(_mmlu_file("all", "test"), "hf_parquet", len(splits["test"]), schema.names, split="test",
                   dev_path=_mmlu_file("all", "dev"), dev_items=len(splits["dev"]), subjects=list(MMLU_SUBJECTS),
                   subject_paths={s: {sp: _mmlu_file(s, sp) for sp in ("dev", "test")} for s in MMLU_SUBJECTS}),
            files, [])


def _mmlu_file(config: str, split: str) -> str:
    """cais/mmlu's layout: one directory per config ("all" or a subject), one file per split."""
    return bench_path("mmlu", config, f"{split}-00000-of-00001.parquet")


# Registered name -> writer, in BENCHMARKS' order; the text-only ones draw no images.
VISION_WRITERS = {"mmbench_en_dev": write_mmbench, "mmstar": write_mmstar, "ocrbench": write_ocrbench,
                  "seedbench2_plus": write_seedbench2plus, "scienceqa_img": write_scienceqa,
                  "ai2d": write_ai2d, "pope": write_pope}
TEXT_WRITERS = {"hellaswag": write_hellaswag, "mmlu": write_mmlu}
