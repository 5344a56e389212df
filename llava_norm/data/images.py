"""Image loading and preprocessing to the vision tower's resolution.

Owns: opening image files (with errors that name the file), LLaVA-1.5's optional
pad-to-square with the processor's mean colour, and the call into the tower's own image
processor (which resizes to its resolution, e.g. 384x384 for SigLIP-SO400M-384).
"""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError

IMAGE_ASPECTS = ("resize", "pad")


class BadImageError(ValueError):
    pass


def open_image(path: str | Path) -> Image.Image:
    try:
        with Image.open(path) as image:
            image.load()
            return image.convert("RGB")
    except FileNotFoundError:
        raise BadImageError(f"image not found: {path}") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as error:
        raise BadImageError(f"cannot decode image {path}: {error}") from None


def pad_to_square(image: Image.Image, fill: tuple[int, int, int]) -> Image.Image:
    width, height = image.size
    if width == height:
        return image
    side = max(width, height)
    canvas = Image.new(image.mode, (side, side), fill)
    canvas.paste(image, ((side - width) // 2, (side - height) // 2))
    return canvas


def preprocess(images: list[Image.Image], image_processor, aspect: str = "resize") -> torch.Tensor:
    """(n, C, H, W) float tensor at the tower's resolution."""
    if aspect not in IMAGE_ASPECTS:
        raise ValueError(f"image_aspect must be one of {IMAGE_ASPECTS}, got {aspect!r}")
    if aspect == "pad":
        fill = tuple(int(round(255 * m)) for m in image_processor.image_mean)
        images = [pad_to_square(image, fill) for image in images]
    return image_processor(images=images, return_tensors="pt")["pixel_values"]
