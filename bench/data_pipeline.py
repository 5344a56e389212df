"""Data-pipeline throughput vs what the GPUs consume: samples/s of our SupervisedDataset + collate.

Owns the measurement behind the ``headroom >= 10x`` target. Each sample is read the way
training reads it: a LLaVA-format row from the synthetic world (``llava_norm_demo.synth``, stage-2
instruction rows, ~10% text-only), its PNG opened and preprocessed by a SigLIP-SO400M-384
image processor (384 x 384, bicubic, mean/std 0.5), the conversation tokenised with a
Llama-3.2-format chat template and masked, and batches collated, through a torch DataLoader
with 1 and 2 worker processes.

Demand is what 8 GPUs take in: 8 x per-device batch / step time. The step time is
``--gpu-step-s`` when you have measured it with bench/gpu_step.py; otherwise it is derived from
gpu_step.py's FLOP model for SigLIP-SO400M + Llama-3.2-3B at the 45% MFU target on an H100
(the fastest the GPUs are meant to run), and the output says so.

    .venv/bin/python bench/data_pipeline.py
    .venv/bin/python bench/data_pipeline.py --samples 400 --workers 1 2 --gpu-step-s 0.31 --gpu-batch 1
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from _harness import REPO_ROOT  # noqa: F401  (puts this checkout on sys.path)
from gpu_step import LLMS, TARGET_MFU, shipped, siglip_so400m_384
from torch.utils.data import DataLoader
from transformers import SiglipImageProcessorPil
from transformers.utils import logging as hf_logging

from llava_norm.config import DataSource
from llava_norm.data.collate import collate
from llava_norm.data.conversation import IMAGE_PLACEHOLDER, ConversationTokenizer, make_prompt_format
from llava_norm.data.dataset import SupervisedDataset
from llava_norm.data.images import open_image, preprocess
from llava_norm.model.builder import load_tokenizer
from llava_norm.plan.flops import train_flops
from llava_norm_demo.tiny import make_tiny
from llava_norm_demo.synth import build_world

TARGET_HEADROOM = 10.0
H100_BF16_TFLOPS = 989.4
N_GPUS = 8


def build_dataset(work: Path, samples: int, image_size: int, max_length: int) -> SupervisedDataset:
    manifest = build_world(work / "world", seed=0, image_size=image_size, n_pretrain=0, n_instruct=samples,
                           n_text=0, n_bench=1)
    corpus = manifest["corpora"]["instruct"]
    make_tiny(work / "tiny", seed=0)
    tokenizer = load_tokenizer(str(work / "tiny" / "llama"))
    tower = siglip_so400m_384()
    encoder = ConversationTokenizer(
        tokenizer, make_prompt_format(tokenizer, "chat", {"date_string": "26 Jul 2024"}),
        tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER), (tower.image_size // tower.patch_size) ** 2)
    # SO400M-384's preprocessor_config: 384 x 384, bicubic, rescale 1/255, mean = std = 0.5.
    processor = SiglipImageProcessorPil(size={"height": tower.image_size, "width": tower.image_size})
    world = work / "world"
    source = DataSource(path=str(world / corpus["path"]), image_folder=str(world / corpus["image_folder"]))
    return SupervisedDataset([source], encoder, processor, max_length)


def throughput(dataset: SupervisedDataset, workers: int, batch: int, pad_id: int) -> tuple[float, float]:
    """(samples/s once the workers run, seconds until the first batch)."""
    loader = DataLoader(dataset, batch_size=batch, num_workers=workers, shuffle=False,
                        collate_fn=lambda examples: collate(examples, pad_id, "right"),
                        persistent_workers=False, prefetch_factor=4 if workers else None)
    start = time.perf_counter()
    iterator = iter(loader)
    first = next(iterator)
    startup = time.perf_counter() - start
    n, t0 = 0, time.perf_counter()
    for batch_ in iterator:
        n += batch_["input_ids"].shape[0]
    del first
    return n / (time.perf_counter() - t0), startup


def stage_breakdown(dataset: SupervisedDataset, n: int) -> dict[str, float]:
    """Milliseconds per image sample spent in each step of ``SupervisedDataset.build``, in this process."""
    rows = [r for r in dataset.rows if r.image][:n]
    spent = {"decode (open_image)": 0.0, "preprocess (data.images)": 0.0, "tokenise + mask": 0.0}
    for row in rows:
        t0 = time.perf_counter()
        image = open_image(row.image)
        t1 = time.perf_counter()
        preprocess([image], dataset.image_processor, dataset.image_aspect)
        t2 = time.perf_counter()
        dataset.encoder.encode(row.messages)
        t3 = time.perf_counter()
        for key, dt in zip(spent, (t1 - t0, t2 - t1, t3 - t2)):
            spent[key] += dt * 1e3 / len(rows)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=300, help="instruction rows in the synthetic corpus")
    parser.add_argument("--image-size", type=int, default=512, help="side of the stored PNGs (LLaVA's are ~500 px)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch", type=int, default=4, help="DataLoader batch size")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--gpu-step-s", type=float, default=None, help="measured stage-2 step time (gpu_step.py)")
    parser.add_argument("--gpu-batch", type=int, default=1, help="per-device batch of that step (paper stage 2: 1)")
    parser.add_argument("--text-tokens", type=int, default=300, help="text tokens per sample in the derived step")
    parser.add_argument("--work-dir", default=None, help="reuse a directory for the world (default: a temp dir)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        work = Path(args.work_dir or tmp)
        dataset = build_dataset(work, args.samples, args.image_size, args.max_length)
        pad_id = dataset.encoder.tokenizer.pad_token_id
        n_image = sum(1 for r in dataset.rows if r.image)
        print(f"{len(dataset)} rows ({n_image} with a {args.image_size}px PNG), SigLIP-384 preprocessing, "
              f"Llama-3.2 chat template, DataLoader batch {args.batch}")
        for stage, ms in stage_breakdown(dataset, 40).items():
            print(f"  {stage:30s} {ms:6.2f} ms per image sample")
        rates = {}
        for workers in args.workers:
            rates[workers], startup = throughput(dataset, workers, args.batch, pad_id)
            print(f"{workers} worker(s): {rates[workers]:7.1f} samples/s (first batch after {startup:.2f} s)")
    if args.gpu_step_s:
        step_s, how = args.gpu_step_s, "measured step time (--gpu-step-s)"
    else:
        vision, text = siglip_so400m_384(), shipped(LLMS["llama-3.2-3b"])
        flops = train_flops(vision, text, 729 + args.text_tokens, args.gpu_batch).total
        step_s = flops / (TARGET_MFU * H100_BF16_TFLOPS * 1e12)
        how = (f"derived: SigLIP-SO400M + Llama-3.2-3B, {729 + args.text_tokens} tokens, {flops / 1e12:.1f} TFLOP "
               f"at {TARGET_MFU:.0%} MFU of an H100 (no GPU step measured yet)")
    demand = N_GPUS * args.gpu_batch / step_s
    print(f"GPU demand: {N_GPUS} GPUs x {args.gpu_batch} sample(s) / {step_s * 1e3:.0f} ms = {demand:.1f} samples/s "
          f"[{how}]")
    per_worker = max(rate / workers for workers, rate in rates.items())  # on a shared 2-core box, the best case
    for workers, rate in rates.items():
        headroom = rate / demand
        needed = TARGET_HEADROOM * demand / per_worker
        verdict = "meets" if headroom >= TARGET_HEADROOM else f"MISSES; ~{needed:.0f} workers in all would meet it"
        print(f"ratio pipeline/demand [{workers} worker(s)]: {headroom:.2f}x ({verdict}, target >= "
              f"{TARGET_HEADROOM:.0f}x)")


if __name__ == "__main__":
    main()
