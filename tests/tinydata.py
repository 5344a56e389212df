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


def write_stage1_config(path: Path, tiny_dir: Path, data: Path, images: Path) -> Path:
    """A stage-1 config over the tiny Llama and SigLIP and one data source, every other key at its
    default (train.report_to: [tensorboard] among them)."""
    path.write_text(f"model: {{vision_tower: {tiny_dir}/siglip, llm: {tiny_dir}/llama}}\n"
                    f"data: {{mixture: [{{path: {data}, image_folder: {images}}}]}}\ntrain: {{stage: 1}}\n")
    return path


def write_next_dataset(json_path: Path, images: Path, out_dir: Path, shards: int = 2) -> Path:
    """The rows of ``json_path`` in the hub layout of LLaVA-NeXT-Data (parquet shards under
    ``out_dir/data``, images embedded); returns ``out_dir``, a folder like the hub snapshot."""
    from llava_norm_demo.synth.next_parquet import write_next_layout

    return write_next_layout(json.loads(Path(json_path).read_text()), images, out_dir, shards)


# (has an image, answer tokens) of token_examples' samples; the text-only one with 4 answer tokens is
# supervised from its first token, as a text pretraining row would be.
EXAMPLE_KINDS = [(True, 6), (False, 9), (True, 3), (True, 11), (False, 4), (True, 7)]


def token_examples(config, seed: int = 0) -> list:
    """Random-token training samples for a LlavaNorm model config: a prompt with the image's
    tokens after its first token, then a supervised answer; random pixels at the tower's size."""
    import torch

    from llava_norm.data.collate import Example
    from llava_norm.data.conversation import IGNORE_INDEX

    rng = random.Random(seed)
    vocab, size = config.text_config.vocab_size, config.vision_config.image_size
    out = []
    for image, n_text in EXAMPLE_KINDS:
        prompt = [rng.randrange(10, vocab - 10) for _ in range(rng.randint(2, 5))]
        answer = [rng.randrange(10, vocab - 10) for _ in range(n_text)]
        ids = prompt[:1] + ([config.image_token_id] * config.image_seq_length if image else []) + prompt[1:] + answer
        labels = list(ids) if (image, n_text) == (False, 4) else [IGNORE_INDEX] * (len(ids) - n_text) + answer
        pixels = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
        out.append(Example(ids, labels, pixels if image else None))
    return out
