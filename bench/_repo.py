"""This checkout's root, first on ``sys.path``: ``python bench/x.py`` would otherwise import
whichever ``llava_norm`` the venv was installed from. Kept apart from ``_harness`` so that a
script that only launches others (the GPU kit, the loss benchmark's parent) starts without
torch and transformers."""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
