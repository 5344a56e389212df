"""``llava-norm analyze <what>``: argument parsing for the diagnostics, nothing else.

Owns the ``analyze`` subcommands; ``register(parser)`` adds them under the ``analyze`` parser that
``llava_norm/cli.py`` creates. Heavy imports (torch, transformers, matplotlib) happen only
inside the handlers, so building the top-level parser stays fast.
"""

from __future__ import annotations

import argparse

from llava_norm.config_schema import PROMPT_FORMATS
from llava_norm.evaluation.arguments import positive_int

DEFAULT_OUT = "runs/analysis"


def _samples(args):
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.analysis.samples import load_samples

    samples = load_samples(args.samples, args.limit, args.image_folder)
    if args.prompt:
        samples.prompts = list(args.prompt)
    return samples


def _interface(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.analysis.common import analysis_device, labeled_inputs, load_analysis_bundle, parse_labeled
    from llava_norm.analysis.interface import backbone_interface_norms, checkpoint_interface_norms, interface_norms

    if not args.checkpoint and not args.vision:
        raise SystemExit("interface-norms: give --checkpoint (repeatable) and/or --vision with --llm")
    if bool(args.vision) != bool(args.llm):
        raise SystemExit("interface-norms: --vision and --llm go together")
    samples = _samples(args)
    rows, checkpoints = [], parse_labeled(args.checkpoint)
    for item in checkpoints:
        bundle = load_analysis_bundle(item.path, analysis_device(args.device))
        rows.append(checkpoint_interface_norms(bundle, samples, item.label, args.batch_size))
        del bundle
    if args.vision:
        rows.append(backbone_interface_norms(args.vision, args.llm, samples, args.vision_feature_layer,
                                             batch_size=args.batch_size, device=args.device))
    backbones = {"vision": args.vision, "llm": args.llm} if args.vision else {}
    _done(interface_norms(rows, samples, args.out, {**labeled_inputs(checkpoints), **backbones}), args.out)


def _top_rows(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.analysis.interface import top_norm_result

    if bool(args.checkpoint) == bool(args.llm):
        raise SystemExit("top-norm-rows: give exactly one of --checkpoint or --llm")
    if args.checkpoint:
        # lazy: start-up; a subcommand loads only the stages it runs
        from llava_norm.analysis.common import load_analysis_bundle

        bundle = load_analysis_bundle(args.checkpoint, device=None)
        weight, tokenizer, label = bundle.model.get_input_embeddings().weight, bundle.tokenizer, args.checkpoint
    else:
        from transformers import AutoModelForCausalLM

        # lazy: start-up; a subcommand loads only the stages it runs
        from llava_norm.model.builder import load_tokenizer

        weight = AutoModelForCausalLM.from_pretrained(args.llm).get_input_embeddings().weight
        tokenizer, label = load_tokenizer(args.llm), args.llm
    _done(top_norm_result(weight, tokenizer, label, args.k, args.out, {label: label}), args.out)


def _layers(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.analysis.common import parse_labeled
    from llava_norm.analysis.layers import layer_curves

    _done(layer_curves(parse_labeled(args.checkpoint), _samples(args), args.out, args.batch_size,
                       args.prompt_format, args.device), args.out)


def _gains(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.analysis.common import parse_labeled
    from llava_norm.analysis.gains import gain_stats

    _done(gain_stats(parse_labeled(args.checkpoint), args.out), args.out)


def _dynamics(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.analysis.layers import dynamics

    _done(dynamics(args.run_dir, _samples(args), args.out, args.batch_size, args.prompt_format,
                   not args.no_final, args.device), args.out)


def _gradients(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.analysis.gradients import arm_bundles, gradient_flow, training_batch
    from llava_norm.analysis.common import (analysis_device, labeled_inputs, load_analysis_bundle, parse_labeled,
                                            prompt_settings)

    if bool(args.checkpoint) == bool(args.vision and args.llm):
        raise SystemExit("gradient-flow: give either --vision and --llm (fresh builds per arm) or --checkpoint")
    read = {"data": args.data, "image_folder": args.image_folder}
    if args.checkpoint:
        checkpoints = parse_labeled(args.checkpoint)
        read.update(labeled_inputs(checkpoints))
        models = ((m.label, load_analysis_bundle(m.path, analysis_device(args.device))) for m in checkpoints)
        # One batch is shared by every model: it is built as the first checkpoint's run trained.
        settings = prompt_settings(checkpoints[0].path, args.prompt_format)
    else:
        read.update(vision=args.vision, llm=args.llm)
        models = arm_bundles(args.vision, args.llm, tuple(args.arms), args.seed, args.device)
        settings = prompt_settings(None, args.prompt_format)
    result = gradient_flow(models, lambda b: training_batch(b, args.data, args.image_folder, args.batch_size,
                                                            settings), args.out, read)
    _done(result, args.out)


def _attention(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.analysis.attention import attention_maps
    from llava_norm.analysis.common import parse_labeled

    _done(attention_maps(parse_labeled(args.checkpoint), args.image, args.prompt, args.phrase, args.layers,
                         args.heads, args.out, args.prompt_format, args.device), args.out)


def _report(args) -> None:
    # lazy: start-up; a subcommand loads only the stages it runs
    from llava_norm.analysis.report import write_report

    out = args.out or f"{args.folders[0]}/REPORT.md"
    print(f"wrote {write_report(args.folders, out, args.title)}")


def _done(result: dict, out) -> None:
    print(f"wrote {out}/{result['analysis']}.json and {out}/{result['figure']}")


def _common(p, samples: bool = False, checkpoints: bool = True) -> None:
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if available)")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--prompt-format", choices=PROMPT_FORMATS, default=None,
                   help="override the prompt format (default: each checkpoint's training run's, as eval uses)")
    if checkpoints:
        p.add_argument("--checkpoint", action="append", default=[], metavar="[LABEL=]PATH",
                       help="a saved model dir or checkpoint-N dir (repeatable)")
    if samples:
        p.add_argument("--samples", required=True,
                       help="a folder of images, a synthetic world dir, or a LLaVA .json/.jsonl")
        p.add_argument("--image-folder", default=None, help="image root for a LLaVA json (default: its folder)")
        p.add_argument("--limit", type=positive_int, default=16, help="at most this many images (and prompts)")
        p.add_argument("--prompt", action="append", default=[], help="text prompt (repeatable; replaces defaults)")


def register(parser: argparse.ArgumentParser) -> None:
    """Add the analysis subcommands to the ``analyze`` parser."""
    sub = parser.add_subparsers(dest="analysis", required=True)

    p = sub.add_parser("interface-norms", help="Tables 1-2: token norms at the vision-language interface")
    _common(p, samples=True)
    p.add_argument("--vision", help="any vision tower id/dir (with --llm): Table 1 without a projector")
    p.add_argument("--llm", help="any causal LM id/dir (with --vision)")
    p.add_argument("--vision-feature-layer", type=int, default=-2)
    p.set_defaults(func=_interface)

    p = sub.add_parser("top-norm-rows", help="App. C: highest-norm rows of the input embedding matrix")
    p.add_argument("--checkpoint", help="a llava-norm model dir")
    p.add_argument("--llm", help="any causal LM id/dir")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.set_defaults(func=_top_rows)

    p = sub.add_parser("layers", help="Fig. 3-4: per-layer norms and cosine of visual vs text tokens")
    _common(p, samples=True)
    p.set_defaults(func=_layers)

    p = sub.add_parser("gain-stats", help="Table 5: norm-layer gain and bias statistics per checkpoint")
    p.add_argument("--checkpoint", action="append", required=True, metavar="[LABEL=]PATH")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.set_defaults(func=_gains)

    p = sub.add_parser("dynamics", help="App. F: the cosine curves at each checkpoint-N of one run")
    _common(p, samples=True, checkpoints=False)
    p.add_argument("run_dir", help="a training output_dir holding checkpoint-N dirs")
    p.add_argument("--no-final", action="store_true", help="leave out the run's final model/")
    p.set_defaults(func=_dynamics)

    p = sub.add_parser("gradient-flow", help="one batch per arm: gradient reaching projector and vision tower")
    _common(p)
    p.add_argument("--vision", help="vision tower id/dir to build each arm from")
    p.add_argument("--llm", help="LLM id/dir to build each arm from")
    p.add_argument("--arms", nargs="+", default=["none", "ln_default", "ln_textnorm", "ln_textnorm_gwc"])
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data", required=True, help="a LLaVA .json/.jsonl; its first --batch-size rows are the batch")
    p.add_argument("--image-folder", default=None, help="the folder the rows' image paths are under (default: the "
                                                         "JSON's own folder)")
    p.set_defaults(func=_gradients, batch_size=4)

    p = sub.add_parser("attention", help="App. G: text-to-image attention of a phrase, checkpoints side by side")
    _common(p)
    p.add_argument("--image", required=True)
    p.add_argument("--prompt", required=True, help="the user turn (the image goes before it)")
    p.add_argument("--phrase", required=True, help="a substring of --prompt whose tokens are the queries")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="layer indices (default: all; negatives ok)")
    p.add_argument("--heads", type=int, nargs="+", default=None, help="head indices (default: all)")
    p.set_defaults(func=_attention)

    p = sub.add_parser("report", help="one Markdown page from the analyses' JSON and PNG files")
    p.add_argument("folders", nargs="*", default=[DEFAULT_OUT], help="folders holding analysis JSON files")
    p.add_argument("--out", default=None, help="the Markdown file (default: FOLDER/REPORT.md of the first folder)")
    p.add_argument("--title", default="llava-norm diagnostics")
    p.set_defaults(func=_report)
    for name, p in sub.choices.items():
        p.set_defaults(func=_said_in_one_line(name, p.get_default("func")))


def _said_in_one_line(name: str, handler):
    """The handler, with bad input (a missing path, two models under one label) ending the command
    in one line that names it, as the other subcommands do, instead of a traceback."""
    def run(args) -> None:
        try:
            handler(args)
        except (ValueError, OSError) as error:  # OSError: a missing backbone, a file where a folder goes
            raise SystemExit(f"analyze {name}: {error}") from None
    return run
