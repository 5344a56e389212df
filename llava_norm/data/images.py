"""Image loading and preprocessing to the vision tower's resolution.

Owns: opening image files (refusing bad ones with a ``BadImageError`` that names the file and
a stable ``cause``), turning every pixel mode into the RGB the towers expect, LLaVA-1.5's
optional pad-to-square with the processor's mean colour, and the tower's preprocessing
(resize to its resolution, e.g. 384x384 for SigLIP-SO400M-384, rescale, normalise) with the
processor's own settings. Training, evaluation and the analyses all come through
``preprocess``, so they always see the same pixels.

For processors that resize to a fixed height x width (SigLIP's), the resize runs in torch:
antialiased bicubic/bilinear ``interpolate`` on the uint8 image, the kernel transformers'
torchvision-backed ("fast") processors use. It is 3x faster than the PIL-backed processor
transformers loads when torchvision is absent (bench/data_pipeline.py) and equal to it up to
one uint8 rounding step (tests/test_images.py). Any other processor (CLIP's shortest-edge
resize + centre crop, for one) is called as it is.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from llava_norm.config_schema import IMAGE_ASPECTS
TORCH_RESAMPLE = {Image.Resampling.BICUBIC: "bicubic", Image.Resampling.BILINEAR: "bilinear"}
# Largest image (width x height) that is decoded at all: PIL's own decompression-bomb limit
# (~89.5 M pixels, 9459 x 9459), checked from the header before any pixel is decoded, so a
# tiny file claiming 100k x 100k pixels costs nothing. PIL warns above its limit and raises
# above twice it; both are turned into the same refusal, so the effective limit is the smaller
# of this and ``PIL.Image.MAX_IMAGE_PIXELS`` (raise both to admit bigger images).
MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS
# Transparent pixels are composited onto white: transparent images in the wild are mostly
# logos, icons, diagrams and text made to be seen on a white page (dropping the alpha, as a
# bare convert("RGB") does, shows whatever colour the transparent pixels happen to hold,
# often black, which hides black text and line art).
ALPHA_BACKGROUND = (255, 255, 255)
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
# Stable causes a BadImageError carries (the dataset records them for every skipped sample).
IMAGE_CAUSES = ("image_missing", "image_empty_file", "image_unreadable", "image_too_large",
                "image_truncated", "image_corrupt", "image_unsupported_mode")


class BadImageError(ValueError):
    def __init__(self, message: str, cause: str = "image_corrupt"):
        super().__init__(message)
        self.cause = cause


def open_image(source) -> Image.Image:
    """The image at ``source`` (a path, or an object whose ``read_bytes`` gives the encoded
    image, e.g. one embedded in a parquet shard) as RGB with its real content; BadImageError
    (with a ``cause`` from IMAGE_CAUSES) for a missing, empty, unreadable, too large,
    truncated or corrupt image."""
    if isinstance(source, (str, Path)):
        source = Path(source)
        try:
            empty = source.stat().st_size == 0
        except FileNotFoundError:
            raise BadImageError(f"image not found: {source}", "image_missing") from None
        except OSError as error:
            raise BadImageError(f"cannot read image {source}: {error}", "image_unreadable") from None
        file = source
    else:
        try:
            data = source.read_bytes()
        except FileNotFoundError as error:
            raise BadImageError(f"image not found: {error}", "image_missing") from None
        except Exception as error:  # pyarrow's errors for a damaged row group, OSError for I/O
            raise BadImageError(f"cannot read image {source}: {error}", "image_unreadable") from None
        empty, file = not data, io.BytesIO(data)
    if empty:  # PIL would say "cannot identify", which hides the cause
        raise BadImageError(f"image file is empty (0 bytes): {source}", "image_empty_file")
    try:
        # PIL signals an over-large image with a warning (or, above twice its limit, an
        # error); as an error it is refused below like the images over our own limit.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(file) as image:
                width, height = image.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise BadImageError(f"image too large: {source} is {width}x{height} pixels, over the "
                                        f"{MAX_IMAGE_PIXELS} pixel limit", "image_too_large")
                image.load()
                rgb = to_rgb(image)
                # closing the file invalidates the opened image, so an RGB one is copied out
                return image.copy() if rgb is image else rgb
    except BadImageError:
        raise
    except FileNotFoundError:
        raise BadImageError(f"image not found: {source}", "image_missing") from None
    except (PermissionError, IsADirectoryError) as error:
        raise BadImageError(f"cannot read image {source}: {error}", "image_unreadable") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise BadImageError(f"image too large: {source}: {error}", "image_too_large") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as error:
        # PIL says "image file is truncated" / "Truncated File Read" when the data stop early
        cause = "image_truncated" if "truncated" in str(error).lower() else "image_corrupt"
        detail = str(error).replace(repr(file), "(the embedded bytes)")  # no memory address: records stay comparable
        raise BadImageError(f"cannot decode image {source}: {detail}", cause) from None


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB with the image's real content, whatever its mode: 16-bit greyscale scaled to 8 bits
    (a bare convert("RGB") clips it, so most 16-bit images load all white), alpha and
    transparent palette entries composited onto ALPHA_BACKGROUND, palette and CMYK mapped
    through PIL's conversions."""
    if image.mode == "RGB" and "transparency" not in image.info:
        return image
    if image.mode in SIXTEEN_BIT_MODES:
        # v / 257 is the exact inverse of 8 -> 16 bit scaling (v8 * 257 = v16): 65535 -> 255,
        # 40000 -> 156. Mode "I" is how PIL opens some 16-bit PNGs and TIFFs, so it is read
        # as 16-bit data too; values outside 0..65535 are clipped.
        values = np.clip(np.asarray(image, dtype=np.float64), 0, 65535)
        return Image.fromarray(np.rint(values / 257).astype(np.uint8), "L").convert("RGB")
    if image.mode in ("RGBA", "RGBa", "LA", "La", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*ALPHA_BACKGROUND, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    try:
        return image.convert("RGB")
    except ValueError as error:  # a mode PIL cannot turn into RGB
        raise BadImageError(f"unsupported image mode {image.mode}: {error}", "image_unsupported_mode") from None


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
    # images handed in by callers (evaluation, analyses) get the same mode handling as files
    images = [to_rgb(image) for image in images]
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
