"""What a launch sets in DeepSpeed before it initialises: the process group of a launcher-less
run, checkpoint loads that unpickle no code, and two start-up costs DeepSpeed pays for features
training never uses (its CPU inference op's build, its Muon kernels' compile wrappers), and
the deprecation warning its ZeRO gathers raise every step; and what an earlier run in the same
process left behind of DeepSpeed, cleared before the next."""

from __future__ import annotations

import functools
import os
import socket
import sys
import warnings

import torch

from llava_norm.train.universal import deepspeed_records


def forget_earlier_runs() -> None:
    """Clear what an earlier run in this process left in accelerate's and transformers'
    process-wide state: accelerate's state, the DeepSpeed config transformers keeps a reference to,
    and ACCELERATE_USE_DEEPSPEED (which accelerate sets for a DeepSpeed run and never unsets).
    Without it a later run in the process (a test's, a notebook's) trained under the earlier
    one's DeepSpeed engine whatever its own config said. A launched process trains one run."""
    from accelerate.state import AcceleratorState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    AcceleratorState._reset_state(reset_partial_state=True)
    unset_hf_deepspeed_config()
    os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)  # set again by accelerate for a DeepSpeed run


def prepare_deepspeed() -> None:
    """Everything below, in the order a DeepSpeed launch needs it (before ``deepspeed.initialize``)."""
    single_process_rendezvous()
    skip_cpu_inference_comm_op()
    defer_muon_compile()
    safe_deepspeed_loading()
    quiet_zero_gather_deprecation()


def quiet_zero_gather_deprecation() -> None:
    """Drop torch's FutureWarning about ``all_gather_into_tensor``, which DeepSpeed's ZeRO calls.

    Why: it is DeepSpeed's call, nothing a user can change, and it was printed at every step on
    every rank (warnings' once-per-place memory is cleared whenever a library changes the
    warning filters, as ``catch_warnings`` blocks do), burying the run's own lines.
    """
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
                            category=FutureWarning)


def single_process_rendezvous() -> None:
    """Give a launcher-less process the environment of a one-process group.

    Why: DeepSpeed (and so every shipped ZeRO config) initialises torch.distributed, and without
    RANK/WORLD_SIZE in the environment it falls back to MPI discovery, which needs mpi4py. A run
    started without torchrun is one process: rank 0 of 1, on a free local port.
    """
    if "RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ:
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                      MASTER_PORT=os.environ.get("MASTER_PORT", str(port)))


def safe_deepspeed_loading() -> None:
    """Resume DeepSpeed checkpoints without unpickling arbitrary objects.

    Why: DeepSpeed's torch checkpoint engine loads with ``weights_only=False``, so a checkpoint
    a user was handed could run code on load. Its files hold tensors, containers, strings and
    four plain DeepSpeed records (loss scaler, ZeRO stage, fragment address); those four are
    allowed by name for the load, with a ``getattr`` that returns only a ZeRO stage (how early
    Python 3.11 releases pickle it: ``universal.enum_member``), and nothing else is.
    """
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    allowed = deepspeed_records()

    def load(self, path: str, map_location=None):
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)

    TorchCheckpointEngine.load = load


def skip_cpu_inference_comm_op() -> None:
    """On CPU, keep DeepSpeed from compiling its shared-memory all-reduce op at start-up.

    Why: DeepSpeed's CPU backend JIT-compiles that C++ op whenever its comm layer starts
    (about 22 s on 2 cores, again in every new environment, and only with a C++ compiler
    present), yet only its inference engine's all-reduce uses it; ZeRO training reduces
    through torch.distributed. DeepSpeed builds an op only where ``__compatible_ops__``
    allows it, so marking this one incompatible skips the build and nothing else changes.
    """
    if torch.cuda.is_available():
        return
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def defer_muon_compile() -> None:
    """Build DeepSpeed's Muon kernels' ``torch.compile`` wrappers at their first call, not at import.

    Why: ZeRO asks whether the optimizer is DeepSpeed's Muon by importing Muon's module, whose
    kernels are decorated with ``torch.compile`` at import; building those wrappers imports
    torch's inductor, about half a second of CPU in every DeepSpeed process of every launch.
    Here the module is imported with each wrapper built by the same ``torch.compile`` when its
    kernel is first called outside a compiled region; inside one (a compiled kernel calling
    another), the call goes to the plain function, which the enclosing compile traces as it
    traced the decorated one before. Training here never runs Muon (a DeepSpeed ``optimizer``
    section is refused), so the wrappers are never built.
    """
    name = "deepspeed.runtime.zero.muon.muon_optimizer"
    if name in sys.modules:
        return
    from deepspeed.runtime import compiler

    real = compiler.compile

    def compile_at_first_call():
        def decorate(fn):
            built = []

            @functools.wraps(fn)
            def call(*args, **kwargs):
                if torch.compiler.is_compiling():
                    return fn(*args, **kwargs)
                if not built:
                    built.append(real()(fn))
                return built[0](*args, **kwargs)

            return call

        return decorate

    compiler.compile = compile_at_first_call
    try:
        __import__(name)
    except ImportError:  # as DeepSpeed's own check: a build without Muon's module
        pass
    finally:
        compiler.compile = real
