"""Where the diagnostics get their images and prompts.

Owns reading a sample set from a folder of images, the synthetic world (its ``images/``
folder), or a LLaVA-format ``.json``/``.jsonl`` (images plus the first human turn of each row
as a prompt), in a deterministic order and capped at ``limit`` images.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from llava_norm.data.conversation import IMAGE_PLACEHOLDER
from llava_norm.data.dataset import read_rows_file
from llava_norm.data.images import open_image

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif"}
# Used when the source brings no prompts of its own (a folder of images).
DEFAULT_PROMPTS = (
    "Describe the image in detail.",
    "What colour is the largest shape in the picture?",
    "How many objects are there, and where are they?",
    "Is there any text written in the image? Answer yes or no.",
)


@dataclass
class SampleSet:
    images: list[Image.Image]
    prompts: list[str] = field(default_factory=lambda: list(DEFAULT_PROMPTS))
    source: str = ""
    image_paths: list[Path] = field(default_factory=list)


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def _from_llava_json(path: Path, image_folder: Path | None, limit: int) -> SampleSet:
    folder = image_folder or path.parent
    images, names, prompts = [], [], []
    for row in read_rows_file(path):
        turns = row.get("conversations") or []
        first = next((t.get("value", "") for t in turns if t.get("from") == "human"), "")
        text = first.replace(IMAGE_PLACEHOLDER, "").strip()
        if text and text not in prompts and len(prompts) < limit:
            prompts.append(text)
        if row.get("image") and len(images) < limit:
            images.append(open_image(folder / row["image"]))
            names.append(folder / row["image"])
        if len(images) >= limit and len(prompts) >= limit:
            break
    if not images:
        raise ValueError(f"{path}: no row with an 'image' found (image folder {folder})")
    return SampleSet(images, prompts or list(DEFAULT_PROMPTS), str(path), names)


def load_samples(source: str | Path, limit: int = 16, image_folder: str | Path | None = None) -> SampleSet:
    """Images (and prompts) from a folder, a synthetic world dir, or a LLaVA json/jsonl."""
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"sample source not found: {path}")
    if path.is_file():
        if path.suffix not in (".json", ".jsonl"):
            raise ValueError(f"{path}: a sample source file must be a LLaVA .json or .jsonl")
        return _from_llava_json(path, Path(image_folder) if image_folder else None, limit)
    folder = path / "images" if (path / "manifest.json").is_file() else path  # a synthetic world
    files = _image_files(folder)[:limit]
    if not files:
        raise ValueError(f"{folder}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return SampleSet([open_image(f) for f in files], list(DEFAULT_PROMPTS), str(path),
                     files)
