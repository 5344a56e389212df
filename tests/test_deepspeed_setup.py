"""What a launch sets in DeepSpeed before it initialises (``llava_norm.train.deepspeed_setup``);
the checkpoint loads that unpickle no code are tested in test_relaunch.py and test_world_size.py."""

import subprocess
import sys

from launch import REPO, env

# In a fresh process, with DeepSpeed's own compile decorator: the import ZeRO's optimizer check makes.
IMPORT_PROBE = """
import sys
from llava_norm.train.deepspeed_setup import defer_muon_compile
defer_muon_compile()
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
print(sorted(m for m in sys.modules if m.startswith("torch._inductor")))
"""

# In a fresh process, DeepSpeed's decorator replaced by one that records what it wraps and
# compiles with the eager backend, so the test sees when each wrapper is built: one call of a
# kernel that calls another kernel, then one of that other kernel.
CALL_PROBE = """
import torch
from deepspeed.runtime import compiler
from llava_norm.train.deepspeed_setup import defer_muon_compile

built = []
def recording():
    def decorate(fn):
        built.append(fn.__name__)
        return torch.compile(fn, backend="eager")
    return decorate
compiler.compile = recording
defer_muon_compile()
assert compiler.compile is recording, "the decorator is put back"
from deepspeed.runtime.zero.muon import original_muon
print("at import:", built)
g = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
original_muon.muon_update(g.clone(), torch.zeros_like(g), ns_method="standard")
print("a kernel calling a kernel:", built)
built.clear()
out = original_muon.zeropower_via_newtonschulz5(g, 5)
print("after a call:", built, torch.equal(out, original_muon.zeropower_via_newtonschulz5.__wrapped__(g, 5)))
"""


def _run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_zeros_optimizer_check_no_longer_imports_torchs_inductor():
    assert _run(IMPORT_PROBE)[-1] == "[]"


def test_deepspeeds_muon_kernels_are_wrapped_at_their_first_call_as_before_inside_a_compiled_one():
    lines = _run(CALL_PROBE)
    assert "at import: []" in lines, lines
    # inside a compiled kernel the inner one is the plain function, traced by the outer compile
    assert "a kernel calling a kernel: ['muon_update']" in lines, lines
    # Muon itself: its kernel wrapped by DeepSpeed's decorator when first called, with the same result
    assert "after a call: ['zeropower_via_newtonschulz5'] True" in lines, lines
