"""What a launch sets in DeepSpeed before it initialises (``llava_norm.train.deepspeed_setup``);
the checkpoint loads that unpickle no code are tested in test_relaunch.py and test_world_size.py."""

import subprocess
import sys

from launch import REPO, env

# In a fresh process: the import of Muon's module that ZeRO's optimizer check makes, then one call
# of a Muon kernel. DeepSpeed's compile decorator is replaced first by one that records what it
# wraps and compiles with the eager backend, so the test sees when the wrapper is built.
PROBE = """
import sys, torch
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
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam  # what ZeRO's check imports
from deepspeed.runtime.zero.muon import original_muon
print("at import:", built, "torch._inductor.compile_fx" in sys.modules)
g = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
out = original_muon.zeropower_via_newtonschulz5(g, 5)
eager = original_muon.zeropower_via_newtonschulz5.__wrapped__(g, 5)
print("after a call:", built, torch.equal(out, eager))
"""


def test_deepspeeds_muon_kernels_are_wrapped_at_their_first_call_not_when_zero_imports_them():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # nothing compiled and torch's inductor not imported by the import ZeRO makes
    assert "at import: [] False" in lines, done.stdout
    # Muon itself: its kernel wrapped by DeepSpeed's decorator when first called, with the same result
    assert "after a call: ['zeropower_via_newtonschulz5'] True" in lines, done.stdout
