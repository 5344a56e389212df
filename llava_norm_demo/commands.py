"""The guest wing's ``llava-norm`` subcommands: make-tiny, synth, warmup, demo and ablation.

Owns their arguments only. ``register`` is the ``llava_norm.commands`` entry point, so the core
command line lists these subcommands without importing this package by name.
"""

from __future__ import annotations

from llava_norm.worker import frozen_imports


def _make_tiny(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm_demo.tiny import make_tiny
    from llava_norm_demo.warmup.lm import world_tokenizer_corpus

    # Tokenizers trained on the world's own text give shorter sequences in every later stage.
    corpus = world_tokenizer_corpus(args.world) if args.world else None
    for name, path in make_tiny(args.out_dir, seed=args.seed, corpus=corpus).items():
        print(f"{name}: {path}")


def _synth(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm_demo.synth import build_world
    from llava_norm_demo.synth.build import DEMO_BENCH_ITEMS

    n_bench = DEMO_BENCH_ITEMS if args.n_bench is None else args.n_bench
    manifest = build_world(args.out_dir, seed=args.seed, n_bench=n_bench)
    print(f"synthetic world in {args.out_dir}: {len(manifest['benchmarks'])} benchmarks, "
          f"{manifest['corpora']['pretrain']['rows']} captions, {manifest['corpora']['instruct']['rows']} instructions")


def _warmup(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm_demo.warmup import REPORT, WarmupConfig, warm_up

    report = warm_up(args.backbones, args.world, args.out,
                     WarmupConfig(seed=args.seed, llms=tuple(args.llms), towers=tuple(args.towers)))
    for name, entry in report["backbones"].items():
        print(f"{name}: held-out loss {entry['before']['loss']:.3f} -> {entry['after']['loss']:.3f}"
              f"{' (reused)' if entry['reused'] else ''}")
    print(f"report: {args.out}/{REPORT}")


def _demo(args) -> None:
    with frozen_imports():
        # lazy: start-up; a subcommand loads only the stages it runs
        from llava_norm_demo.driver import run_demo

    run_demo(args.root, args.profile, args.code_counts)


def _ablation(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.sweep import parse_seeds
    from llava_norm_demo.ablation import run_ablation

    try:
        seeds = tuple(parse_seeds(args.seeds))
        arms = tuple(args.arms.split(",")) if args.arms != "all" else None
        print(run_ablation(args.root, seeds, arms=arms, code_counts=args.code_counts).read_text())
    except (OSError, ValueError, RuntimeError) as error:  # OSError: a file where a folder goes, say
        raise SystemExit(f"ablation: {error}") from None


def register(sub) -> None:
    """Add the guest wing's subcommands to ``llava-norm``'s subparsers."""
    p = sub.add_parser("make-tiny", help="write tiny random SigLIP/CLIP/Llama/Qwen2/Qwen3 backbones (offline)")
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--world", help="train the tokenizers on this synthetic world's text (default: a built-in corpus)")
    p.set_defaults(func=_make_tiny)

    p = sub.add_parser("synth", help="write the seeded synthetic world: images, corpora, mini benchmarks")
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-bench", type=int, help="items per mini benchmark (default: as many as the demo's world has)")
    p.set_defaults(func=_synth)

    p = sub.add_parser("warmup", help="pretrain the tiny LLM (causal LM) and SigLIP (sigmoid contrastive) on a world")
    p.add_argument("--backbones", required=True, help="dir written by make-tiny")
    p.add_argument("--world", required=True, help="dir written by synth")
    p.add_argument("--out", required=True, help="warmed backbones go to OUT/<name>, report to OUT/warmup_report.json")
    p.add_argument("--llms", nargs="*", default=["llama"], choices=["llama", "qwen2"])
    p.add_argument("--towers", nargs="*", default=["siglip"], choices=["siglip"])
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_warmup)

    p = sub.add_parser("demo", help="the whole pipeline at tiny scale, offline: writes ROOT/demo/REPORT.md")
    p.add_argument("--root", default="runs", help="where the world, backbones and runs go (default: runs)")
    p.add_argument("--profile", default="full", choices=["full", "smoke"],
                   help="smoke: the same steps with a handful of training steps (what the test suite runs)")
    p.add_argument("--code-counts", action="store_true",
                   help="rerun steps recorded with another code version or library versions (default: note them)")
    p.set_defaults(func=_demo)

    p = sub.add_parser("ablation", help="the demo's world, every arm x 3 seeds, and the table with intervals: "
                                        "writes ROOT/ablation/results_stats.md, .csv and results_forest.png")
    p.add_argument("--root", default="runs", help="where the world, backbones and runs go (default: runs)")
    p.add_argument("--seeds", default="0,1,2", help="training seeds (default 0,1,2)")
    p.add_argument("--arms", default="all", help="all, or a,b,c (the baseline 'none' is always included)")
    p.add_argument("--code-counts", action="store_true",
                   help="rerun steps recorded with another code version or library versions (default: note them)")
    p.set_defaults(func=_ablation)
