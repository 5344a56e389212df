"""The causal-LM loss without the full logits (``train.loss: fused``).

Owns ``causal_lm_loss``: the same value as transformers' ``ForCausalLMLoss`` (labels shifted
within each row, ignore index -100, a sum over the targets divided by ``num_items_in_batch``
or, without it, their mean) and the same gradients, computed from the last hidden states and
the output weight. Rows with no target are dropped before the output projection (in stage 2
the image and prompt tokens are most of a sample). The rest goes to a chunked torch version:
logits exist one chunk at a time, and each chunk's gradients are taken in the forward pass, so
backward holds no logits at all. Same matmuls as the plain path, no recompute; on CUDA each
chunk's softmax is one compiled kernel (``SOFTMAX_BACKEND``), elsewhere eager fp32 blocks. On a
GPU it was the fastest of the kernels measured (bench/RESULTS.md), so it is the default
everywhere; a GPU kernel package is used where named (``train.fused_loss_kernel``:
``GPU_KERNELS``), for more memory saved at more time.
"""

from __future__ import annotations

import functools
import importlib.util
import logging

import torch

from llava_norm.data.conversation import IGNORE_INDEX

log = logging.getLogger(__name__)
# The chunked path's two sizes. A chunk is the rows whose logits one matmul makes, in the compute
# dtype: on a GPU a chunk of a few hundred rows runs its matmuls well under their speed, so it is
# large. Its softmax is taken a block of rows at a time in fp32, written back into the logits' own
# storage, so the fp32 copy never spans the chunk.
CHUNK_BYTES = 512 * 2**20  # a chunk's logits in the compute dtype
BLOCK_BYTES = 64 * 2**20  # a block's fp32 log-probabilities
# On CUDA the softmax is instead one compiled kernel per chunk, reading the logits and writing the
# softmax over them with no fp32 copy (the one-hot is subtracted after it): on an H100 that made the
# loss step faster than the plain one and left only the chunk (bench/RESULTS.md). The CPU keeps the
# eager blocks (no compile at start-up).
SOFTMAX_BACKEND = "inductor"


