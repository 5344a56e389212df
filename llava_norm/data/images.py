"""Image loading and preprocessing to the vision tower's resolution.

Owns: opening image files (with errors that name the file), LLaVA-1.5's optional
pad-to-square with the processor's mean colour, and the tower's preprocessing (resize to its
resolution, e.g. 384x384 for SigLIP-SO400M-384, rescale, normalise) with the processor's own
settings. Training, evaluation and the analyses all come through ``preprocess``, so they
always see the same pixels.

For processors that resize to a fixed height x width (SigLIP's), the resize runs in torch:
antialiased bicubic/bilinear ``interpolate`` on the uint8 image, the kernel transformers'
torchvision-backed ("fast") processors use. It is 3x faster than the PIL-backed processor
transformers loads when torchvision is absent (bench/data_pipeline.py) and equal to it up to
one uint8 rounding step (tests/test_images.py). Any other processor (CLIP's shortest-edge
resize + centre crop, for one) is called as it is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

IMAGE_ASPECTS = ("resize", "pad")
TORCH_RESAMPLE = {Image.Resampling.BICUBIC: "bicubic", Image.Resampling.BILINEAR: "bilinear"}


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
    size = fixed_resize(image_processor)
    if size is None:
        return image_processor(images=images, return_tensors="pt")["pixel_values"]
    pixels = torch.cat([_resized_uint8(image, size, TORCH_RESAMPLE[image_processor.resample]) for image in images])
    mean = torch.tensor(image_processor.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(image_processor.image_std).view(1, 3, 1, 1)
    return (pixels.float() * image_processor.rescale_factor - mean) / std


def fixed_resize(image_processor) -> tuple[int, int] | None:
    """(height, width) when ``image_processor`` does convert-RGB -> fixed-size resize -> rescale
    -> normalise and nothing else, i.e. when the torch path reproduces it; else None."""
    size = getattr(image_processor, "size", None)
    height, width = (getattr(size, "height", None), getattr(size, "width", None)) if size is not None else (None, None)
    simple = (getattr(image_processor, "do_resize", False) and height and width
              and not getattr(image_processor, "do_center_crop", False) and not getattr(image_processor, "do_pad", False)
              and getattr(image_processor, "resample", None) in TORCH_RESAMPLE
              and getattr(image_processor, "do_rescale", False) and getattr(image_processor, "do_normalize", False))
    return (int(height), int(width)) if simple else None


def _resized_uint8(image: Image.Image, size: tuple[int, int], mode: str) -> torch.Tensor:
    """(1, 3, height, width) uint8, RGB, resized as the torchvision-backed processors do."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    pixels = torch.from_numpy(np.array(rgb)).permute(2, 0, 1).unsqueeze(0)
    if tuple(pixels.shape[-2:]) != size:
        pixels = torch.nn.functional.interpolate(pixels, size=size, mode=mode, antialias=True)
    return pixels
