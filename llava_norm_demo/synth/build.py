"""``build_world``: write the whole synthetic world (images, corpora, mini benchmarks, scene
records, manifest) into one directory, deterministically and idempotently.

Each component draws from its own generator ``numpy.random.default_rng([seed, k])``, so the
benchmarks do not change when a corpus size changes. The manifest is written last (atomic
rename); a later call with the same settings returns it untouched when every file it lists
is present with its recorded size. Otherwise the files of the old manifest (and only
those) are removed and the world is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from llava_norm.files import write_atomically
from llava_norm_demo.synth import benchmarks as B
from llava_norm_demo.synth.corpora import instruct_row, pretrain_row, text_corpus, text_instruct_row
from llava_norm_demo.synth.facts import fact_sentences, hellaswag_split, mmlu_split
from llava_norm_demo.synth.next_parquet import next_shards
from llava_norm_demo.synth.render import IMAGE_SIZE, scene_png
from llava_norm_demo.synth.world import sample_split_scene

SCHEMA_VERSION = 2  # 2: benchmarks keyed by their registered names; chance left to the declarations
GENERATOR_VERSION = "synth-2"  # bump whenever generated content changes (2: the NeXT parquet layout)
MANIFEST = "manifest.json"
IMAGE_FOLDER = "images"
# The stage-2 rows are written twice: as LLaVA JSON with the image folder, and in the hub
# layout of LLaVA-NeXT-Data (parquet shards, images embedded; the folder is its snapshot).
CORPUS_PATHS = {"pretrain": "pretrain/synth_pretrain.json", "instruct": "instruct/synth_instruct.json",
                "instruct_next": "instruct_next", "text": "text/corpus.jsonl"}
NEXT_SHARDS = 4
# One generator per component; a benchmark's stream number is fixed, whatever its name.
RNG_STREAMS = {"pretrain": 1, "instruct": 2, "text": 3, "mmbench_en_dev": 11, "mmstar": 12, "ocrbench": 13,
               "seedbench2_plus": 14, "scienceqa_img": 15, "ai2d": 16, "pope": 17, "hellaswag": 18,
               "mmlu": 19}


def read_manifest(world: str | Path) -> dict:
    """The manifest of a world ``build_world`` wrote."""
    return json.loads((Path(world) / MANIFEST).read_text())


def _json(obj) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, indent=1) + "\n").encode()


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def _complete(root: Path, manifest: dict) -> bool:
    files = manifest.get("files") or {}
    return bool(files) and all((root / p).is_file() and (root / p).stat().st_size == meta["size"]
                               for p, meta in files.items())


def _remove_listed(root: Path, manifest: dict) -> None:
    for rel in (manifest.get("files") or {}):
        p = root / rel
        if p.is_file():
            p.unlink()


# The demo's items per benchmark (``llava-norm synth``'s default too): at 60 the standard error of a
# 4-way score near chance was ~6 points, as large as the effects the demo reports.
DEMO_BENCH_ITEMS = 150


def build_world(out_dir, seed: int = 0, *, image_size: int = IMAGE_SIZE, n_pretrain: int = 3000,
                n_instruct: int = 2000, n_text: int = 4000, n_bench: int = 60,
                bench_sizes: dict[str, int] | None = None, holdout_pct: int = 20,
                text_prob: float = 0.25, text_only_frac: float = 0.1) -> dict:
    """Write the synthetic world under ``out_dir`` and return its manifest (also saved as
    ``out_dir/manifest.json``). ``n_bench`` is the default item count of every benchmark
    (POPE: per category; MMLU: test questions per subject; MMBench: base questions, each
    with 3 circular copies); ``bench_sizes`` overrides it per registered benchmark name."""
    root = Path(out_dir)
    if not 0 < holdout_pct < 100:
        raise ValueError("holdout_pct must be in 1..99 (both splits need scenes)")
    if min(n_pretrain, n_instruct, n_text, n_bench, *(bench_sizes or {}).values()) < 0:
        raise ValueError("sizes must be >= 0")
    sizes = {name: int((bench_sizes or {}).get(name, n_bench)) for name in (*B.VISION_WRITERS, *B.TEXT_WRITERS)}
    unknown = set(bench_sizes or {}) - set(sizes)
    if unknown:
        raise ValueError(f"unknown benchmarks in bench_sizes: {sorted(unknown)}")
    settings = {"seed": int(seed), "image_size": int(image_size), "n_pretrain": int(n_pretrain),
                "n_instruct": int(n_instruct), "n_text": int(n_text), "bench_sizes": sizes,
                "holdout_pct": int(holdout_pct), "text_prob": float(text_prob),
                "text_only_frac": float(text_only_frac), "generator_version": GENERATOR_VERSION}
    mpath = root / MANIFEST
    if mpath.is_file():
        try:
            old = json.loads(mpath.read_text())
        except (OSError, ValueError):
            old = {}
        if old.get("settings") == settings and _complete(root, old):
            return old
        _remove_listed(root, old)
        mpath.unlink()

    files: dict[str, dict] = {}

    def write(rel: str, data: bytes) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        files[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def rng(name: str) -> np.random.Generator:
        return np.random.default_rng([int(seed), RNG_STREAMS[name]])

    train_records = []

    def train_images(kind: str, n: int, g: np.random.Generator):
        out = []
        for i in range(n):
            scene = sample_split_scene(g, "train", holdout_pct, text_prob=text_prob)
            rel = f"{kind}/{i:06d}.png"
            write(f"{IMAGE_FOLDER}/{rel}", scene_png(scene, image_size))
            train_records.append({"image": rel, "scene": scene.to_dict()})
            out.append((rel, scene))
        return out

    # --- stage-1 captions
    g = rng("pretrain")
    rows = [pretrain_row(f"pt-{i:06d}", rel, scene, g)
            for i, (rel, scene) in enumerate(train_images("pretrain", n_pretrain, g))]
    write(CORPUS_PATHS["pretrain"], _json(rows))
    # --- stage-2 instructions (text-only rows interleaved at a fixed stride)
    g = rng("instruct")
    mmlu_train, hs_train = mmlu_split(holdout_pct)["train"], hellaswag_split(holdout_pct)["train"]
    n_text_only = int(round(n_instruct * text_only_frac))
    stride = max(1, n_instruct // max(1, n_text_only))
    images = iter(train_images("instruct", n_instruct - n_text_only, g))
    facts, rows, k = fact_sentences(), [], 0
    for i in range(n_instruct):
        if k < n_text_only and i % stride == stride - 1:
            rows.append(text_instruct_row(f"it-{i:06d}", mmlu_train, facts, g))
            k += 1
        else:
            rel, scene = next(images, (None, None))
            if rel is None:
                rows.append(text_instruct_row(f"it-{i:06d}", mmlu_train, facts, g))
                k += 1
                continue
            rows.append(instruct_row(f"it-{i:06d}", rel, scene, g))
    write(CORPUS_PATHS["instruct"], _json(rows))
    for rel, data in next_shards(rows, root / IMAGE_FOLDER, min(NEXT_SHARDS, max(1, n_instruct))).items():
        write(f"{CORPUS_PATHS['instruct_next']}/{rel}", data)
    # --- text-only corpus
    g = rng("text")
    scenes = [sample_split_scene(g, "train", holdout_pct, text_prob=text_prob) for _ in range(max(1, n_text // 5))]
    write(CORPUS_PATHS["text"], _jsonl(text_corpus(n_text, scenes, mmlu_train, hs_train, g)))

    # --- benchmarks
    bench_entries, bench_records = {}, []
    for name, writer in B.VISION_WRITERS.items():
        entry, bfiles, recs = writer(rng(name), sizes[name], image_size, holdout_pct)
        for rel, data in bfiles.items():
            write(rel, data)
        bench_entries[name], bench_records = entry, bench_records + recs
    for name, writer in B.TEXT_WRITERS.items():
        entry, bfiles, _ = writer(rng(name), sizes[name], holdout_pct)
        for rel, data in bfiles.items():
            write(rel, data)
        bench_entries[name] = entry
    write("meta/train_scenes.jsonl", _jsonl(train_records))
    write("meta/bench_scenes.jsonl", _jsonl(bench_records))

    manifest = {
        "schema_version": SCHEMA_VERSION,
        "settings": settings,
        "image_folder": IMAGE_FOLDER,
        "corpora": {
            "pretrain": {"path": CORPUS_PATHS["pretrain"], "format": "llava_json", "image_folder": IMAGE_FOLDER,
                         "rows": n_pretrain},
            "instruct": {"path": CORPUS_PATHS["instruct"], "format": "llava_json", "image_folder": IMAGE_FOLDER,
                         "rows": n_instruct, "text_only_rows": k},
            "instruct_next": {"path": CORPUS_PATHS["instruct_next"], "format": "next_parquet", "rows": n_instruct,
                              "text_only_rows": k},
            "text": {"path": CORPUS_PATHS["text"], "format": "jsonl_text", "rows": n_text},
        },
        "benchmarks": bench_entries,
        "meta": {"train_scenes": "meta/train_scenes.jsonl", "bench_scenes": "meta/bench_scenes.jsonl",
                 "holdout": f"sha256(scene key or question stem) % 100 < {holdout_pct} -> benchmark"},
        "files": dict(sorted(files.items())),
    }
    write_atomically(mpath, _json(manifest))
    return json.loads(mpath.read_text())
