"""Bad data, nothing lost: every kind of bad row is an error naming its file and row under
``on_bad_sample: error``, and under ``skip`` is dropped (or replaced by the next row when found
at draw time) with a structured record of its cause; odd but valid images (16-bit, palette,
CMYK, alpha) load with their real content."""

import io
import json
import re
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from tinydata import write_dataset

from llava_norm.config import DataSource
from llava_norm.config_schema import ConfigError
from llava_norm.data import images as images_module
from llava_norm.data.collate import collate
from llava_norm.data.conversation import conversation_tokenizer
from llava_norm.data.dataset import (
    SKIP_CAUSES, WHOLE_FILE, BadSampleError, SupervisedDataset, count_by_cause, read_rows_file,
)
from llava_norm.data.images import BadImageError, open_image, preprocess, to_rgb
from llava_norm.model.builder import ModelSpec, build_model

RECORD_KEYS = {"file", "row", "cause", "message"}


def _row(row_id, image="0000.png", question="What colour?", answer="Red."):
    prompt = f"<image>\n{question}" if image else question
    return {"id": row_id, **({"image": image} if image else {}),
            "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}]}


@pytest.fixture(scope="module")
def bundle(tiny_dir):
    return build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama"))


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims width x height 8-bit grey pixels but holds no pixel data: opening it
    reads the size, decoding it fails, so a refusal by size is known to come before decoding."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def _png_bytes(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG", **options)
    return buffer.getvalue()


def _build(bundle, tmp_path, files: dict, policy: str, max_length: int = 512, prompt_format: str = "chat",
           length_estimate: str = "tokens"):
    """A dataset over ``files`` (name -> rows, or raw bytes written as they are), in order,
    with images from tmp_path/images (0000.png and 0001.png are good ones). A file already
    there with the same bytes is left as it is, so a second build can find its index cached."""
    _, folder = write_dataset(tmp_path, n=2)
    mixture = []
    for name, content in files.items():
        path = tmp_path / name
        if not isinstance(content, bytes):
            content = ("".join(json.dumps(row) + "\n" for row in content) if name.endswith(".jsonl")
                       else json.dumps(content)).encode()
        if not path.is_file() or path.read_bytes() != content:
            path.write_bytes(content)
        mixture.append(DataSource(path=str(path), image_folder=str(folder)))
    encoder = conversation_tokenizer(bundle, prompt_format, {"date_string": "26 Jul 2024"})
    return SupervisedDataset(mixture, encoder, bundle.image_processor, max_length, on_bad_sample=policy,
                             length_estimate=length_estimate)


def _drawn(dataset) -> tuple[list[str], list[dict]]:
    """Sample ids of one pass over the dataset, and the skip records the pass produced."""
    examples = [dataset[i] for i in range(len(dataset))]
    return [e.sample_id for e in examples], [record for e in examples for record in e.skipped]


# --- images that cannot be used: found when the sample is drawn -----------------------------

NOISE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8))
BAD_IMAGES = {
    "image_missing": None,  # no file written
    "image_empty_file": b"",
    "image_truncated": _png_bytes(NOISE)[:3000],  # of ~12 kB
    "image_corrupt": b"\x89PNG\r\n\x1a\n this is not an image at all",
    "image_too_large": _png_header(100_000, 100_000),  # 10^10 pixels: PIL's own bomb error
}


@pytest.mark.parametrize("cause", sorted(BAD_IMAGES))
def test_bad_image_errors_or_is_replaced_and_recorded(bundle, tmp_path, cause):
    if BAD_IMAGES[cause] is not None:
        (tmp_path / "images").mkdir(parents=True, exist_ok=True)
        (tmp_path / "images" / "bad.png").write_bytes(BAD_IMAGES[cause])
    rows = [_row("bad1", "bad.png"), _row("ok1", "0000.png"), _row("ok2", "0001.png")]
    dataset = _build(bundle, tmp_path, {"rows.json": rows}, "error")
    with pytest.raises(BadSampleError, match=r"rows\.json: row bad1: .*bad\.png") as raised:
        dataset[0]
    assert raised.value.cause == cause and raised.value.row == "bad1"
    dataset = _build(bundle, tmp_path, {"rows.json": rows}, "skip")
    ids, records = _drawn(dataset)
    assert ids == ["ok1", "ok1", "ok2"]  # bad1 never trained on: its draw went to the next row
    assert [(r["file"], r["row"], r["cause"]) for r in records] == [(str(tmp_path / "rows.json"), "bad1", cause)]
    assert set(records[0]) == RECORD_KEYS and "bad.png" in records[0]["message"]
    assert cause in SKIP_CAUSES


def test_a_run_of_bad_samples_stops_the_draw_naming_the_last(bundle, tmp_path):
    """Every row's image unreadable (a folder of another dataset's files, say; a folder without
    them is refused at start-up): skipping would go round the file for ever, so the draw stops
    after 32 replacements, naming the last bad row's problem."""
    (tmp_path / "images").mkdir(parents=True, exist_ok=True)
    for i in range(3):
        (tmp_path / "images" / f"bad{i}.png").write_bytes(BAD_IMAGES["image_corrupt"])
    rows = [_row(f"r{i}", f"bad{i}.png") for i in range(3)]
    dataset = _build(bundle, tmp_path, {"rows.json": rows}, "skip")
    with pytest.raises(BadSampleError, match=r"32 consecutive bad samples from index 1; last: .*rows\.json: row r\d: "
                                             r".*bad\d\.png") as raised:
        dataset[1]
    assert raised.value.cause == "too_many_bad_samples"


def test_huge_image_is_refused_from_its_header_without_warnings(tmp_path, monkeypatch):
    """Between PIL's warning and error limits, and over our own (lower) limit, the refusal
    comes from the size alone: the files hold no pixel data, so decoding would say truncated."""
    path = tmp_path / "big.png"
    with warnings.catch_warnings(record=True) as emitted:
        warnings.simplefilter("always")
        path.write_bytes(_png_header(9_600, 9_600))  # 92 M pixels: over PIL's 89.5 M, under twice it
        with pytest.raises(BadImageError, match="too large") as raised:
            open_image(path)
        assert raised.value.cause == "image_too_large"
        monkeypatch.setattr(images_module, "MAX_IMAGE_PIXELS", 50 * 50)
        path.write_bytes(_png_header(60, 60))
        with pytest.raises(BadImageError, match=r"60x60 pixels, over the 2500 pixel limit") as raised:
            open_image(path)
        assert raised.value.cause == "image_too_large"
    assert not emitted  # PIL's DecompressionBombWarning does not escape either
    monkeypatch.setattr(images_module, "MAX_IMAGE_PIXELS", 10**12)
    with pytest.raises(BadImageError) as raised:  # under the limit, the same file fails to decode
        open_image(path)
    assert raised.value.cause in ("image_truncated", "image_corrupt")


# --- odd but valid images load with their real content ---------------------------------------

def _loaded(tmp_path, data: bytes, name: str = "x.png") -> np.ndarray:
    (tmp_path / name).write_bytes(data)
    return np.asarray(open_image(tmp_path / name))


def test_sixteen_bit_greyscale_is_scaled_not_clipped(tmp_path):
    values = np.array([[0, 257 * 100, 40000, 65535]], dtype=np.uint16)
    pixels = _loaded(tmp_path, _png_bytes(Image.fromarray(values)))
    assert pixels.shape == (1, 4, 3) and (pixels == pixels[..., :1]).all()  # grey, as RGB
    assert pixels[0, :, 0].tolist() == [0, 100, 156, 255]  # 40000 / 257 = 155.6, not 255
    as_int32 = Image.fromarray(values.astype(np.int32))  # mode "I", as PIL opens some 16-bit files
    assert np.asarray(to_rgb(as_int32))[0, :, 0].tolist() == [0, 100, 156, 255]


