"""``make demo``: the pipeline as far as it exists, offline and at tiny scale.

Owns the demo's sequence: synthetic world -> tiny backbones (tokenizers trained on the world's
text) -> backbone warm-up (causal-LM pretraining of the LLM, sigmoid
contrastive pretraining of SigLIP; ``llava_norm.warmup``) -> stage 1 and stage 2 from the
warmed backbones for the baseline arm and the text-norm + GWC arm (DeepSpeed ZeRO-2, 2 CPU
processes) -> a few greedy answers on held-out images. Completed steps are reused. Benchmarks, diagnostics and the
report join when the evaluation and analysis stages land; nothing here is a placeholder
number: it prints only what the runs measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
ARMS = ("none", "ln_textnorm_gwc")
SEED = 0


def _run(command: list[str]) -> None:
    env = {**os.environ, "GPUS_PER_NODE": os.environ.get("GPUS_PER_NODE", "2"), "OMP_NUM_THREADS": "1",
           "PYTHON": sys.executable}
    subprocess.run(command, cwd=REPO, env=env, check=True)


def run_demo() -> None:
    from llava_norm.synth import build_world
    from llava_norm.warmup import warm_up

    tiny = REPO / "runs/tiny"
    steps = [("synthetic world", None), ("tiny backbones", None), ("warm-up", None)]
    steps += [(f"{arm} stage {stage}", (arm, stage)) for arm in ARMS for stage in (1, 2)]
    bar = tqdm(steps, desc="demo", unit="step")
    for name, job in bar:
        bar.set_postfix_str(name)
        if name == "synthetic world":
            build_world(tiny / "world", seed=SEED)
        elif name == "tiny backbones":
            _backbones(tiny)
        elif name == "warm-up":
            warm_up(tiny / "backbones", tiny / "world", tiny / "warm")  # configs/_base/tiny.yaml reads warm/
        else:
            arm, stage = job
            if not (tiny / arm / f"stage{stage}" / "train_summary.json").exists():
                script = "scripts/pretrain.sh" if stage == 1 else "scripts/finetune.sh"
                _run(["bash", script, f"configs/tiny/{arm}/stage{stage}.yaml",
                      f"train.output_dir=runs/tiny/{arm}/stage{stage}",
                      *([f"model.pretrained_projector=runs/tiny/{arm}/stage1/projector.safetensors"] if stage == 2 else [])])
    _summarise(tiny)


def _backbones(tiny: Path) -> None:
    """Tiny backbones whose tokenizers are trained on this world's text; rebuilt when the
    world or the sizes change (a stamp records what they were built from)."""
    from dataclasses import asdict

    from llava_norm.model.tiny import TinySizes, make_tiny
    from llava_norm.warmup.lm import world_tokenizer_corpus
    from llava_norm.warmup.loop import file_digest

    stamp = tiny / "backbones/built_from.json"
    wanted = {"seed": SEED, "sizes": asdict(TinySizes()), "world_manifest_sha256": file_digest(tiny / "world/manifest.json")}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return
    make_tiny(tiny / "backbones", seed=SEED, corpus=world_tokenizer_corpus(tiny / "world"))
    stamp.write_text(json.dumps(wanted, indent=1) + "\n")


def _summarise(tiny: Path) -> None:
    from llava_norm.inference import Predictor, Prompt
    from llava_norm.model.builder import load_bundle
    from llava_norm.evaluation.benchmarks import get_benchmark

    items = get_benchmark("pope").load(tiny / "world/benchmarks/pope", limit=6)
    for arm in ARMS:
        summary = json.loads((tiny / arm / "stage2/train_summary.json").read_text())
        losses = [e["loss"] for e in summary["log_history"] if "loss" in e]
        print(f"\n[{arm}] stage-2 loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")
        predictor = Predictor(load_bundle(tiny / arm / "stage2/model"), template_kwargs={"date_string": "26 Jul 2024"})
        replies = predictor.generate([Prompt(i.prompt, i.image) for i in items], max_new_tokens=8)
        for item, reply in zip(items, replies):
            print(f"  Q: {item.prompt.splitlines()[0]!r}  gold={item.meta.get('answer')!r}  model={reply!r}")
    print("\nBenchmarks, diagnostics and runs/demo/REPORT.md arrive with the evaluation and analysis stages.")
