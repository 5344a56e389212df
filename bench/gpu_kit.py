"""The GPU kit: every GPU figure the repo targets, in one command, into one results file.

Owns the order and time limits of the GPU measurements and the file they land in. Parts:
- ``gpu_step``: bench/gpu_step.py at both real shapes (SigLIP-SO400M + Llama-3.2-3B and
  + Qwen2.5-7B), sdpa, activation checkpointing off and on: MFU, tokens/s, peak memory, and
  ``llava-norm plan``'s peak beside each;
- ``fused_loss``: bench/fused_loss.py on the GPU in bf16 (Liger's kernel where installed);
- ``packing``: bench/packing.py (the packing plan; CPU work, here so one file has every figure);
- ``train``: 20 optimizer steps of stage 2 under the real trainer (``llava-norm train``, DeepSpeed
  ZeRO-2, one process) on the one-GPU recipe's real-width pair (SigLIP-base-patch16-224 +
  Qwen2.5-0.5B-Instruct, random weights, configs/recipe-1gpu's batch settings) over the demo's
  synthetic world: tokens/s and peak memory from the trainer's own log, against the plan.

    make bench-gpu                                   # = bash bench/gpu_kit.sh: every part (ARGS="--parts ...")
    bash bench/gpu_kit.sh --parts gpu_step           # one part (the device tool: < 10 min a call)
    .venv/bin/python bench/gpu_kit.py --toy          # CPU, tiny shapes: the test suite's smoke run

Results: ``OUT/gpu_kit.md`` (the device, versions, each part's command, output and wall time)
and ``OUT/train_plan.json``; paste the figures into bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _harness import REPO_ROOT

BENCH = Path(__file__).resolve().parent
PARTS = ("gpu_step", "fused_loss", "packing", "train")
LIMITS_S = {"gpu_step": 420, "fused_loss": 180, "packing": 60, "train": 300}
TRAIN_STEPS = 20


def bench_command(part: str, toy: bool) -> list[str]:
    py = [sys.executable]
    if part == "gpu_step":
        return py + [str(BENCH / "gpu_step.py")] + (["--toy"] if toy else [])
    if part == "fused_loss":
        toy_args = ["--tokens", "64", "--hidden", "32", "--vocabs", "512", "--repeats", "1"]
        return py + [str(BENCH / "fused_loss.py")] + (toy_args if toy else ["--device", "cuda", "--dtype", "bf16",
                                                                          "--repeats", "10"])
    if part == "packing":
        return py + [str(BENCH / "packing.py")] + (["--samples", "2000", "--budgets", "4096"] if toy else [])
    raise ValueError(part)


def run(command: list[str], limit_s: int, log: Path) -> tuple[int, float, str]:
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=limit_s)
        code, output = done.returncode, done.stdout + ("" if done.returncode == 0 else done.stderr[-4000:])
    except subprocess.TimeoutExpired as error:
        code, output = 124, f"{(error.stdout or b'').decode() if isinstance(error.stdout, bytes) else error.stdout or ''}"
        output += f"\n(stopped at its {limit_s} s limit)"
    log.write_text(output)
    return code, time.perf_counter() - start, output


def train_setup(work: Path, toy: bool) -> Path:
    """Backbones, the synthetic world and a stage-2 YAML for the training part; returns the YAML."""
    from llava_norm_demo.synth import build_world

    world = work / "world"
    if not (world / "manifest.json").is_file():
        build_world(world, n_pretrain=0, n_instruct=400, n_text=0, n_bench=0)
    if toy:
        from llava_norm_demo.tiny import make_tiny

        if not (work / "tiny" / "qwen2").is_dir():
            make_tiny(work / "tiny", seed=0)
        vision, llm, base = work / "tiny" / "siglip", work / "tiny" / "qwen2", "tiny_stage2.yaml"
        train = "max_steps: 2, per_device_batch_size: 2, grad_accum: 1"
    else:
        from real_width import write_backbone

        vision = work / "siglip-base-patch16-224"
        llm = work / "qwen2.5-0.5b-instruct"
        if not (vision / "config.json").is_file():
            write_backbone("google/siglip-base-patch16-224", vision)
        if not (llm / "config.json").is_file():
            write_backbone("Qwen/Qwen2.5-0.5B-Instruct", llm)
        base, train = "recipe_1gpu_stage2.yaml", f"max_steps: {TRAIN_STEPS}"
    config = work / "stage2.yaml"
    config.write_text(
        f"base: [{REPO_ROOT}/configs/_base/{base}]\n"
        f"model: {{vision_tower: {vision}, llm: {llm}, norm_alignment: ln_textnorm_gwc}}\n"
        f"data: {{mixture: [{{path: {world}/instruct/synth_instruct.json, image_folder: {world}/images}}], "
        f"num_workers: 2}}\n"
        f"train: {{output_dir: {work}/run, {train}, save_steps: 100000, report_to: [], restart: true, "
        f"deepspeed: {REPO_ROOT}/configs/deepspeed/zero2.json}}\n")
    return config


def train_figures(config: Path, out: Path) -> str:
    """Tokens/s and peak memory from the run's own log, against the plan for the same config."""
    from llava_norm.config import load_config
    from llava_norm.plan import make_plan

    run_dir = Path(load_config(config, check_paths=False).train.output_dir)
    history = json.loads((run_dir / "train_summary.json").read_text())["log_history"]
    steps = [h for h in history if "tokens_per_second" in h]
    later = steps[3:] or steps  # the first steps carry warm-up (kernel choice, the allocator's growth)
    lines = [f"steps logged: {len(steps)}; tokens/s median over steps {len(steps) - len(later) + 1}-{len(steps)}: "
             f"{statistics.median(h['tokens_per_second'] for h in later):,.0f}"]
    peaks = [h["peak_memory_gib"] for h in steps if "peak_memory_gib" in h]
    import torch

    memory = torch.cuda.get_device_properties(0).total_memory / 2 ** 30 if torch.cuda.is_available() else None
    # rows are padded to their batch's longest, not to max_length: plan at the widest batch seen
    longest = max(h.get("longest_row", 0) for h in steps)
    plan = make_plan(load_config(config, check_paths=False), 1, 1, memory, seq_len=longest, alternatives=False)
    planned = plan.peak() / 2 ** 30
    lines.append(f"widest micro-batch: {plan.batch} rows x {longest} tokens")
    (out / "train_plan.json").write_text(json.dumps({"planned_peak_gib": planned, "measured_peak_gib": max(peaks)
                                                     if peaks else None, "longest_row": longest}, indent=2))
    if peaks:
        lines.append(f"peak memory (torch.cuda.max_memory_allocated): {max(peaks):.2f} GiB; plan {planned:.2f} GiB "
                     f"({max(peaks) / planned - 1:+.1%})")
    else:
        lines.append(f"peak memory: not measured (no CUDA); plan {planned:.3f} GiB")
    return "\n".join(lines)


