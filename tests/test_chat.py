"""``llava-norm chat``: a saved model answers about an image with its run's own prompt settings,
streaming, offline; its greedy reply is evaluation's for the same prompt."""

import subprocess
import sys

import pytest
import torch
from PIL import Image

from launch import REPO, env

from llava_norm.data.prompts import training_prompt_settings
from llava_norm.inference import Predictor, Prompt
from llava_norm.model.builder import ModelSpec, build_model, load_bundle

QUESTIONS = ["What colour is the image?", "Is there a red square?"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("chat")
    bundle = build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/llama", norm_alignment="ln_textnorm_gwc",
                                   seed=3))
    # an untrained model may stop at once or say only blanks: the output rows of its stop tokens and
    # of blank tokens at zero make it say words, so the replies compared are text
    tokenizer = bundle.tokenizer
    silent = [*Predictor(bundle).stop_ids,
              *(i for i in range(len(tokenizer)) if not tokenizer.decode([i], skip_special_tokens=True).strip())]
    with torch.no_grad():
        bundle.model.lm_head.weight[silent] = 0
    bundle.save(root / "model")
    Image.new("RGB", (40, 40), (220, 30, 30)).save(root / "red.png")
    return root


def _evaluation_replies(saved) -> list[str]:
    """Evaluation's replies at --batch-size 1 (what the README says chat gives): one prompt a batch,
    through the predictor `llava-norm eval` generates with."""
    bundle = load_bundle(saved / "model")
    predictor = Predictor.from_settings(bundle, training_prompt_settings(saved / "model"))
    image = Image.open(saved / "red.png").convert("RGB")
    return [predictor.generate([Prompt(q, image)], max_new_tokens=12)[0] for q in QUESTIONS]


def test_the_reply_is_evaluations_greedy_reply(saved):
    expected = _evaluation_replies(saved)
    assert any(expected)  # the untrained model says something, so the comparison compares text
    command = [sys.executable, "-m", "llava_norm.cli", "chat", str(saved / "model"), "--image", str(saved / "red.png"),
               "--max-new-tokens", "12"]
    done = subprocess.run([*command, QUESTIONS[0]], cwd=REPO, env={**env(), "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == expected[0]
    # interactive: each question from stdin (a blank line between them skipped), until EOF
    done = subprocess.run([*command, "--interactive"], input=QUESTIONS[0] + "\n\n" + QUESTIONS[1] + "\n", cwd=REPO,
                          env={**env(), "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    replies = [line.lstrip("> ").strip() for line in done.stdout.split("\n") if line.lstrip("> ").strip()]
    assert replies[:2] == expected, done.stdout


def test_streaming_hands_over_the_reply_piece_by_piece(saved):
    bundle = load_bundle(saved / "model")
    predictor = Predictor.from_settings(bundle, training_prompt_settings(saved / "model"))
    pieces: list[str] = []
    reply = predictor.stream(Prompt(QUESTIONS[0], Image.open(saved / "red.png").convert("RGB")), 12, pieces.append)
    assert reply == _evaluation_replies(saved)[0] and "".join(pieces).strip() == reply
    assert len(pieces) > 1  # several pieces, not the whole reply at the end


def test_a_folder_without_a_saved_model_is_named_before_anything_loads(saved, tiny_dir, tmp_path, capsys):
    """The run folder instead of RUN/model (an easy slip) is named with the model inside it; a
    checkpoint (no tokenizer: transformers' traceback) and a backbone (its hundred model classes)
    are named as such, each in one line; a reply budget below one token is refused by argparse
    (it ended in a traceback)."""
    from llava_norm.cli import main

    checkpoint = tmp_path / "run" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text((saved / "model" / "config.json").read_text())
    (checkpoint / "checkpoint_complete").write_text("")
    for folder, said in [(saved, f"chat: {saved} is a training run's folder, not a saved model: its model is "
                                 f"{saved / 'model'}"),
                         (checkpoint, f"chat: {checkpoint} is a training checkpoint (what a relaunch resumes from), "
                                      f"not a saved model: the run's model is {tmp_path / 'run' / 'model'}"),
                         (tiny_dir / "llama", f"chat: {tiny_dir / 'llama'}: a 'llama' model (its config.json), not "
                                              "one a llava-norm run saved")]:
        with pytest.raises(SystemExit) as stop:
            main(["chat", str(folder), "a question"])
        assert str(stop.value.code).startswith(said), stop.value.code
    for count in ("0", "-3"):  # a reply budget below one token: argparse's refusal naming the option
        with pytest.raises(SystemExit) as stop:
            main(["chat", str(saved / "model"), "a question", "--max-new-tokens", count])
        assert stop.value.code == 2
        assert f"argument --max-new-tokens: {count} is not at least 1" in capsys.readouterr().err
    # the loader every command shares says the same (the diagnostics, the lmms-eval plugin)
    with pytest.raises(ValueError, match=r"a 'llama' model \(its config.json\), not one a llava-norm run saved"):
        load_bundle(tiny_dir / "llama")


def test_a_typed_image_placeholder_is_said_in_one_line_and_the_session_goes_on(saved, monkeypatch, capsys):
    """'<image>' typed in a question (the image goes with --image): one line, before the model
    loads for a single question; in a session, said, and the next question is answered."""
    from argparse import Namespace

    from llava_norm.chat import chat

    args = Namespace(model_dir=str(saved / "model"), image=str(saved / "red.png"), question="Describe <image> please",
                     interactive=False, max_new_tokens=4, dtype="float32")
    with pytest.raises(SystemExit) as stop:
        chat(args)
    assert str(stop.value.code).startswith("chat: the question holds '<image>', the image's placeholder")
    typed = iter(["What is <image>?", QUESTIONS[0], "exit"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(typed))
    chat(Namespace(**{**vars(args), "question": None, "interactive": True}))
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("the question holds '<image>'") and len(printed) >= 2 and printed[1].strip(), printed
    typed = iter(["quit"])  # ends the session as 'exit' does (README): nothing asked, nothing read after it
    chat(Namespace(**{**vars(args), "question": None, "interactive": True}))
    assert capsys.readouterr().out.strip() == ""
