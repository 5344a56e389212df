"""train.loss fused: the chunked cross-entropy against transformers' own causal-LM loss."""

import logging
import re
from pathlib import Path

import pytest
import torch
from tinydata import token_examples
from transformers.loss.loss_utils import ForCausalLMLoss

from llava_norm.data.collate import collate
from llava_norm.data.conversation import IGNORE_INDEX
from llava_norm.model import loss as loss_module
from llava_norm.model.builder import ModelSpec, build_model
from llava_norm.model.loss import causal_lm_loss

TOL = dict(rtol=1e-4, atol=1e-4)


def _case(seed, batch=3, length=17, hidden=24, vocab=101):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(batch, length, hidden, generator=g, requires_grad=True)
    w = (torch.randn(vocab, hidden, generator=g) * 0.3).requires_grad_(True)
    labels = torch.randint(0, vocab, (batch, length), generator=g)
    labels[torch.rand(batch, length, generator=g) < 0.4] = IGNORE_INDEX  # prompts, images, padding
    labels[1] = IGNORE_INDEX  # a row with no target at all
    return h, w, labels


@pytest.mark.parametrize("chunk", [1, 5, None])
@pytest.mark.parametrize("normalise", ["num_items", "mean"])
def test_chunked_loss_and_gradients_match_the_plain_path(chunk, normalise):
    h, w, labels = _case(0)
    num_items = labels[..., 1:].ne(IGNORE_INDEX).sum() * 2 if normalise == "num_items" else None  # 2 micro-batches
    plain = ForCausalLMLoss(h @ w.T, labels, w.shape[0], num_items_in_batch=num_items)
    grads = torch.autograd.grad(plain, (h, w))
    ours = causal_lm_loss(h, w, labels, num_items, chunk=chunk)
    torch.testing.assert_close(ours, plain, **TOL)
    for a, b in zip(torch.autograd.grad(ours, (h, w)), grads):
        torch.testing.assert_close(a, b, **TOL)


def test_softmax_blocks_inside_a_chunk_match_the_plain_path(monkeypatch):
    """The softmax is taken a block of rows at a time inside each chunk: blocks of 2 rows in
    chunks of 5, so blocks end inside a chunk and at its end."""
    monkeypatch.setattr(loss_module, "BLOCK_BYTES", 2 * 4 * 101)
    h, w, labels = _case(1)
    plain = ForCausalLMLoss(h @ w.T, labels, w.shape[0])
    ours = causal_lm_loss(h, w, labels, chunk=5)
    torch.testing.assert_close(ours, plain, **TOL)
    for a, b in zip(torch.autograd.grad(ours, (h, w)), torch.autograd.grad(plain, (h, w))):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("chunk", [5, None])
def test_the_compiled_softmax_matches_the_plain_path(chunk):
    """CUDA's path (each chunk's softmax one compiled kernel, the one-hot subtracted after it),
    compiled here by the same inductor backend for the CPU: loss and gradients are the plain path's."""
    h, w, labels = _case(2)
    plain = ForCausalLMLoss(h @ w.T, labels, w.shape[0])
    ours = causal_lm_loss(h, w, labels, chunk=chunk, compile_backend=loss_module.SOFTMAX_BACKEND)
    torch.testing.assert_close(ours, plain, **TOL)
    for a, b in zip(torch.autograd.grad(ours, (h, w)), torch.autograd.grad(plain, (h, w))):
        torch.testing.assert_close(a, b, **TOL)
    assert loss_module.compiled_softmax(loss_module.SOFTMAX_BACKEND).fn is not None  # compiled, not fallen back


def test_the_compiled_softmax_in_bf16_writes_what_the_eager_blocks_write():
    """In bf16, as on a GPU: the compiled kernel's loss and gradients against the eager blocks'."""
    h, w, labels = (t.to(torch.bfloat16).detach().requires_grad_(t.requires_grad) if t.is_floating_point() else t
                    for t in _case(8))
    results = []
    for backend in (loss_module.SOFTMAX_BACKEND, None):
        loss = causal_lm_loss(h, w, labels, chunk=5, compile_backend=backend)
        results.append((loss, *torch.autograd.grad(loss, (h, w))))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    assert loss_module.compiled_softmax(loss_module.SOFTMAX_BACKEND).fn is not None


def test_the_softmax_is_compiled_on_cuda_only(monkeypatch):
    """compile_backend "auto" (the default): SOFTMAX_BACKEND where the hidden states are on CUDA,
    the eager blocks elsewhere (a CPU run compiles nothing at start-up)."""
    asked = []
    monkeypatch.setattr(loss_module, "compiled_softmax", lambda backend: asked.append(backend))  # None: eager
    h, w, labels = _case(3)
    causal_lm_loss(h, w, labels)
    assert asked == []
    monkeypatch.setattr(loss_module, "_gpu", lambda device: True)
    causal_lm_loss(h, w, labels)
    assert asked == [loss_module.SOFTMAX_BACKEND]