def environment() -> str:
    import torch
    import transformers

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.machine()})"
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    try:
        import deepspeed

        versions += f", deepspeed {deepspeed.__version__}"
    except ImportError:
        versions += ", deepspeed not installed"
    return f"device: {device}; {versions}; python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--out", default=str(REPO_ROOT / "runs" / "gpu_kit"))
    parser.add_argument("--toy", action="store_true", help="tiny shapes on CPU: a smoke run of the whole kit")
    args = parser.parse_args()
    import torch

    if not args.toy and not torch.cuda.is_available():
        parser.error("no CUDA device (use --toy for the CPU smoke run)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = out / "gpu_kit.md"
    with report.open("a") as md:
        md.write(f"# GPU kit, {time.strftime('%Y-%m-%d %H:%M')}{' (toy)' if args.toy else ''}\n\n{environment()}\n\n")
    failed = []
    for part in args.parts:
        if part == "train":
            config = train_setup(out / "train", args.toy)
            command = [sys.executable, "-m", "llava_norm.cli", "train", str(config)]
        else:
            command = bench_command(part, args.toy)
        code, seconds, output = run(command, LIMITS_S[part], out / f"{part}.log")
        if part == "train" and code == 0:
            output = train_figures(config, out)
        summary = f"## {part}: {'ok' if code == 0 else f'FAILED (exit {code})'}, {seconds:.0f} s\n\n" \
                  f"    {' '.join(Path(c).name if i < 2 else c for i, c in enumerate(command))}\n\n" + \
                  "".join(f"    {line}\n" for line in output.strip().splitlines()[-40:]) + "\n"
        with report.open("a") as md:
            md.write(summary)
        print(summary, flush=True)
        if code:
            failed.append(part)
    print(f"results: {report}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
