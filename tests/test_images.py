"""data.images.preprocess: the torch resize path against the tower's own image processor."""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil

from llava_norm.data.images import fixed_resize, preprocess

ONE_STEP = 2 / 255  # one uint8 rounding step after normalising with mean = std = 0.5


def _images(seed: int) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    sizes = [(512, 512), (333, 500), (700, 260), (96, 96), (40, 57)]  # down-, up-, non-square, same size
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    # smooth content too, where resampling filters differ most visibly
    ramp = np.linspace(0, 255, 300 * 420, dtype=np.float32).reshape(300, 420)
    images.append(Image.fromarray(np.stack([ramp, ramp[::-1], ramp * 0.5], -1).astype(np.uint8)))
    images.append(images[0].convert("L"))  # greyscale in, RGB out
    return images


@pytest.mark.parametrize("resample", [Image.Resampling.BICUBIC, Image.Resampling.BILINEAR])
def test_torch_resize_matches_the_siglip_processor(resample):
    processor = SiglipImageProcessorPil(size={"height": 96, "width": 96}, resample=resample)
    assert fixed_resize(processor) == (96, 96)
    for image in _images(0):
        ours = preprocess([image], processor)
        reference = processor(images=[image], return_tensors="pt")["pixel_values"]
        assert ours.shape == reference.shape == (1, 3, 96, 96) and ours.dtype == torch.float32
        diff = (ours - reference).abs()
        assert diff.max() <= ONE_STEP + 1e-6, f"{image.size}: max diff {diff.max():.4f}"
        assert diff.mean() < 0.25 * ONE_STEP, f"{image.size}: {float(diff.mean() / ONE_STEP):.0%} of values off by a step"


def test_batch_and_pad_aspect_go_through_the_same_path():
    processor = SiglipImageProcessorPil(size={"height": 64, "width": 64})
    images = _images(1)[:3]
    batch = preprocess(images, processor, "pad")
    assert batch.shape == (3, 3, 64, 64)
    for i, image in enumerate(images):
        assert torch.equal(batch[i:i + 1], preprocess([image], processor, "pad"))
    # padding uses the processor's mean colour, which normalises to 0
    tall = Image.new("RGB", (20, 80), (255, 0, 0))
    padded = preprocess([tall], processor, "pad")[0]
    assert padded[:, :, :4].abs().max() < 0.05 and padded[0, 32, 32] == pytest.approx(1.0, abs=1e-3)


def test_other_processors_are_called_as_they_are():
    clip = CLIPImageProcessorPil(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64})
    assert fixed_resize(clip) is None  # shortest-edge resize + centre crop: not reproduced in torch
    for image in _images(2)[:3]:
        assert torch.equal(preprocess([image], clip), clip(images=[image], return_tensors="pt")["pixel_values"])