def _with_softmax(monkeypatch, backend):
    """The compiled softmax built with ``backend`` (a dynamo backend function) in place of inductor."""
    loss_module._say_once.cache_clear()
    softmax = loss_module._CompiledSoftmax(backend)
    monkeypatch.setattr(loss_module, "compiled_softmax", lambda name: softmax)
    return softmax


def _plain_and_ours(seed: int, times: int = 1):
    h, w, labels = _case(seed)
    plain = ForCausalLMLoss(h @ w.T, labels, w.shape[0])
    for _ in range(times):
        ours = causal_lm_loss(h, w, labels, chunk=5, compile_backend="stand-in")
        torch.testing.assert_close(ours, plain, **TOL)


def test_a_softmax_that_does_not_compile_falls_back_to_the_blocks_and_says_so_once(monkeypatch, caplog):
    def broken(graph, example_inputs):
        raise RuntimeError("no compiler on this machine")

    softmax = _with_softmax(monkeypatch, broken)
    with caplog.at_level(logging.WARNING, logger="llava_norm.model.loss"):
        _plain_and_ours(4, times=2)
    assert caplog.text.count("is not compiled") == 1 and "no compiler on this machine" in caplog.text
    assert softmax.fn is None


def test_a_compile_failure_after_the_logits_were_written_recomputes_them(monkeypatch):
    """A compile that fails part-way (a later graph of the function, say) after an earlier part
    wrote the softmax over the chunk's logits: the chunk's logits are made again for the blocks."""
    from torch._dynamo.exc import BackendCompilerFailed

    def writes_then_fails(graph, example_inputs):
        def run(*args):
            graph(*args)
            raise BackendCompilerFailed(writes_then_fails, RuntimeError("a later graph did not compile"), None)
        return run

    _with_softmax(monkeypatch, writes_then_fails)
    _plain_and_ours(5)


def test_an_error_running_the_compiled_softmax_is_raised_not_taken_for_a_compile_failure(monkeypatch):
    def fails_when_run(graph, example_inputs):
        def run(*args):
            raise RuntimeError("index out of bounds")
        return run

    softmax = _with_softmax(monkeypatch, fails_when_run)
    with pytest.raises(RuntimeError, match="index out of bounds"):
        _plain_and_ours(6)
    assert softmax.fn is not None


def test_with_dynamo_disabled_the_blocks_are_used_not_the_uncompiled_function(monkeypatch, caplog):
    """TORCHDYNAMO_DISABLE would run the fused function as plain torch, with chunk-sized fp32
    temporaries: the eager blocks run instead, said once."""
    import torch._dynamo

    ran = []
    softmax = _with_softmax(monkeypatch, lambda graph, inputs: ran.append(1) or graph)
    with torch._dynamo.config.patch(disable=True), caplog.at_level(logging.WARNING, logger="llava_norm.model.loss"):
        _plain_and_ours(7, times=2)
    assert ran == [] and softmax.fn is None and caplog.text.count("dynamo is disabled") == 1


def test_no_target_gives_zero_loss_with_a_graph():
    h, w, labels = _case(1)
    loss = causal_lm_loss(h, w, torch.full_like(labels, IGNORE_INDEX), num_items_in_batch=5)
    assert loss.item() == 0 and loss.requires_grad


def test_a_gpu_kernel_named_on_cpu_falls_back_to_the_chunked_path_and_says_so_once(caplog):
    loss_module._say_once.cache_clear()
    h, w, labels = _case(2)
    with caplog.at_level(logging.WARNING, logger="llava_norm.model.loss"):
        for kernel in ("torch", "liger", "liger", "torch"):
            causal_lm_loss(h, w, labels, kernel=kernel)
    said = [r.getMessage() for r in caplog.records if "fused" in r.getMessage()]
    assert said == ["train.loss fused: liger runs on CUDA only, not on cpu; using the chunked torch cross-entropy"]