def chunk_rows(element_size: int, vocab: int, budget: int | None = None) -> int:
    """Rows per chunk: as many as ``budget`` bytes (default ``CHUNK_BYTES``) of logits hold, at least 16."""
    return max(16, (budget or CHUNK_BYTES) // (element_size * vocab))


def _block_rows(vocab: int) -> int:
    return max(1, BLOCK_BYTES // (4 * vocab))


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Sum over rows of cross_entropy(hidden @ weight.T, targets), with its gradients found
    chunk by chunk in forward (backward only scales them)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, dtype, compiled):
        # Only the gradients autograd will ask for: no weight-sized tensor or matmul for a frozen
        # output layer (stage 1, LoRA). The weight's is summed over chunks in its own dtype, as
        # Liger does by default: a float32 sum would be the largest tensor here in bf16, at the
        # price of one bf16 rounding per chunk.
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        if hidden.is_meta:  # a plan's trace (llava_norm.plan.memory): the chunks would compute nothing,
            ctx.grads = (grad_hidden, grad_weight)  # and the tensors they fill are already made
            return loss
        block = _block_rows(weight.shape[0])
        matmul_weight = weight.to(dtype)  # the weight itself unless autocast computes in another dtype
        for start in range(0, hidden.shape[0], chunk):
            part, target = hidden[start:start + chunk].to(dtype), targets[start:start + chunk]
            logits = part @ matmul_weight.T  # in the compute dtype, as the plain path's
            picked = None
            if compiled is not None and compiled.ready():
                picked = compiled(logits, target)
                if picked is None:  # its compile failed on this chunk: the logits may be part-written
                    logits = part @ matmul_weight.T
            if picked is not None:  # one fused kernel over the chunk: no fp32 copy to split into blocks
                logits[torch.arange(len(target), device=logits.device), target] = (picked.exp() - 1).to(dtype)
                loss -= picked.sum()
            else:
                for at in range(0, len(part), block):
                    loss += _softmax_minus_one_hot_(logits[at:at + block], target[at:at + block])
            if grad_hidden is not None:
                if grad_hidden.dtype == dtype:
                    torch.mm(logits, matmul_weight, out=grad_hidden[start:start + chunk])
                else:
                    grad_hidden[start:start + chunk] = logits @ matmul_weight
            if grad_weight is not None:
                if grad_weight.dtype == dtype:
                    grad_weight.addmm_(logits.T, part)
                else:  # autocast: a compute-dtype product, summed in the weight's own dtype
                    grad_weight += logits.T @ part
            del logits  # before the next chunk's matmul allocates its own
        # Held on ctx, not saved: backward hands them over, scaled in place, with no reference
        # left, so autograd moves them into .grad instead of copying the weight-sized one.
        # (The graph cannot be backpropagated twice, which training never does.)
        ctx.grads = (grad_hidden, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.grads
        del ctx.grads
        for grad in (grad_hidden, grad_weight):
            if grad is not None:
                grad.mul_(grad_loss.float())  # a 0-dim fp32 factor: one rounding, not a bf16 1/N
        return grad_hidden, grad_weight, None, None, None, None


def _softmax_minus_one_hot_(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The rows' summed cross-entropy; ``logits`` is overwritten with its gradient, softmax minus
    the one-hot, rounded once into its dtype. The log-probabilities are fp32, as the plain path's
    fp32 cross-entropy (from bf16 logits torch first makes an fp32 copy: two fp32 blocks at once)."""
    rows = torch.arange(len(target), device=logits.device)
    log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    picked = log_probs[rows, target]
    logits.copy_(log_probs.exp_())
    logits[rows, target] = (picked.exp() - 1).to(logits.dtype)
    return -picked.sum()


def _softmax_minus_one_hot_fused_(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The softmax half of ``_softmax_minus_one_hot_``, written for ``torch.compile``: the same fp32
    arithmetic, fused into a row reduction and one pass that writes the softmax over the logits;
    returns the targets' log-probabilities (the caller subtracts the one-hot)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    picked = (x.gather(1, target[:, None]) - lse).squeeze(1)
    logits.copy_(torch.exp(x - lse))  # written in place: a scatter here would build a chunk-sized copy
    return picked


class _CompiledSoftmax:
    """``_softmax_minus_one_hot_fused_`` compiled for any number of rows. A compiler that fails on
    this machine (no triton, no C compiler) is said once and the eager blocks are used from then on;
    so is dynamo switched off (TORCHDYNAMO_DISABLE), which would run the function uncompiled with
    chunk-sized fp32 temporaries. Any other error is raised."""

    def __init__(self, backend: str):
        self.backend, self.fn = backend, torch.compile(_softmax_minus_one_hot_fused_, backend=backend, dynamic=True)
        self.said = False

    def ready(self) -> bool:
        if self.fn is not None and torch._dynamo.config.disable:
            self._give_up("dynamo is disabled")
        return self.fn is not None

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
        """The targets' log-probabilities, the softmax written over ``logits``; None where the
        compile failed (then ``logits`` may be part-written)."""
        try:
            picked = self.fn(logits, target)
        except Exception as error:
            if not _compile_failure(error):
                raise
            cause = getattr(error, "inner_exception", None) or error  # the backend's own error
            text = str(cause).strip()
            self._give_up(f"{type(cause).__name__}: {text.splitlines()[0] if text else ''}")
            return None
        if not self.said:  # which path a run took, once
            log.info("train.loss fused: each chunk's softmax compiled by %s", self.backend)
            self.said = True
        return picked

    def _give_up(self, why: str) -> None:
        self.fn = None
        _say_once(f"train.loss fused: the softmax is not compiled with {self.backend} ({why}); "
                  "using the eager fp32 blocks")


def _compile_failure(error: Exception) -> bool:
    """An error of the compile itself (dynamo's or the backend's), not of running the compiled code."""
    from torch._dynamo import exc as dynamo_errors  # lazy: only once something failed

    kinds = [dynamo_errors.BackendCompilerFailed, dynamo_errors.InternalTorchDynamoError]
    try:
        from torch._inductor.exc import InductorError  # lazy: a torch that has it

        kinds.append(InductorError)
    except ImportError:
        pass
    return isinstance(error, tuple(kinds))


def softmax_backend(choice: str) -> str | None:
    """``train.fused_loss_softmax`` as ``compile_backend``: auto, compiled (``SOFTMAX_BACKEND``) or eager (None)."""
    return {"auto": "auto", "compiled": SOFTMAX_BACKEND, "eager": None}[choice]


@functools.cache
def compiled_softmax(backend: str) -> _CompiledSoftmax:
    return _CompiledSoftmax(backend)


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    try:
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    except RuntimeError:  # a device type autocast does not know (the plan's meta tensors)
        return None


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                                 chunk: int | None = None, compile_backend: str | None = "auto") -> torch.Tensor:
    """Summed cross-entropy of ``hidden @ weight.T`` against ``targets`` (no ignored rows). Under
    autocast (fp32 weights computing in bf16: training without DeepSpeed) the logits are made in
    autocast's dtype, as the plain path's output layer makes them. ``compile_backend``: each
    chunk's softmax as one kernel compiled by this torch._dynamo backend, None for the eager fp32
    blocks, "auto" for ``SOFTMAX_BACKEND`` on CUDA and the blocks elsewhere."""
    dtype = _autocast_dtype(hidden.device.type) or weight.dtype
    if not torch.is_grad_enabled():  # a Function's needs_input_grad ignores no_grad: no gradient to find
        hidden, weight = hidden.detach(), weight.detach()
    chunk = chunk or chunk_rows(dtype.itemsize, weight.shape[0])
    if compile_backend == "auto":
        compile_backend = SOFTMAX_BACKEND if _gpu(hidden.device) else None
    compiled = compiled_softmax(compile_backend) if compile_backend else None
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, chunk, dtype, compiled)


@functools.cache
def _say_once(message: str) -> None:
    log.warning(message)


# GPU kernels of the fused linear cross-entropy, by the name ``train.fused_loss_kernel`` gives:
# (module, function, keyword arguments that make it the summed, unfiltered loss). Cut Cross-Entropy's
# default gradient filtering drops small softmax entries: off here, so gradients stay the plain path's.
GPU_KERNELS = {
    "liger": ("liger_kernel.transformers.functional", "liger_fused_linear_cross_entropy", {"reduction": "sum"}),
    "cce": ("cut_cross_entropy", "linear_cross_entropy", {"reduction": "sum", "filter_eps": None}),
}


@functools.cache
def gpu_kernel(name: str):
    """``fn(rows, weight, targets)`` -> summed loss for a GPU kernel package, or None where it is not
    installed or does not import."""
    module, attr, kwargs = GPU_KERNELS[name]
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return None
    try:
        fn = getattr(importlib.import_module(module), attr)
    except ImportError as error:  # e.g. installed without a working triton
        _say_once(f"{module} does not import ({error})")
        return None
    return lambda rows, weight, targets: fn(rows, weight, targets, **kwargs)


def fused_held_bytes(rows: int, hidden: int, vocab: int, element_size: int, weight_trained: bool, *,
                     compiled: bool) -> int:
    """Bytes the fused loss adds at its peak that autograd's saved-tensor hooks do not see: the
    gradient of the hidden states and, when the output layer trains, of its weight (held on
    ``ctx``; Liger's kernel holds the same two), the supervised rows' copy and one chunk's logits;
    with the eager softmax (``compiled`` False: the CPU) also its fp32 blocks (two from bf16 logits:
    the conversion, then the log-probabilities). The plan's GPU runs the compiled softmax."""
    chunk = min(rows, chunk_rows(element_size, vocab))
    blocks = 0 if compiled else min(chunk, _block_rows(vocab)) * vocab * 4 * (1 if element_size == 4 else 2)
    return ((2 * rows * hidden + (vocab * hidden if weight_trained else 0)) * element_size
            + chunk * vocab * element_size + blocks)


def _gpu(device: torch.device) -> bool:
    return device.type == "cuda"


def fused_kernel(device: torch.device, kernel: str = "torch"):
    """(name, fn) of the GPU kernel ``kernel`` names, or (None, why it does not run here): "torch"
    is the chunked torch path, which needs none."""
    if kernel == "torch":
        return None, "kernel 'torch' asked for"
    if not _gpu(device):
        return None, f"{kernel} runs on CUDA only, not on {device.type}"
    if (fn := gpu_kernel(kernel)) is not None:
        return kernel, fn
    return None, f"{kernel} is not installed or does not import"


def causal_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                   num_items_in_batch: torch.Tensor | int | None = None, chunk: int | None = None,
                   kernel: str = "torch", compile_backend: str | None = "auto") -> torch.Tensor:
    """``ForCausalLMLoss(hidden @ weight.T, labels, num_items_in_batch)`` without the logits tensor."""
    shifted = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].to(hidden.device)
    keep = shifted != IGNORE_INDEX
    rows, targets = hidden[keep], shifted[keep]
    name, fn_or_problem = fused_kernel(hidden.device, kernel)
    if not len(targets):
        total = (hidden.sum() * 0.0 + weight.sum() * 0.0).float()  # no target: zero loss, graph kept
    elif name is not None:
        total = fn_or_problem(rows, weight, targets).float()
    else:
        if kernel != "torch" and hidden.device.type != "meta":  # a plan's shape-only trace says nothing
            _say_once(f"train.loss fused: {fn_or_problem}; using the chunked torch cross-entropy")
        total = chunked_linear_cross_entropy(rows, weight, targets, chunk, compile_backend)
    if num_items_in_batch is None:
        return total / max(len(targets), 1)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch
