"""The ``llava-norm`` command line: one subcommand per stage of the data flow.

Owns argument parsing only; every subcommand calls into the module that does the work.
"""

from __future__ import annotations

import argparse
import logging
import sys


def _make_tiny(args) -> None:
    from llava_norm.model.tiny import make_tiny

    corpus = None
    if args.world:  # tokenizers trained on the world's own text: shorter sequences in every later stage
        from llava_norm.warmup.lm import world_tokenizer_corpus

        corpus = world_tokenizer_corpus(args.world)
    paths = make_tiny(args.out_dir, seed=args.seed, corpus=corpus)
    for name, path in paths.items():
        print(f"{name}: {path}")


def _train(args) -> None:
    from llava_norm.config import ConfigError, load_config
    from llava_norm.train.run import run_training

    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as error:
        sys.exit(f"config error: {error}")
    run_training(config)


def _synth(args) -> None:
    from llava_norm.synth import build_world

    manifest = build_world(args.out_dir, seed=args.seed)
    print(f"synthetic world in {args.out_dir}: {len(manifest['benchmarks'])} benchmarks, "
          f"{manifest['corpora']['pretrain']['rows']} captions, {manifest['corpora']['instruct']['rows']} instructions")


def _warmup(args) -> None:
    from llava_norm.warmup import REPORT, WarmupConfig, warm_up

    report = warm_up(args.backbones, args.world, args.out,
                     WarmupConfig(seed=args.seed, llms=tuple(args.llms), towers=tuple(args.towers)))
    for name, entry in report["backbones"].items():
        print(f"{name}: held-out loss {entry['before']['loss']:.3f} -> {entry['after']['loss']:.3f}"
              f"{' (reused)' if entry['reused'] else ''}")
    print(f"report: {args.out}/{REPORT}")


def _demo(args) -> None:
    from llava_norm.demo import run_demo

    run_demo()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llava-norm", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="show library warnings and info logs")
    # The `deepspeed` launcher passes --local_rank; the rank itself is read from the environment.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("make-tiny", help="write tiny random SigLIP/CLIP/Llama/Qwen2 backbones (offline)")
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--world", help="train the tokenizers on this synthetic world's text (default: a built-in corpus)")
    p.set_defaults(func=_make_tiny)

    p = sub.add_parser("train", help="run stage 1 or 2 from a YAML config")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=2e-5 train.max_steps=10")
    p.set_defaults(func=_train)

    p = sub.add_parser("synth", help="write the seeded synthetic world: images, corpora, mini benchmarks")
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_synth)

    p = sub.add_parser("warmup", help="pretrain the tiny LLM (causal LM) and SigLIP (sigmoid contrastive) on a world")
    p.add_argument("--backbones", required=True, help="dir written by make-tiny")
    p.add_argument("--world", required=True, help="dir written by synth")
    p.add_argument("--out", required=True, help="warmed backbones go to OUT/<name>, report to OUT/warmup_report.json")
    p.add_argument("--llms", nargs="*", default=["llama"], choices=["llama", "qwen2"])
    p.add_argument("--towers", nargs="*", default=["siglip"], choices=["siglip"])
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_warmup)

    p = sub.add_parser("demo", help="the offline tiny pipeline (writes under runs/tiny)")
    p.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    logging.getLogger("llava_norm").setLevel(logging.INFO)
    args.func(args)


if __name__ == "__main__":
    main()
