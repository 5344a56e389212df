"""Synthetic visual world for offline, CPU-only runs of llava-norm.

A seeded, deterministic generator of shape-on-grid images, LLaVA-format training corpora
and mini versions of the nine evaluation benchmarks in their official file layouts.
Entry point: :func:`build_world` (see ``build.py`` for the manifest it returns).

Modules: ``world`` (scene model, sampling, hold-out split, question ground truth),
``render`` (PIL drawing, block font), ``facts`` (text-only knowledge pools),
``corpora`` (captions, instruction conversations, text corpus), ``benchmarks``
(benchmark writers), ``build`` (orchestration, manifest, idempotence).
"""

from llava_norm_demo.synth.build import build_world
from llava_norm_demo.synth.render import render_scene, scene_png
from llava_norm_demo.synth.world import Scene, Shape, sample_scene, split_of

__all__ = ["Scene", "Shape", "build_world", "render_scene", "sample_scene", "scene_png", "split_of"]