@pytest.mark.parametrize("llm", ["llama", "qwen3"])  # tied and untied output embeddings
def test_model_fused_loss_matches_plain(tiny_dir, llm):
    bundle = build_model(ModelSpec(str(tiny_dir / "siglip"), str(tiny_dir / llm), norm_alignment="ln_textnorm_gwc"))
    model = bundle.model.float().train()
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    assert tied == (llm == "llama")
    batch = collate(token_examples(model.config), pad_token_id=0)
    count = batch["labels"][..., 1:].ne(IGNORE_INDEX).sum()
    results = []
    for kind in ("plain", "fused"):
        model.zero_grad()
        out = model(**batch, num_items_in_batch=count, loss_kind=kind)
        out.loss.backward()
        results.append((out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                            if p.grad is not None}))
    (plain, plain_grads), (fused, fused_grads) = results
    torch.testing.assert_close(fused, plain, **TOL)
    assert plain_grads.keys() == fused_grads.keys()
    for name, grad in plain_grads.items():
        scale = max(float(grad.abs().max()), 1.0)
        torch.testing.assert_close(fused_grads[name] / scale, grad / scale, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_bf16_matches_the_plain_path_to_bf16_rounding():
    """Training precision on GPU: logits in bf16 then fp32 in both paths; the weight's gradient
    is summed over chunks in bf16 (as Liger does), so it agrees to bf16 rounding, not to 1e-4."""
    h, w, labels = _case(3, length=64, hidden=64, vocab=300)
    h, w = h.detach().bfloat16().requires_grad_(), w.detach().bfloat16().requires_grad_()
    plain = ForCausalLMLoss(h @ w.T, labels, w.shape[0])
    grads = torch.autograd.grad(plain, (h, w))
    ours = causal_lm_loss(h, w, labels, chunk=16)
    torch.testing.assert_close(ours, plain, rtol=1e-3, atol=1e-3)
    for a, b in zip(torch.autograd.grad(ours, (h, w)), grads):
        assert a.dtype == b.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-3)


def test_a_frozen_output_weight_gets_no_gradient():
    """Stage 1 and LoRA freeze lm_head: no weight-sized gradient is made, the hidden states' is unchanged."""
    h, w, labels = _case(4)
    frozen = w.detach()
    plain = torch.autograd.grad(ForCausalLMLoss(h @ frozen.T, labels, w.shape[0]), h)[0]
    loss = causal_lm_loss(h, frozen, labels, chunk=4)
    chunked = loss.grad_fn.next_functions[0][0]  # the sum's node, under the division by the count
    assert chunked.grads[0] is not None and chunked.grads[1] is None
    torch.testing.assert_close(torch.autograd.grad(loss, h)[0], plain, **TOL)
    trained = causal_lm_loss(h, w, labels, chunk=4).grad_fn.next_functions[0][0]
    assert trained.grads[1].shape == w.shape  # the check above can fail


