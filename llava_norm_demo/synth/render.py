"""Rendering of a :class:`~llava_norm_demo.synth.world.Scene` to a PIL image and PNG bytes.

Text is drawn with a built-in 5x7 block font (capital letters, digits, ``+ - =``), scaled by
an integer factor and without anti-aliasing, so output is legible for a tiny ViT at 64 px
and byte-identical across machines (it does not depend on FreeType or a font file). Shapes
are drawn with PIL's non-anti-aliased primitives; the noisy background comes from the
scene's own ``noise_seed``.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageDraw

from llava_norm_demo.synth.world import COLOURS, POSITIONS, Scene

_GLYPHS = {
    "A": ".###./#...#/#...#/#####/#...#/#...#/#...#", "B": "####./#...#/#...#/####./#...#/#...#/####.",
    "C": ".###./#...#/#..../#..../#..../#...#/.###.", "D": "####./#...#/#...#/#...#/#...#/#...#/####.",
    "E": "#####/#..../#..../####./#..../#..../#####", "F": "#####/#..../#..../####./#..../#..../#....",
    "G": ".###./#...#/#..../#.###/#...#/#...#/.####", "H": "#...#/#...#/#...#/#####/#...#/#...#/#...#",
    "I": ".###./..#../..#../..#../..#../..#../.###.", "J": "..###/...#./...#./...#./...#./#..#./.##..",
    "K": "#...#/#..#./#.#../##.../#.#../#..#./#...#", "L": "#..../#..../#..../#..../#..../#..../#####",
    "M": "#...#/##.##/#.#.#/#.#.#/#...#/#...#/#...#", "N": "#...#/#...#/##..#/#.#.#/#..##/#...#/#...#",
    "O": ".###./#...#/#...#/#...#/#...#/#...#/.###.", "P": "####./#...#/#...#/####./#..../#..../#....",
    "Q": ".###./#...#/#...#/#...#/#.#.#/#..#./.##.#", "R": "####./#...#/#...#/####./#.#../#..#./#...#",
    "S": ".####/#..../#..../.###./....#/....#/####.", "T": "#####/..#../..#../..#../..#../..#../..#..",
    "U": "#...#/#...#/#...#/#...#/#...#/#...#/.###.", "V": "#...#/#...#/#...#/#...#/#...#/.#.#./..#..",
    "W": "#...#/#...#/#...#/#.#.#/#.#.#/#.#.#/.#.#.", "X": "#...#/#...#/.#.#./..#../.#.#./#...#/#...#",
    "Y": "#...#/#...#/.#.#./..#../..#../..#../..#..", "Z": "#####/....#/...#./..#../.#.../#..../#####",
    "0": ".###./#...#/#..##/#.#.#/##..#/#...#/.###.", "1": "..#../.##../..#../..#../..#../..#../.###.",
    "2": ".###./#...#/....#/...#./..#../.#.../#####", "3": "#####/...#./..#../...#./....#/#...#/.###.",
    "4": "...#./..##./.#.#./#..#./#####/...#./...#.", "5": "#####/#..../####./....#/....#/#...#/.###.",
    "6": "..##./.#.../#..../####./#...#/#...#/.###.", "7": "#####/....#/...#./..#../.#.../.#.../.#...",
    "8": ".###./#...#/#...#/.###./#...#/#...#/.###.", "9": ".###./#...#/#...#/.####/....#/...#./.##..",
    "+": "...../..#../..#../#####/..#../..#../.....", "-": "...../...../...../#####/...../...../.....",
    "=": "...../...../#####/...../#####/...../.....", " ": ".....",
}
GLYPH_W, GLYPH_H = 5, 7
INK = (20, 20, 20)
PLATE = (255, 255, 255)
IMAGE_SIZE = 64  # pixels a side, unless a world is built with another image_size


def glyph_bitmap(text: str) -> np.ndarray:
    """Boolean (7, 6*len-1) array of ``text`` in the block font (unknown chars -> error)."""
    cols = []
    for i, ch in enumerate(text):
        rows = _GLYPHS[ch].split("/")
        rows = rows if len(rows) == GLYPH_H else rows * GLYPH_H
        g = np.array([[c == "#" for c in r] for r in rows], dtype=bool)
        if i:
            cols.append(np.zeros((GLYPH_H, 1), dtype=bool))
        cols.append(g)
    return np.concatenate(cols, axis=1)


def text_scale(image_size: int, n_chars: int = 5) -> int:
    """Largest integer scale at which ``n_chars`` glyphs fit in one grid row."""
    width = n_chars * (GLYPH_W + 1) - 1
    return max(1, min((image_size - 4) // width, (image_size // 3 - 4) // GLYPH_H))


def _background(scene: Scene, size: int) -> np.ndarray:
    if scene.background == "plain":
        return np.full((size, size, 3), 255, dtype=np.uint8)
    if scene.background == "striped":
        yy, xx = np.mgrid[0:size, 0:size]
        period = max(2, size // 16)
        band = ((xx + yy) // period) % 2 == 0
        arr = np.where(band[..., None], np.uint8(250), np.uint8(205))
        return np.broadcast_to(arr, (size, size, 3)).astype(np.uint8)
    rng = np.random.default_rng(scene.noise_seed)
    grey = rng.integers(185, 256, size=(size, size, 1), dtype=np.uint8)
    return np.repeat(grey, 3, axis=2)


def _shape_polygon(kind: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    if kind == "triangle":
        return [(cx, cy - r), (cx + r, cy + 0.8 * r), (cx - r, cy + 0.8 * r)]
    if kind == "star":
        pts = []
        for i in range(10):
            rad = r if i % 2 == 0 else 0.45 * r
            a = -math.pi / 2 + i * math.pi / 5
            pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
        return pts
    raise ValueError(kind)


def cell_center(position: str, size: int) -> tuple[float, float]:
    r, c = divmod(POSITIONS.index(position), 3)
    cell = size / 3
    return (c + 0.5) * cell, (r + 0.5) * cell


def render_scene(scene: Scene, size: int = IMAGE_SIZE) -> Image.Image:
    """RGB image of ``scene`` at ``size`` x ``size`` pixels."""
    img = Image.fromarray(_background(scene, size), "RGB")
    draw = ImageDraw.Draw(img)
    cell = size / 3
    for s in scene.shapes:
        cx, cy = cell_center(s.position, size)
        r = cell * (0.44 if s.size == "large" else 0.26)
        fill = COLOURS[s.colour]
        if s.shape == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        elif s.shape == "square":
            h = 0.85 * r
            draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fill)
        else:
            draw.polygon(_shape_polygon(s.shape, cx, cy, r), fill=fill)
    if scene.text:
        _draw_text(img, scene.text, size)
    return img


def _draw_text(img: Image.Image, text: str, size: int) -> None:
    """Dark block letters on a white plate centred in the bottom grid row."""
    k = text_scale(size, max(5, len(text)))
    bmp = glyph_bitmap(text).repeat(k, axis=0).repeat(k, axis=1)
    h, w = bmp.shape
    x0 = (size - w) // 2
    y0 = int(round(2 * size / 3 + (size / 3 - h) / 2))
    arr = np.asarray(img).copy()
    pad = max(1, k)
    arr[max(0, y0 - pad):y0 + h + pad, max(0, x0 - pad):x0 + w + pad] = PLATE
    arr[y0:y0 + h, x0:x0 + w][bmp] = INK
    img.paste(Image.fromarray(arr, "RGB"))


def png_bytes(img: Image.Image) -> bytes:
    """Deterministic PNG encoding (no metadata, fixed compression level)."""
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def scene_png(scene: Scene, size: int = IMAGE_SIZE) -> bytes:
    return png_bytes(render_scene(scene, size))