def test_palette_with_transparency_loads_its_colours_on_white(tmp_path):
    image = Image.new("P", (4, 2), 1)
    image.putpalette([0, 0, 0, 200, 10, 10, 10, 200, 10] + [0] * 759)
    image.paste(0, (0, 0, 2, 2))  # left half: palette entry 0, made transparent below
    image.paste(2, (3, 0, 4, 2))
    plain = _loaded(tmp_path, _png_bytes(image))
    assert plain[0].tolist() == [[0, 0, 0]] * 2 + [[200, 10, 10], [10, 200, 10]]
    transparent = _loaded(tmp_path, _png_bytes(image, transparency=0))
    assert transparent[0].tolist() == [[255, 255, 255]] * 2 + [[200, 10, 10], [10, 200, 10]]


def test_cmyk_loads_as_its_colour(tmp_path):
    cmyk = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # pure red ink
    buffer = io.BytesIO()
    cmyk.save(buffer, "TIFF")
    assert (_loaded(tmp_path, buffer.getvalue(), "x.tif") == [255, 0, 0]).all()
    buffer = io.BytesIO()
    Image.new("CMYK", (16, 16), (0, 255, 255, 64)).save(buffer, "JPEG", quality=95)  # Adobe CMYK JPEG
    pixels = _loaded(tmp_path, buffer.getvalue(), "x.jpg").astype(int)
    assert np.abs(pixels - [191, 0, 0]).max() <= 3  # red darkened by a quarter of black


def test_alpha_is_composited_on_white(tmp_path):
    la = Image.fromarray(np.array([[[0, 0], [0, 255], [0, 128]]], dtype=np.uint8), "LA")  # black, alpha 0/255/128
    assert _loaded(tmp_path, _png_bytes(la))[0, :, 0].tolist() == [255, 0, 127]
    rgba = Image.fromarray(np.array([[[200, 0, 0, 128], [10, 20, 30, 255]]], dtype=np.uint8), "RGBA")
    pixels = _loaded(tmp_path, _png_bytes(rgba)).astype(int)
    assert np.abs(pixels[0] - [[227, 127, 127], [10, 20, 30]]).max() <= 1


def test_preprocess_handles_modes_like_open_image():
    """Images handed straight to preprocess (evaluation, analyses) get the same mode handling."""
    from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil

    siglip = SiglipImageProcessorPil(size={"height": 8, "width": 8})  # the torch resize path
    clip = CLIPImageProcessorPil(size={"shortest_edge": 8}, crop_size={"height": 8, "width": 8})  # the processor's
    sixteen = Image.fromarray(np.full((8, 8), 40000, dtype=np.uint16))
    assert sixteen.mode.startswith("I")
    grey = Image.new("RGB", (8, 8), (156, 156, 156))
    for processor in (siglip, clip):
        assert np.allclose(preprocess([sixteen], processor).numpy(), preprocess([grey], processor).numpy())
    clear = Image.new("RGBA", (8, 4), (0, 0, 0, 0))  # padded to square, then shown on white
    assert np.allclose(preprocess([clear], siglip, "pad")[0, :, 3:5].numpy(), 1.0)


# --- files and lines that cannot be read: found at load time ----------------------------------

def test_non_utf8_json_file_is_skipped_whole(bundle, tmp_path):
    latin1 = json.dumps([_row("x1", question="Café?")], ensure_ascii=False).encode("latin-1")
    files = {"good.json": [_row("g1"), _row("g2", "0001.png")], "bad.json": latin1}
    with pytest.raises(BadSampleError, match=r"bad\.json: not UTF-8") as raised:
        _build(bundle, tmp_path, files, "error")
    assert (raised.value.cause, raised.value.row) == ("file_not_utf8", WHOLE_FILE)
    dataset = _build(bundle, tmp_path, files, "skip")
    assert [row.row_id for row in dataset.rows] == ["g1", "g2"]
    assert [(r["file"], r["row"], r["cause"]) for r in dataset.rejected] == [
        (str(tmp_path / "bad.json"), "*", "file_not_utf8")]
    with pytest.raises(BadSampleError, match=r"no usable rows .*bad\.json: not UTF-8"):
        _build(bundle, tmp_path, {"bad.json": latin1}, "skip")