@pytest.mark.parametrize("kernel", ["liger", "cce"])
def test_a_gpu_kernel_gets_the_supervised_rows_and_sums(monkeypatch, kernel):
    """The GPU branch's contract (no GPU here): each kernel package's function is called with the
    supervised rows, the weight and their targets, with the keywords that make it the summed and
    (Cut Cross-Entropy) unfiltered loss; a stand-in with that signature must give the plain loss and
    gradients."""
    calls = []

    def reference(input, weight, target, reduction="mean", **rest):
        calls.append((input.shape, target.shape, reduction, rest))
        return torch.nn.functional.cross_entropy(input @ weight.T, target, reduction=reduction)

    module, attr, _ = loss_module.GPU_KERNELS[kernel]
    monkeypatch.setattr(loss_module.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(loss_module.importlib, "import_module",
                        lambda name: type("Module", (), {attr: staticmethod(reference)}) if name == module else None)
    loss_module.gpu_kernel.cache_clear()
    monkeypatch.setattr(loss_module, "_gpu", lambda device: True)
    try:
        h, w, labels = _case(5)
        targets = int(labels[..., 1:].ne(IGNORE_INDEX).sum())
        plain = ForCausalLMLoss(h @ w.T, labels, w.shape[0], num_items_in_batch=targets)
        ours = causal_lm_loss(h, w, labels, num_items_in_batch=targets, kernel=kernel)
    finally:
        loss_module.gpu_kernel.cache_clear()
    assert calls == [((targets, h.shape[-1]), (targets,), "sum", {} if kernel == "liger" else {"filter_eps": None})]
    torch.testing.assert_close(ours, plain, **TOL)
    for a, b in zip(torch.autograd.grad(ours, (h, w)), torch.autograd.grad(plain, (h, w))):
        torch.testing.assert_close(a, b, **TOL)


def test_the_chunked_path_is_the_default_and_a_gpu_kernel_runs_where_named(monkeypatch):
    monkeypatch.setattr(loss_module, "gpu_kernel", lambda name: None if name == "cce" else print)
    cuda = torch.device("cuda")
    assert loss_module.fused_kernel(cuda)[0] is None  # the default: torch, though liger "imports"
    assert loss_module.fused_kernel(cuda, "liger")[0] == "liger"
    assert loss_module.fused_kernel(cuda, "cce") == (None, "cce is not installed or does not import")
    assert loss_module.fused_kernel(torch.device("cpu"), "liger")[0] is None


def test_generate_keeps_only_the_last_logits(tiny_dir):
    """forward names logits_to_keep, so generate() computes the prompt's last logits only."""
    bundle = build_model(ModelSpec(str(tiny_dir / "siglip"), str(tiny_dir / "llama")))
    assert bundle.model._supports_logits_to_keep()


@pytest.mark.parametrize("softmax", ["eager", "compiled"])
def test_under_autocast_fp32_weights_match_the_plain_path_in_bf16(softmax):
    """Training without DeepSpeed in bf16: fp32 weights, and autocast makes the output layer's
    logits in bf16; the chunks are made in bf16 too, the gradients come back in fp32."""
    h, w, labels = _case(6, length=64, hidden=64, vocab=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = ForCausalLMLoss(torch.nn.functional.linear(h, w), labels, w.shape[0])
        grads = torch.autograd.grad(plain, (h, w))
        ours = causal_lm_loss(h, w, labels, chunk=16, compile_backend=loss_module.softmax_backend(softmax))
        mine = torch.autograd.grad(ours, (h, w))
    torch.testing.assert_close(ours, plain, rtol=1e-3, atol=1e-3)
    for a, b in zip(mine, grads):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)


def test_under_no_grad_no_weight_sized_gradient_is_made(monkeypatch):
    """Evaluation's loss: a trainable output weight, but no_grad, so nothing weight-sized is allocated."""
    h, w, labels = _case(7)
    made = []
    zeros_like = torch.zeros_like
    monkeypatch.setattr(torch, "zeros_like", lambda t, *a, **k: made.append(tuple(t.shape)) or zeros_like(t, *a, **k))
    with torch.no_grad():
        loss = causal_lm_loss(h, w, labels)
    assert not loss.requires_grad and tuple(w.shape) not in made
    causal_lm_loss(h, w, labels)
    assert tuple(w.shape) in made  # the check above can fail


def test_the_plans_loss_term_is_the_h100s_measured_peak():
    """fused_held_bytes (the plan's term for the fused loss, with the compiled softmax CUDA runs)
    against the loss step's peak measured on an H100 with the shipped chunk size (bench/results:
    4,096 tokens, hidden 3,072, bf16). That run's compiled rows took their base after the compile
    step, which left both gradients allocated, so the recorded rise is short of the step's by
    exactly those two tensors (bench/RESULTS.md; fused_loss.py now frees them first): they are
    added back here, by the formula the plan itself uses for them, so what this holds to a
    measurement is the rest: the chunk's logits, the rows' copy, and no fp32 block. A change of the
    chunk size, or of what the loss allocates, must be measured again."""
    text = (Path(__file__).resolve().parents[1] / "bench/results/gpu_2026-11-27_fused_compiled.txt").read_text()
    assert loss_module.CHUNK_BYTES == 512 * 2**20
    for vocab in (128_256, 152_064):
        recorded = float(re.search(rf"vocab\s+{vocab} torch@512MiB\+compiled: peak \+([\d.]+) GiB", text).group(1))
        gradients = (4096 * 3072 + vocab * 3072) * 2 / 2**30
        planned = loss_module.fused_held_bytes(4095, 3072, vocab, 2, True, compiled=True) / 2**30  # 4,095 rows have a target
        assert abs(planned / (recorded + gradients) - 1) < 0.02, (vocab, planned, recorded + gradients)


@pytest.mark.parametrize("frozen_head", [False, True])
def test_on_meta_the_chunks_are_skipped_and_backward_gives_what_cpu_gives(monkeypatch, frozen_head):
    """A plan's trace runs the loss on the meta device: no chunk is computed there, and forward and
    backward hand out the loss and gradients with the shapes and dtypes a CPU run gives."""
    def runs(device):
        torch.manual_seed(0)
        hidden = torch.randn(40, 8, device=device, requires_grad=True)
        weight = torch.randn(32, 8, device=device, requires_grad=not frozen_head)
        value = loss_module.chunked_linear_cross_entropy(hidden, weight, torch.zeros(40, dtype=torch.long, device=device),
                                                         chunk=16, compile_backend=None)
        value.backward()
        return value, hidden.grad, weight.grad

    on_cpu = runs("cpu")
    monkeypatch.setattr(loss_module, "_block_rows", lambda vocab: pytest.fail("a chunk was computed on meta"))
    on_meta = runs("meta")
    assert [(t.shape, t.dtype) if t is not None else None for t in on_meta] == \
        [(t.shape, t.dtype) if t is not None else None for t in on_cpu]
    assert on_meta[0].is_meta and (on_meta[2] is None) == frozen_head
