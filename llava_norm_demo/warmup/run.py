"""``warm_up``: warm the tiny backbones on a synthetic world, idempotently, with a JSON report.

Owns the default warm-up settings (``WarmupConfig``), which backbones are warmed (the LLMs
by causal-LM pretraining, the SigLIP tower by sigmoid contrastive pretraining; CLIP is not
warmed), the fingerprint that decides whether a finished warm-up can be reused (settings +
source weights + the world's manifest) and ``out/warmup_report.json``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from transformers.utils import SAFE_WEIGHTS_NAME

from llava_norm.config_schema import TEMPLATE_KWARGS
from llava_norm_demo.synth.build import MANIFEST
from llava_norm_demo.warmup.lm import warm_lm, world_lm_documents
from llava_norm_demo.warmup.loop import LoopConfig, Output, file_digest
from llava_norm_demo.warmup.vision import warm_siglip, world_caption_pairs

log = logging.getLogger(__name__)
REPORT = "warmup_report.json"
LLMS = ("llama", "qwen2")
TOWERS = ("siglip",)


@dataclass(frozen=True)
class WarmupConfig:
    """What to warm and how long. Defaults are the demo's, sized for 2 CPU cores (the LM takes
    most of the time: `make demo`'s report has the steps' seconds)."""

    seed: int = 0
    llms: tuple[str, ...] = ("llama",)
    towers: tuple[str, ...] = TOWERS
    # The LM's length decides the text benchmarks (on an earlier world the warmed LLM alone scored
    # 53% on held-out HellaSwag items after 600 steps, 76% after 900; chance 25%). 600 is what the
    # demo's 5-minute budget leaves; `llava-norm warmup` users can ask for more.
    lm: LoopConfig = LoopConfig(steps=600, batch_size=16, lr=3e-3)
    lm_block_tokens: int = 256
    vision: LoopConfig = LoopConfig(steps=150, batch_size=64, lr=1e-3)
    vision_feature_layer: int = -2  # the hidden state LLaVA reads; its norm goes into the report
    template_kwargs: dict = field(default_factory=lambda: dict(TEMPLATE_KWARGS))

    def __post_init__(self) -> None:
        unknown = sorted(set(self.llms) - set(LLMS)) + sorted(set(self.towers) - set(TOWERS))
        if unknown:
            raise ValueError(f"cannot warm up {unknown}: LLMs are {list(LLMS)}, towers {list(TOWERS)}")

    def with_seed(self) -> "WarmupConfig":
        """The loops draw from the run's seed (one seed governs the whole warm-up)."""
        return replace(self, lm=replace(self.lm, seed=self.seed), vision=replace(self.vision, seed=self.seed))


def _source_weights(path: Path) -> Path:
    weights = path / SAFE_WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: no backbone here; run `llava-norm make-tiny` first")
    return weights


def warm_up(backbones: str | Path, world: str | Path, out: str | Path, config: WarmupConfig = WarmupConfig()) -> dict:
    """Warm ``backbones/<name>`` into ``out/<name>`` for every configured backbone; returns the
    report (also written to ``out/warmup_report.json``). Finished backbones are reused."""
    backbones, world, out = Path(backbones), Path(world), Path(out)
    config = config.with_seed()
    manifest = world / MANIFEST
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest}: no synthetic world here; run `llava-norm synth` first")
    world_digest = file_digest(manifest)
    report: dict = {"seed": config.seed, "world": str(world), "backbones": {}}
    for name in (*config.llms, *config.towers):
        source = backbones / name
        loop = config.lm if name in config.llms else config.vision
        settings = {"backbone": name, "loop": loop.to_dict(), "world_manifest_sha256": world_digest,
                    "source_sha256": file_digest(_source_weights(source)),
                    **({"block_tokens": config.lm_block_tokens, "template_kwargs": config.template_kwargs}
                       if name in config.llms else {"feature_layer": config.vision_feature_layer})}
        output = Output(out / name, settings)
        done = output.completed_report()
        if done is not None:
            log.info("warm-up of %s: reusing %s", name, output.path)
            report["backbones"][name] = {**done, "reused": True}
            continue
        staging = output.begin()
        if name in config.llms:
            from transformers import AutoTokenizer

            data = world_lm_documents(world, config.template_kwargs, AutoTokenizer.from_pretrained(source))
            result = warm_lm(source, staging, data, loop, config.lm_block_tokens)
        else:
            train, heldout = world_caption_pairs(world)
            result = warm_siglip(source, staging, train, heldout, loop, config.vision_feature_layer)
        output.commit(result)
        report["backbones"][name] = {**result, "reused": False}
    report["config"] = asdict(config)
    (out / REPORT).write_text(json.dumps(report, indent=1) + "\n")
    return report
