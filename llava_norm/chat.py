"""``llava-norm chat``: a saved model answers questions about an image, streaming.

Owns the interactive loop; the prompt is the run's own (``data.prompts.training_prompt_settings``),
built by the one prompt path evaluation uses (``inference.Predictor``), so a greedy reply is what
evaluation would produce for the same question.
"""

from __future__ import annotations

import sys

import torch
from PIL import Image

from llava_norm.config_schema import resolve_dtype
from llava_norm.data.conversation import IMAGE_PLACEHOLDER
from llava_norm.data.prompts import training_prompt_settings
from llava_norm.inference import Predictor, Prompt
from llava_norm.model.builder import load_bundle
from llava_norm.saved_model import check_saved_model


def chat(args) -> None:
    """Answer ``args.question`` (and, with ``args.interactive``, each line of stdin) about
    ``args.image`` with the saved model in ``args.model_dir``, streaming the reply."""
    if not args.interactive and not args.question:
        sys.exit("chat: give a question, or --interactive")
    if args.question and (problem := _placeholder_problem(args.question)):
        sys.exit(f"chat: {problem}")
    image = None
    if args.image:
        try:
            image = Image.open(args.image).convert("RGB")
        except OSError as error:
            sys.exit(f"chat: --image {args.image}: {error}")
    try:
        check_saved_model(args.model_dir)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"chat: {error}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bundle = load_bundle(args.model_dir, dtype=resolve_dtype(args.dtype, device))
    bundle.model.to(device)
    predictor = Predictor.from_settings(bundle, training_prompt_settings(args.model_dir), device=device)

    def ask(question: str) -> None:
        predictor.stream(Prompt(question, image), args.max_new_tokens, lambda text: print(text, end="", flush=True))
        print(flush=True)

    if args.question:
        ask(args.question)
    while args.interactive:  # each question about the same image, without the earlier turns
        try:
            question = input("> ").strip()
        except EOFError:
            print(flush=True)
            break
        if question in ("exit", "quit"):
            break
        if question and (problem := _placeholder_problem(question)):  # said, and the session goes on
            print(problem, flush=True)
        elif question:
            ask(question)


def _placeholder_problem(question: str) -> str | None:
    """The image goes in with --image, where the prompt puts it; a typed placeholder would ask for a
    second image that is not there."""
    if IMAGE_PLACEHOLDER in question:
        return f"the question holds {IMAGE_PLACEHOLDER!r}, the image's placeholder: give the image with --image " \
               "and ask without it"
    return None
