"""The LlavaNorm model: equivalence with stock Llava, arms, image-token checks, generation, save/load."""

import json

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, LlavaConfig, LlavaForConditionalGeneration

import llava_norm.model  # noqa: F401  (registers the Auto classes)
from llava_norm.inference import Predictor, Prompt
from llava_norm.model.builder import ModelSpec, build_model, load_bundle
from llava_norm.model.norm_align import text_embedding_norm

# Each tower with each LLM family at least once: ("clip", "llama") is the clip336-llama3.2-3b cell,
# ("siglip", "qwen3") the qwen3-8b one.
PAIRS = [("siglip", "llama"), ("clip", "qwen2"), ("siglip", "qwen3"), ("clip", "llama")]


def _bundle(tiny_dir, vision, llm, arm="none", seed=0):
    return build_model(ModelSpec(str(tiny_dir / vision), str(tiny_dir / llm), norm_alignment=arm, seed=seed))


def _inputs(model, n_text=3):
    cfg = model.config
    torch.manual_seed(1)
    ids = torch.tensor([[1, 2] + [cfg.image_token_id] * cfg.image_seq_length + list(range(3, 3 + n_text))])
    return {"input_ids": ids, "pixel_values": torch.randn(1, 3, 64, 64)}


@pytest.mark.parametrize("vision,llm", PAIRS)
def test_arm_none_matches_transformers_llava(tiny_dir, vision, llm):
    bundle = _bundle(tiny_dir, vision, llm)
    ours = bundle.model.eval()
    settings = ours.config.to_dict()
    for key in ("norm_alignment", "text_norm", "gwc_clamp", "norm_eps", "projector_type", "model_type",
                "architectures", "auto_map", "transformers_version"):
        settings.pop(key, None)
    stock = LlavaForConditionalGeneration(LlavaConfig(**settings)).eval()
    stock.load_state_dict(ours.state_dict(), strict=True)
    inputs = _inputs(ours)
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).logits, stock(**inputs).logits, rtol=0, atol=0)


@pytest.mark.parametrize("vision,llm", PAIRS)
def test_text_norm_arm_initialises_gain_from_llm_embeddings(tiny_dir, vision, llm):
    from transformers import AutoModelForCausalLM

    bundle = _bundle(tiny_dir, vision, llm, arm="ln_textnorm_gwc")
    T = text_embedding_norm(AutoModelForCausalLM.from_pretrained(tiny_dir / llm).get_input_embeddings().weight)
    norm = bundle.model.norm_layer
    assert bundle.model.config.text_norm == pytest.approx(T)
    d = bundle.model.config.text_config.hidden_size
    torch.testing.assert_close(norm.weight.detach(), torch.full((d,), T / d**0.5))
    assert norm.compensate
    image_features = bundle.model.model.get_image_features(_inputs(bundle.model)["pixel_values"]).pooler_output[0]
    assert image_features.norm(dim=-1).mean().item() == pytest.approx(T, rel=0.05)
    default = _bundle(tiny_dir, vision, llm, arm="ln_default").model.norm_layer
    assert torch.all(default.weight == 1) and not default.compensate


def test_mixed_batch_and_image_token_mismatch_names_sample(tiny_dir):
    model = _bundle(tiny_dir, "siglip", "llama").model.eval()
    n, img = model.config.image_seq_length, model.config.image_token_id
    text_only = [5] * (n + 2)
    with_image = [5] + [img] * n + [6]
    pixels = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([text_only, with_image]), pixel_values=pixels).logits
    assert logits.shape[:2] == (2, n + 2)
    broken = [5] + [img] * (n - 1) + [6, 7]
    with pytest.raises(ValueError, match="batch sample 1"):
        model(input_ids=torch.tensor([with_image, broken]), pixel_values=torch.randn(2, 3, 64, 64))
    with pytest.raises(ValueError, match=r"samples \[1\]"):
        model(input_ids=torch.tensor([text_only, with_image]), pixel_values=torch.randn(2, 3, 64, 64))


@pytest.mark.parametrize("vision,llm", PAIRS)
def test_batched_left_padded_generation_equals_per_sample(tiny_dir, vision, llm):
    predictor = Predictor(_bundle(tiny_dir, vision, llm, arm="ln_textnorm_gwc"),
                          template_kwargs={"date_string": "26 Jul 2024"})
    rng = torch.Generator().manual_seed(0)
    def image():
        return Image.fromarray((torch.rand(48, 40, 3, generator=rng) * 255).byte().numpy())
    prompts = [Prompt("What colour is the circle?", image()), Prompt("Count the squares in the picture now.", image()),
               Prompt("Say a word."), Prompt("Where is the red shape? Answer with one word.", image())]
    batched = predictor.generate_ids(prompts, max_new_tokens=8, batch_size=4)
    single = [predictor.generate_ids([p], max_new_tokens=8, batch_size=1)[0] for p in prompts]
    assert batched == single
    assert sum(len(reply) for reply in single) >= 8  # something was generated, not only stop tokens


