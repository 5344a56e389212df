"""``make demo``: the whole paper pipeline at tiny scale, offline, on CPU.

Owns the demo's sequence and its two profiles (``full`` for ``make demo``, ``smoke`` for the
test suite: same code path, a handful of steps):

synthetic world -> tiny backbones (tokenizers trained on the world's text) -> backbone warm-up
(causal-LM pretraining of the LLM, sigmoid contrastive pretraining of SigLIP) -> for the
baseline arm and the text-norm + GWC arm: stage 1 -> stage 2 -> evaluation on the nine mini
benchmarks (``llava_norm.pipeline``, the code behind ``scripts/pipeline.sh``) -> the
diagnostics -> ``<root>/demo/REPORT.md`` (``llava_norm_demo.report``).

Every path is passed to the configs as an override, so the demo runs under any root. Every
step is reused only when its provenance record matches what it would compute now (the world,
backbones and warm-up through ``pipeline.recorded_step``, the arms through the pipeline's own
steps), so a second run only rewrites the report.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from llava_norm_demo.report import ARMS, SEED, diagnostics_step, write_report
from llava_norm_demo.tiny import TinySizes, make_tiny
from llava_norm.chain_launch import REPO
from llava_norm.pipeline import PipelineConfig, Step, arm_steps, recorded_step, run_steps
from llava_norm.provenance import Record, cpu_kernels, make_record
from llava_norm_demo.synth import build_world
from llava_norm_demo.synth.benchmarks import FOLDER as BENCHMARK_FOLDER
from llava_norm_demo.synth.build import CORPUS_PATHS, DEMO_BENCH_ITEMS, IMAGE_FOLDER, MANIFEST
from llava_norm_demo.warmup import warm_up
from llava_norm_demo.warmup.lm import world_tokenizer_corpus
from llava_norm_demo.warmup.loop import LoopConfig
from llava_norm_demo.warmup.run import WarmupConfig



def usable_cores() -> int:
    """The cores this process may run on (the affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class DemoProfile:
    name: str
    world: dict = field(default_factory=dict)  # build_world keyword arguments
    warmup: WarmupConfig = WarmupConfig(seed=SEED)
    stage1: tuple[str, ...] = ()  # config overrides on top of configs/tiny/<arm>/stage1.yaml
    stage2: tuple[str, ...] = ()
    eval_args: tuple[str, ...] = ()
    eval_limit: int | None = None  # items per benchmark (None: all), for the benchmarks and the diagnostics
    # One DeepSpeed ZeRO-2 process per stage, with every core as its intra-op threads: on 2 cores
    # a stage-2 step took 0.11 s this way against 0.17 s as two single-threaded ZeRO-2 processes,
    # whose gradient all-reduce outweighs the tiny model's compute. The test suite keeps the
    # multi-process path (tests/test_training.py, tests/test_resume.py).
    processes: int = 1
    threads: int = field(default_factory=lambda: min(4, usable_cores()))
    analysis_images: int = 8


FULL = DemoProfile("full", world=dict(n_bench=DEMO_BENCH_ITEMS))
SMOKE = DemoProfile(
    "smoke",
    world=dict(n_pretrain=48, n_instruct=24, n_text=40, n_bench=3, bench_sizes={"pope": 2, "mmbench_en_dev": 2}),
    warmup=WarmupConfig(seed=SEED, lm_block_tokens=64, lm=LoopConfig(steps=2, batch_size=4, lr=3e-3, warmup_steps=1),
                        vision=LoopConfig(steps=2, batch_size=2, lr=1e-3, warmup_steps=1)),
    stage1=("train.max_steps=2", "train.per_device_batch_size=4", "train.deepspeed=null", "train.save_steps=1"),
    stage2=("train.max_steps=2", "train.per_device_batch_size=4", "train.deepspeed=null", "train.save_steps=1"),
    eval_args=("--max-new-tokens-cap=8",),
    eval_limit=2,
    threads=1,
    analysis_images=2,
)
PROFILES = {p.name: p for p in (FULL, SMOKE)}


@dataclass
class DemoPaths:
    root: Path

    @property
    def world(self) -> Path:
        return self.root / "tiny" / "world"

    @property
    def backbones(self) -> Path:
        return self.root / "tiny" / "backbones"

    @property
    def warm(self) -> Path:
        return self.root / "tiny" / "warm"

    @property
    def images(self) -> Path:
        return self.world / IMAGE_FOLDER

    @property
    def benchmarks(self) -> Path:
        """The world's mini benchmarks: the demo's evaluation --data-root."""
        return self.world / BENCHMARK_FOLDER

    @property
    def demo(self) -> Path:
        return self.root / "demo"

    def run(self, arm: str, stage: int) -> Path:
        return self.demo / arm / f"stage{stage}"

    def model(self, arm: str, stage: int) -> Path:
        """The model a training stage saved (``<run>/model``)."""
        return self.run(arm, stage) / "model"


def _world_step(paths: DemoPaths, profile: DemoProfile, code_counts: bool) -> Step:
    def expected() -> Record:
        return make_record("world", {"build_world": dict(profile.world)}, {}, seed=SEED)

    return recorded_step("synthetic world", paths.world, expected,
                         lambda: build_world(paths.world, seed=SEED, **profile.world), code_counts)


def _backbones_step(paths: DemoPaths, code_counts: bool) -> Step:
    """Tiny backbones whose tokenizers are trained on this world's text: rebuilt when the world
    or the sizes change."""
    def expected() -> Record:
        return make_record("backbones", {"sizes": asdict(TinySizes())}, {"world": paths.world / MANIFEST}, seed=SEED)

    return recorded_step("tiny backbones", paths.backbones, expected,
                         lambda: make_tiny(paths.backbones, seed=SEED, corpus=world_tokenizer_corpus(paths.world)),
                         code_counts)


def _warmup_step(paths: DemoPaths, profile: DemoProfile, code_counts: bool) -> Step:
    def expected() -> Record:
        return make_record("warm-up", asdict(profile.warmup.with_seed()),
                           {"backbones": paths.backbones, "world": paths.world / MANIFEST}, seed=profile.warmup.seed)

    return recorded_step("backbone warm-up", paths.warm, expected,
                         lambda: warm_up(paths.backbones, paths.world, paths.warm, profile.warmup), code_counts)


def shared_steps(paths: DemoPaths, profile: DemoProfile, code_counts: bool = False) -> list[Step]:
    """World, backbones and warm-up: the steps the demo and the ablation share (and reuse)."""
    return [_world_step(paths, profile, code_counts), _backbones_step(paths, code_counts),
            _warmup_step(paths, profile, code_counts)]


def pipeline_config(paths: DemoPaths, profile: DemoProfile) -> PipelineConfig:
    backbones = [f"model.vision_tower={paths.warm / 'siglip'}", f"model.llm={paths.warm / 'llama'}"]

    def mixture(corpus: str) -> str:  # stage 1 from LLaVA JSON (as the 558K), stage 2 from NeXT parquet shards
        folder = "" if corpus.endswith("_next") else f", image_folder: {paths.images}"
        return f"data.mixture=[{{path: {paths.world / CORPUS_PATHS[corpus]}{folder}}}]"
    return PipelineConfig(
        arms=[str(REPO / "configs" / "tiny" / arm) for arm in ARMS],
        runs_dir=str(paths.demo),
        data_root=str(paths.benchmarks),
        stage1_overrides=[*backbones, mixture("pretrain"), *profile.stage1],
        stage2_overrides=[*backbones, mixture("instruct_next"), *profile.stage2],
        eval_args=[*([f"--limit={profile.eval_limit}"] if profile.eval_limit is not None else []), *profile.eval_args],
        env={"GPUS_PER_NODE": str(profile.processes), "OMP_NUM_THREADS": str(profile.threads),
             "TOKENIZERS_PARALLELISM": "false"},
    )


def plan_demo(paths: DemoPaths, profile: DemoProfile, code_counts: bool = False) -> list[Step]:
    config = replace(pipeline_config(paths, profile), code_counts=code_counts)
    steps = shared_steps(paths, profile, code_counts)
    for arm in config.arms:
        steps += arm_steps(config, arm)
    return steps + [diagnostics_step(paths, profile, code_counts)]


def machine_facts(threads: int) -> dict:
    """What a computed step ran on: float kernels differ by CPU and thread count, and so do the
    last bits of everything it computed."""
    import torch

    info = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
             if line.startswith("model name")] if info.is_file() else []
    return {"cpu": names[0] if names else platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "cpu_kernels": cpu_kernels(), "threads": threads,
            "warmup_threads": torch.get_num_threads()}


def run_demo(root: str | Path = REPO / "runs", profile: str = "full", code_counts: bool = False) -> Path:
    """Run (or resume) the demo under ``root``; returns the path of REPORT.md. ``code_counts``:
    a step recorded with another code or library version reruns (default: it is noted)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar for the demo, not one per weight file
    paths = DemoPaths(Path(root).resolve())
    paths.demo.mkdir(parents=True, exist_ok=True)
    chosen = PROFILES[profile]
    start = time.perf_counter()
    record = run_steps(plan_demo(paths, chosen, code_counts), desc=f"demo ({profile})")
    facts = machine_facts(chosen.threads)
    timings = {"profile": profile, "total_s": time.perf_counter() - start,
               "steps": [{"step": name, "status": status, "seconds": round(seconds, 1),
                          **({"machine": facts} if status == "done" else {})}
                         for name, status, seconds in record]}
    (paths.demo / "timings.json").write_text(json.dumps(timings, indent=1) + "\n")

    report = write_report(paths, chosen, timings)
    print(f"\nreport: {report}")
    return report
