"""Tests for llava_norm.datasets_convert: LLaVA-NeXT parquet conversion and the 558K checker.

The parquet fixtures mirror the published lmms-lab/LLaVA-NeXT-Data schema (id: string,
conversations: list<struct<from, value>>, data_source: string, image: struct<bytes, path>, null for
text-only rows); the JSON fixture mirrors blip_laion_cc_sbu_558k.json (``<image>`` may trail).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from llava_norm import datasets_convert as dc

IMG = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
CONV = pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))
SCHEMA = pa.schema([("id", pa.string()), ("conversations", CONV), ("data_source", pa.string()),
                    ("image", IMG)])


def img_bytes(color: str, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), color).save(buf, fmt)
    return buf.getvalue()


def qa(q: str, a: str, human: str = "human", gpt: str = "gpt") -> list[dict]:
    return [{"from": human, "value": q}, {"from": gpt, "value": a}]


def row(rid, conv, image=None, path=None, source="src") -> dict:
    img = None if image is None else {"bytes": image, "path": path}
    return {"id": rid, "conversations": conv, "data_source": source, "image": img}


RED, GREEN, BLUE = img_bytes("red", "JPEG"), img_bytes("green"), img_bytes("blue", "JPEG")
GIF = img_bytes("yellow", "GIF")
SHARD0 = [
    row("000000000001", qa("<image>\nWhat is this?", "A red square."), RED,
        "coco/train2017/000000000001.jpg", "coco"),
    row("VG_100K/4", qa("<image>\nColour?", "Green."), GREEN),  # no path, id holds a '/'
    row("text-1", qa("Hello?", "Hi."), source="sharegpt"),
    row("000000000002", qa("<image>\nAnd this?", "Blue."), BLUE, "coco/train2017/000000000002.jpg"),
    row("multi", qa("<image>\nFirst?", "One.") + qa("Second?", "Two."), RED),
]
SHARD1 = [
    row("user-style", qa("Describe.\n<image>", "Red.", "user", "assistant"), RED,
        "coco/train2017/000000000001.jpg"),  # same file as row 0: shared, not duplicated
    row("text-2", qa("Why?", "Because.")),
    row("gif1", qa("<image>\nWhat?", "Yellow."), GIF),
]


def write_shards(d: Path, shards=(SHARD0, SHARD1), rg: int = 2) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(shards):
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA),
                       d / f"train-{i:05d}-of-{len(shards):05d}.parquet", row_group_size=rg)
    return d


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def reference(tmp_path_factory):
    """One uninterrupted conversion: (json text, image tree, stats)."""
    root = tmp_path_factory.mktemp("ref")
    src = write_shards(root / "pq")
    stats = dc.convert_llava_next_parquet(src, root / "out.json", root / "img")
    return (root / "out.json").read_text(), tree(root / "img"), stats


def test_conversion_rows_and_images(tmp_path, reference):
    text, images, stats = reference
    rows = json.loads(text)
    assert [r["id"] for r in rows] == [r["id"] for r in SHARD0 + SHARD1]
    by_id = {r["id"]: r for r in rows}
    assert by_id["000000000001"]["image"] == "coco/train2017/000000000001.jpg"
    assert by_id["VG_100K/4"]["image"] == "VG_100K/4.png"  # <id>.<ext from magic bytes>
    assert by_id["multi"]["image"] == "multi.jpg" and by_id["gif1"]["image"] == "gif1.gif"
    assert by_id["user-style"]["image"] == "coco/train2017/000000000001.jpg"
    for rid in ("text-1", "text-2"):
        assert "image" not in by_id[rid] and set(by_id[rid]) >= {"id", "conversations"}
    assert [t["from"] for t in by_id["user-style"]["conversations"]] == ["human", "gpt"]
    assert by_id["000000000001"]["data_source"] == "coco"
    assert images == {"coco/train2017/000000000001.jpg": RED, "VG_100K/4.png": GREEN,
                      "coco/train2017/000000000002.jpg": BLUE, "multi.jpg": RED, "gif1.gif": GIF}
    assert (stats.rows_in, stats.rows_written) == (8, 8)
    assert (stats.rows_with_image, stats.text_only) == (6, 2)
    assert stats.roles_normalised == 2 and stats.finished and stats.skipped == 0


def test_jsonl_output_and_finished_rerun_is_noop(tmp_path, reference):
    src, out = write_shards(tmp_path / "pq"), tmp_path / "out.jsonl"
    first = dc.convert_llava_next_parquet(src, out, tmp_path / "img")
    lines = out.read_text().splitlines()
    assert [json.loads(x) for x in lines] == json.loads(reference[0])
    assert not Path(f"{out}.parts.jsonl").exists()
    assert json.loads(Path(f"{out}.progress.json").read_text())["stats"]["finished"]
    assert dc.convert_llava_next_parquet(src, out, tmp_path / "img") == first  # requeued job
    assert dc.convert_llava_next_parquet(src, out, tmp_path / "img", resume=False) == first
    assert out.read_text().splitlines() == lines


def test_resume_after_limit_matches_uninterrupted(tmp_path, reference, monkeypatch):
    monkeypatch.setattr(dc, "_BATCH_ROWS", 1)  # cursor lands mid row group
    src, out, img = write_shards(tmp_path / "pq"), tmp_path / "out.json", tmp_path / "img"
    part = dc.convert_llava_next_parquet(src, out, img, limit=3)
    assert not part.finished and [r["id"] for r in json.loads(out.read_text())] == [
        "000000000001", "VG_100K/4", "text-1"]
    assert dc.convert_llava_next_parquet(src, out, img, limit=3) == part  # same limit: no-op
    dc.convert_llava_next_parquet(src, out, img, limit=6)  # crosses into shard 1
    final = dc.convert_llava_next_parquet(src, out, img)
    assert out.read_text() == reference[0] and tree(img) == reference[1] and final == reference[2]


@pytest.mark.parametrize("batch", [1, 2, 256])
@pytest.mark.parametrize("where,fail_at", [("image", 1), ("image", 4), ("progress", 2),
                                           ("progress", 5)])
def test_resume_after_crash_matches_uninterrupted(tmp_path, reference, monkeypatch, batch, where,
                                                  fail_at):
    monkeypatch.setattr(dc, "_BATCH_ROWS", batch)
    src, out, img = write_shards(tmp_path / "pq"), tmp_path / "out.json", tmp_path / "img"
    calls = {"n": 0}

    def crashing(real, is_target):
        def wrapper(path, data):
            if is_target(path):
                calls["n"] += 1
                if calls["n"] == fail_at:
                    raise RuntimeError("simulated kill")
            return real(path, data)
        return wrapper

    name = "_write_image" if where == "image" else "_atomic_write_text"
    target = (lambda p: True) if where == "image" else (lambda p: str(p).endswith("progress.json"))
    monkeypatch.setattr(dc, name, crashing(getattr(dc, name), target))
    with pytest.raises(RuntimeError, match="simulated kill"):
        dc.convert_llava_next_parquet(src, out, img)
    monkeypatch.undo()
    monkeypatch.setattr(dc, "_BATCH_ROWS", batch)
    final = dc.convert_llava_next_parquet(src, out, img)
    rows = json.loads(out.read_text())
    assert len({r["id"] for r in rows}) == len(rows) == 8  # no duplicates
    assert out.read_text() == reference[0] and tree(img) == reference[1] and final == reference[2]


def test_changed_inputs_refuse_to_resume(tmp_path):
    src, out = write_shards(tmp_path / "pq"), tmp_path / "out.json"
    dc.convert_llava_next_parquet(src, out, tmp_path / "img", limit=2)
    with pytest.raises(ValueError, match="differ"):
        dc.convert_llava_next_parquet(sorted(src.glob("*.parquet"))[:1], out, tmp_path / "img")


GOOD = row("ok", qa("<image>\nQ?", "A."), GREEN)
BAD_CASES = {
    "missing_conversations": row("bad", None, GREEN),
    "empty_conversation": row("bad", [], GREEN),
    "unknown_role": row("bad", qa("<image>\nQ?", "A.", gpt="system"), GREEN),
    "first_turn_not_human": row("bad", qa("<image>\nQ?", "A.", "gpt", "human"), GREEN),
    "image_token_mismatch": row("bad", qa("Q without token?", "A."), GREEN),
    "text_only_with_token": row("bad", qa("<image>\nQ?", "A.")),
    "two_tokens": row("bad", qa("<image>\n<image>\nQ?", "A."), GREEN),
    "token_in_later_turn": row("bad", qa("<image>\nQ?", "A.") + qa("<image> again", "B."), GREEN),
    "undecodable_image": row("bad", qa("<image>\nQ?", "A."), b"definitely not an image"),
    "truncated_image": row("bad", qa("<image>\nQ?", "A."), BLUE[: len(BLUE) // 2]),
    "dotdot_path": row("bad", qa("<image>\nQ?", "A."), GREEN, "../../evil.png"),
    "absolute_path": row("bad", qa("<image>\nQ?", "A."), GREEN, str(Path("/tmp/evil.png"))),
    "dotdot_id": row("../../evil", qa("<image>\nQ?", "A."), GREEN),
}
KIND = {"text_only_with_token": "image_token_mismatch", "two_tokens": "image_token_mismatch",
        "token_in_later_turn": "image_token_mismatch", "truncated_image": "undecodable_image",
        "dotdot_path": "unsafe_path", "absolute_path": "unsafe_path", "dotdot_id": "unsafe_path"}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_rows_error_names_file_and_row_or_are_skipped(tmp_path, case):
    src = write_shards(tmp_path / "pq", shards=[[GOOD, BAD_CASES[case]]])
    with pytest.raises(dc.BadRowError) as ei:
        dc.convert_llava_next_parquet(src, tmp_path / "o.json", tmp_path / "w" / "img")
    msg, rid = str(ei.value), BAD_CASES[case]["id"]
    assert "train-00000-of-00001.parquet" in msg and "row 1 " in msg and repr(rid) in msg
    assert ei.value.kind == KIND.get(case, case)
    assert not list(tmp_path.rglob("evil*"))  # nothing escaped the image folder
    stats = dc.convert_llava_next_parquet(src, tmp_path / "o.json", tmp_path / "w" / "img",
                                          on_bad_row="skip")  # resumes the failed run's output
    assert (stats.rows_written, stats.skipped) == (1, 1)
    assert stats.skip_reasons == {KIND.get(case, case): 1} and rid in stats.examples[0]
    assert [r["id"] for r in json.loads((tmp_path / "o.json").read_text())] == ["ok"]


def test_name_conflict_falls_back_to_row_id(tmp_path):
    rows = [GOOD | {"id": "a", "image": {"bytes": RED, "path": "x/1.jpg"}},
            GOOD | {"id": "b", "image": {"bytes": BLUE, "path": "x/1.jpg"}}]
    stats = dc.convert_llava_next_parquet(write_shards(tmp_path / "pq", shards=[rows]),
                                          tmp_path / "o.json", tmp_path / "img")
    out = json.loads((tmp_path / "o.json").read_text())
    assert [r["image"] for r in out] == ["x/1.jpg", "b.jpg"] and stats.name_conflicts == 1
    assert tree(tmp_path / "img") == {"x/1.jpg": RED, "b.jpg": BLUE}


def pretrain_fixture(root: Path, extra: list | None = None) -> tuple[Path, Path]:
    """558K-style json + images/<5 digits>/<9 digits>.jpg, as unzipped from images.zip."""
    images = root / "images"
    rows = []
    for i, color in enumerate(["red", "green", "blue"]):
        rel = f"00453/00453937{i}.jpg"
        (images / rel).parent.mkdir(parents=True, exist_ok=True)
        (images / rel).write_bytes(img_bytes(color, "JPEG"))
        # the real file puts <image> after the instruction too ("...photo.\n<image>")
        prompt = "Render a clear and concise summary of the photo.\n<image>" if i else "<image>\nQ"
        conv = qa(prompt, f"a {color} box")
        rows.append({"id": f"00453937{i}", "image": rel, "conversations": conv})
    (root / "blip_laion_cc_sbu_558k.json").write_text(json.dumps(rows + (extra or [])))
    return root / "blip_laion_cc_sbu_558k.json", images


def test_check_pretrain_good_and_cleaned_jsonl(tmp_path):
    js, images = pretrain_fixture(tmp_path)
    stats = dc.check_llava_pretrain(js, images, write_jsonl=tmp_path / "clean.jsonl",
                                    verify_images=True)
    assert (stats.rows_in, stats.rows_written, stats.rows_with_image, stats.skipped) == (3, 3, 3, 0)
    clean = [json.loads(x) for x in (tmp_path / "clean.jsonl").read_text().splitlines()]
    assert clean == json.loads(js.read_text())
    assert dc.check_llava_pretrain(js, images, limit=2).rows_in == 2


PRETRAIN_BAD = {
    "missing_image": {"id": "9", "image": "00999/000000009.jpg",
                      "conversations": qa("<image>", "x")},
    "missing_conversations": {"id": "9", "image": "00453/004539370.jpg"},
    "image_token_mismatch": {"id": "9", "image": "00453/004539370.jpg",
                             "conversations": qa("<image><image>", "x")},
    "unsafe_path": {"id": "9", "image": "../blip_laion_cc_sbu_558k.json",
                    "conversations": qa("<image>", "x")},
    "missing_id": ["not", "an", "object"],
}


@pytest.mark.parametrize("kind", sorted(PRETRAIN_BAD))
def test_check_pretrain_bad_rows(tmp_path, kind):
    js, images = pretrain_fixture(tmp_path, [PRETRAIN_BAD[kind]])
    with pytest.raises(dc.BadRowError) as ei:
        dc.check_llava_pretrain(js, images)
    assert "blip_laion_cc_sbu_558k.json: row 3 " in str(ei.value) and ei.value.kind == kind
    stats = dc.check_llava_pretrain(js, images, on_bad_row="skip", write_jsonl=tmp_path / "c.jsonl")
    assert (stats.rows_written, stats.skip_reasons) == (3, {kind: 1})
    assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 3


def test_cli(tmp_path, capsys):
    src = write_shards(tmp_path / "pq")
    assert dc.main(["next", str(src), "--out", str(tmp_path / "o.json"),
                    "--image-dir", str(tmp_path / "img"), "--limit", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["rows_written"] == 4
    js, images = pretrain_fixture(tmp_path / "pre", [PRETRAIN_BAD["missing_image"]])
    assert dc.main(["pretrain", "--json", str(js), "--image-dir", str(images)]) == 2
    assert "row 3" in capsys.readouterr().err
    assert dc.main(["pretrain", "--json", str(js), "--image-dir", str(images),
                    "--on-bad-row", "skip"]) == 0
    assert json.loads(capsys.readouterr().out)["skip_reasons"] == {"missing_image": 1}