@pytest.mark.parametrize("vision,llm", PAIRS)
def test_save_and_reload_through_auto_class(tiny_dir, tmp_path, vision, llm):
    bundle = _bundle(tiny_dir, vision, llm, arm="ln_textnorm_gwc")
    bundle.save(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert "model.safetensors" in files
    assert not any(name.endswith((".bin", ".pt", ".pth", ".pkl")) for name in files)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "llava_norm"
    reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    assert type(reloaded) is type(bundle.model)
    inputs = _inputs(bundle.model)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, bundle.model.eval()(**inputs).logits, rtol=0, atol=0)
    torch.testing.assert_close(reloaded.norm_layer.weight, bundle.model.norm_layer.weight)
    assert load_bundle(tmp_path).tokenizer.convert_tokens_to_ids("<image>") == reloaded.config.image_token_id


@pytest.mark.parametrize("llm", ["qwen2", "qwen3"])
def test_text_norm_ignores_the_zero_padding_rows(tiny_dir, llm):
    """Qwen pads its vocabulary past the tokenizer with zero rows; T is the mean norm of the real rows."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    weight = AutoModelForCausalLM.from_pretrained(tiny_dir / llm).get_input_embeddings().weight.detach()
    real = len(AutoTokenizer.from_pretrained(tiny_dir / llm))
    assert weight.shape[0] > real and torch.all(weight[real:] == 0)  # the padding rows the check is about
    T = _bundle(tiny_dir, "siglip", llm, arm="ln_textnorm").model.config.text_norm
    assert T == pytest.approx(weight[:real].norm(dim=-1).mean().item(), rel=1e-6)
    assert T > weight.norm(dim=-1).mean().item() * 1.01


def test_clip_tower_drops_its_cls_token(tiny_dir):
    """LLaVA-1.5 with CLIP: the builder sees the CLS token and picks "default", which drops it."""
    model = _bundle(tiny_dir, "clip", "llama").model
    config = model.config
    patches = (config.vision_config.image_size // config.vision_config.patch_size) ** 2
    assert (config.vision_feature_select_strategy, config.vision_feature_layer) == ("default", -2)
    assert config.image_seq_length == patches
    features = model.model.get_image_features(_inputs(model)["pixel_values"]).pooler_output[0]
    assert features.shape[0] == patches


def test_qwen3_stage2_step_learns_only_the_answer(tiny_dir):
    """A stage-2 sample through the real Qwen3 template (thinking off): the loss is the mean
    cross-entropy over the answer tokens and <|im_end|> only, and it reaches projector and LLM."""
    from llava_norm.data.collate import collate
    from llava_norm.data.conversation import IGNORE_INDEX
    from llava_norm.data.prompts import PromptEncoder, PromptSettings

    bundle = _bundle(tiny_dir, "siglip", "qwen3", arm="ln_textnorm_gwc")
    settings = PromptSettings(template_kwargs={"date_string": "26 Jul 2024", "enable_thinking": False})
    encoder = PromptEncoder.for_bundle(bundle, settings)
    image = Image.new("RGB", (40, 30), (200, 20, 20))
    answer = "The circle is red."
    example = encoder.example([{"role": "user", "content": "<image>\nWhat colour is the circle?"},
                               {"role": "assistant", "content": answer}], [image])
    batch = collate([example], bundle.tokenizer.pad_token_id)
    supervised = batch["labels"][0][batch["labels"][0] != IGNORE_INDEX].tolist()
    tokenizer = bundle.tokenizer
    assert supervised == tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(
        "<|im_end|>")]
    model = bundle.model.train()
    out = model(**batch)
    logits, labels = out.logits[0, :-1], batch["labels"][0, 1:]
    keep = labels != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(logits[keep].float(), labels[keep])
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    projector = model.model.multi_modal_projector
    for name, param in [("projector", projector.linear_1.weight), ("norm", model.norm_layer.weight),
                        ("LLM", model.model.language_model.layers[0].self_attn.q_norm.weight)]:
        assert param.grad is not None and param.grad.abs().sum() > 0, name