def test_non_utf8_jsonl_lines_are_skipped_alone(bundle, tmp_path):
    lines = [json.dumps(_row(f"r{i}", question=f"Caf\u00e9 {i}?")).encode() for i in range(3)]
    lines[1] = lines[1].replace(b"Caf\\u00e9", b"Caf\xe9")  # a raw latin-1 byte in line 2
    data = b"\n".join(lines) + b"\n"
    with pytest.raises(BadSampleError, match=r"rows\.jsonl: line 2: not UTF-8"):
        _build(bundle, tmp_path, {"rows.jsonl": data}, "error")
    dataset = _build(bundle, tmp_path, {"rows.jsonl": data}, "skip")
    assert [row.row_id for row in dataset.rows] == ["r0", "r2"]
    assert [(r["row"], r["cause"]) for r in dataset.rejected] == [("line 2", "file_not_utf8")]


def test_malformed_json_file(bundle, tmp_path):
    files = {"good.json": [_row("g1")], "broken.json": b'[{"id": "x", "conversations": [}]'}
    with pytest.raises(BadSampleError, match=r"broken\.json: invalid JSON at line 1") as raised:
        _build(bundle, tmp_path, files, "error")
    assert raised.value.cause == "invalid_json"
    dataset = _build(bundle, tmp_path, files, "skip")
    assert [row.row_id for row in dataset.rows] == ["g1"]
    assert [(r["row"], r["cause"]) for r in dataset.rejected] == [("*", "invalid_json")]


def test_malformed_jsonl_line_skips_only_that_line(bundle, tmp_path):
    data = (json.dumps(_row("r1")) + "\n{not json\n\n" + json.dumps(_row("r3")) + "\n").encode()
    with pytest.raises(BadSampleError, match=r"rows\.jsonl: line 2: invalid JSON") as raised:
        _build(bundle, tmp_path, {"rows.jsonl": data}, "error")
    assert (raised.value.cause, raised.value.row) == ("invalid_jsonl_line", "line 2")
    dataset = _build(bundle, tmp_path, {"rows.jsonl": data}, "skip")
    assert [row.row_id for row in dataset.rows] == ["r1", "r3"]
    assert [(r["row"], r["cause"]) for r in dataset.rejected] == [("line 2", "invalid_jsonl_line")]
    (tmp_path / "rows.jsonl").write_bytes(data)
    with pytest.raises(BadSampleError, match="line 2"):  # the analyses' reader stays strict
        read_rows_file(tmp_path / "rows.jsonl")


def test_files_without_rows_are_dropped_whole_and_named(bundle, tmp_path):
    """An empty list, a 0-byte JSONL and one of blank lines beside a good file: each is one
    whole-file record (under error the first stops the build, named); alone they leave no rows."""
    empty = {"empty.json": [], "nothing.jsonl": b"", "blank.jsonl": b"\n  \n"}
    files = {"good.json": [_row("g1")], **empty}
    with pytest.raises(BadSampleError, match=r"empty\.json: holds no rows") as raised:
        _build(bundle, tmp_path, files, "error")
    assert (raised.value.cause, raised.value.row) == ("no_rows", WHOLE_FILE)
    dataset = _build(bundle, tmp_path, files, "skip")
    assert [row.row_id for row in dataset.rows] == ["g1"]
    assert [(r["file"], r["row"], r["cause"]) for r in dataset.rejected] == [
        (str(tmp_path / name), "*", "no_rows") for name in empty]
    with pytest.raises(BadSampleError, match=r"no usable rows .*empty\.json: holds no rows"):
        _build(bundle, tmp_path, {"empty.json": []}, "skip")


# --- rows whose content is wrong: found at load time ------------------------------------------

def _turns(*pairs):
    return [{"from": role, "value": value} for role, value in pairs]


