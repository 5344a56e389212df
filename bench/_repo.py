"""This checkout's root, first on ``sys.path``: ``python bench/x.py`` would otherwise import
whichever ``llava_norm`` the venv was installed from. Kept apart from ``_harness`` (which loads
torch, transformers and the model code) for the scripts that measure nothing in their own
process: the GPU kit's launcher, the loss benchmark's parent on a CPU, the start-up probe's
driver. The scripts that measure keep ``_harness``: their figures were taken with it loaded."""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
