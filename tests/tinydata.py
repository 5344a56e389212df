"""Small LLaVA-format datasets written by the tests (coloured squares with captions and Q&A)."""

import json
import random
from pathlib import Path

from PIL import Image

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20)}


def write_dataset(root: Path, n: int = 32, seed: int = 0, text_only_every: int = 0) -> tuple[Path, Path]:
    """Returns (json_path, image_folder). Captions name the colour of the image."""
    rng = random.Random(seed)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        colour = rng.choice(sorted(COLOURS))
        if text_only_every and i % text_only_every == 0:
            rows.append({"id": f"t{i}", "conversations": [
                {"from": "human", "value": f"Name a colour like {colour}."},
                {"from": "gpt", "value": f"{colour} is a colour."}]})
            continue
        name = f"{i:04d}.png"
        Image.new("RGB", (40, 40), COLOURS[colour]).save(images / name)
        rows.append({"id": f"s{i}", "image": name, "conversations": [
            {"from": "human", "value": "<image>\nWhat colour is the image?"},
            {"from": "gpt", "value": f"The image is {colour}."}]})
    path = root / "data.json"
    path.write_text(json.dumps(rows))
    return path, images