BAD_ROWS = {
    "not_object": (["a list, not a row"], "bad_conversation", "row is not an object"),
    "no_conversations": ({"id": "b1"}, "bad_conversation", "missing or empty 'conversations'"),
    "turn_not_object": ({"id": "b1", "conversations": ["hi", "there"]}, "bad_conversation", "turn 0 needs a string"),
    "value_not_string": ({"id": "b1", "conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "x"}]},
                         "bad_conversation", "turn 0 needs a string"),
    "gpt_first": ({"id": "b1", "conversations": _turns(("gpt", "x"), ("human", "y"))}, "bad_conversation",
                  "must start with a human turn"),
    "no_answer": ({"id": "b1", "conversations": _turns(("human", "x"))}, "bad_conversation", "have a gpt turn"),
    "image_list": ({**_row("b1"), "image": ["0000.png", "0001.png"]}, "bad_image_field", "multi-image"),
    "two_placeholders": (_row("b1", question="<image> again?"), "image_count_mismatch", "2 '<image>' placeholders"),
    "placeholder_no_image": ({"id": "b1", "conversations": _turns(("human", "<image>\nx"), ("gpt", "y"))},
                             "image_count_mismatch", "1 '<image>' placeholders for 0"),
    "image_no_placeholder": ({"id": "b1", "image": "0000.png", "conversations": _turns(("human", "x"), ("gpt", "y"))},
                             "image_count_mismatch", "0 '<image>' placeholders for 1"),
    "placeholder_late": ({"id": "b1", "image": "0000.png",
                          "conversations": _turns(("human", "x"), ("gpt", "y"), ("human", "<image>"), ("gpt", "z"))},
                         "image_placeholder_misplaced", "first human turn"),
    "empty_answer": ({**_row("b1"), "conversations": _turns(("human", "<image>\nx"), ("gpt", ""))}, "empty_turn",
                     r"turn 1 \(gpt\) is empty"),
    "blank_question": ({"id": "b1", "conversations": _turns(("human", " \n\t"), ("gpt", "y"))}, "empty_turn",
                       r"turn 0 \(human\) is empty"),
    # JSON's "\ud800" escape alone: a lone surrogate, which the tokenizer refused in a traceback
    "lone_surrogate": ({"id": "b1", "conversations": _turns(("human", "x"), ("gpt", "ok \ud800 lone"))},
                       "bad_conversation", r"turn 1 \(gpt\) holds '\\ud800' at character 3, half of a surrogate pair"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
@pytest.mark.parametrize("suffix", ["json", "jsonl"])
def test_bad_rows_error_or_are_dropped_and_recorded(bundle, tmp_path, case, suffix):
    bad, cause, message = BAD_ROWS[case]
    rows = [_row("g1"), bad, _row("g2", "0001.png")]
    row_id = bad["id"] if isinstance(bad, dict) else "#1"
    line = " (line 2)" if suffix == "jsonl" else ""
    with pytest.raises(BadSampleError, match=re.escape(f"rows.{suffix}: row {row_id}{line}: ") + f".*{message}"):
        _build(bundle, tmp_path, {f"rows.{suffix}": rows}, "error")
    dataset = _build(bundle, tmp_path, {f"rows.{suffix}": rows}, "skip")
    assert [row.row_id for row in dataset.rows] == ["g1", "g2"]
    assert dataset.rejected == [{"file": str(tmp_path / f"rows.{suffix}"), "row": row_id, "cause": cause,
                                 "message": dataset.rejected[0]["message"]}]
    assert re.search(message, dataset.rejected[0]["message"]), dataset.rejected  # the record says what was wrong
    assert cause in SKIP_CAUSES
    assert _drawn(dataset) == (["g1", "g2"], [])


def test_a_row_the_plain_format_cannot_encode_errors_or_is_dropped_and_recorded(bundle, tmp_path):
    """Stage 1's plain format takes the gpt turn right after the first human turn as the caption.
    A row with two human turns first passes the row checks (a chat template renders it), not this
    format: named under error, dropped and recorded under skip, never a crash of the index build."""
    two = {"id": "two-humans", "image": "0000.png", "conversations": [
        {"from": "human", "value": "<image>\nCaption it."}, {"from": "human", "value": "Again."},
        {"from": "gpt", "value": "A red square."}]}
    rows = [_row("ok1"), two]
    # lengths estimated from words: the index then depends on no tokenizer, but still on the format
    with pytest.raises(BadSampleError, match=r"rows\.json: row two-humans: plain format needs an assistant caption "
                                             r"right after the first user turn"):
        _build(bundle, tmp_path, {"rows.json": rows}, "error", prompt_format="plain", length_estimate="words")
    plain = _build(bundle, tmp_path, {"rows.json": rows}, "skip", prompt_format="plain", length_estimate="words")
    assert [(r["row"], r["cause"]) for r in plain.rejected] == [("two-humans", "bad_conversation")]
    assert _drawn(plain)[0] == ["ok1"]
    # the same files: a chat template renders the row
    chat = _build(bundle, tmp_path, {"rows.json": rows}, "skip", length_estimate="words")
    assert not chat.rejected and _drawn(chat)[0] == ["ok1", "two-humans"]


def test_over_long_sample_is_replaced_and_recorded(bundle, tmp_path):
    long = _row("long", None, question=" ".join(["word"] * 400))
    rows = [long, _row("s1", None, question="Hi?"), _row("s2", None, question="Hello?")]
    fits = len(_build(bundle, tmp_path, {"rows.json": rows[1:]}, "error")[0].input_ids)
    with pytest.raises(BadSampleError, match=rf"rows\.json: row long: first turn does not fit max_length={fits + 8}"):
        _build(bundle, tmp_path, {"rows.json": rows}, "error", max_length=fits + 8)[0]
    dataset = _build(bundle, tmp_path, {"rows.json": rows}, "skip", max_length=fits + 8)
    ids, records = _drawn(dataset)
    assert ids == ["s1", "s1", "s2"] and [(r["row"], r["cause"]) for r in records] == [("long", "too_long")]


# --- determinism, records through collate, counting -------------------------------------------

def test_skips_are_deterministic_and_travel_through_collate(bundle, tmp_path):
    (tmp_path / "images").mkdir(parents=True, exist_ok=True)
    (tmp_path / "images" / "empty.png").write_bytes(b"")
    rows = [_row("g1"), _row("m1", "missing.png"), _row("e1", "empty.png"), _row("g2", "0001.png"),
            {"id": "x", "conversations": []}]
    first = _build(bundle, tmp_path, {"rows.json": rows}, "skip")
    again = _build(bundle, tmp_path, {"rows.json": rows}, "skip")  # a resumed run reloads the data
    assert _drawn(first) == _drawn(again) and first.rejected == again.rejected
    ids, records = _drawn(first)
    assert ids == ["g1", "g2", "g2", "g2"]
    assert [(r["row"], r["cause"]) for r in records] == [
        ("m1", "image_missing"), ("e1", "image_empty_file"), ("e1", "image_empty_file")]
    batch = collate([first[i] for i in range(len(first))], pad_token_id=0)
    assert batch["skipped_samples"] == records
    json.dumps(batch["skipped_samples"] + first.rejected)  # what the trainer writes to skipped.jsonl
    assert count_by_cause(records + first.rejected) == {"image_empty_file": 2, "bad_conversation": 1,
                                                       "image_missing": 1}
    assert count_by_cause([]) == {}


def test_take_counts_file_positions_including_bad_lines_and_a_take_of_no_row_is_refused(bundle, tmp_path):
    data = (json.dumps(_row("r1")) + "\n{bad\n" + json.dumps(_row("r3")) + "\n").encode()
    path = tmp_path / "rows.jsonl"
    path.write_bytes(data)
    encoder = conversation_tokenizer(bundle, "chat", {"date_string": "26 Jul 2024"})
    _, folder = write_dataset(tmp_path, n=2)
    dataset = SupervisedDataset([DataSource(path=str(path), image_folder=str(folder), take="first:2")], encoder,
                                bundle.image_processor, 512, on_bad_sample="skip")
    assert [row.row_id for row in dataset.rows] == ["r1"] and [r["row"] for r in dataset.rejected] == ["line 2"]
    # a share that rounds to no row: the source would add nothing to the mixture; said by its key
    with pytest.raises(ConfigError, match=r"key 'data.mixture\[1\].take': 'first:10%' of 3 rows is no row"):
        SupervisedDataset([DataSource(path=str(path), image_folder=str(folder)),
                           DataSource(path=str(path), image_folder=str(folder), take="first:10%")], encoder,
                          bundle.image_processor, 512, on_bad_sample="skip")
