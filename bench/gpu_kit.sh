#!/usr/bin/env bash
# The GPU kit in one command (bench/gpu_kit.py), with the machine's own torch and transformers.
# Wheels carried in .whl/ (bench/gpu_kit_wheels.sh writes them; the device tool's README says how
# to carry them) are installed into a scratch site first, for what the machine lacks (DeepSpeed,
# OmegaConf, this repo's transformers pin, liger-kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
    SITE="${KIT_SITE:-/tmp/llava-norm-kit-site}"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec "$PY" bench/gpu_kit.py "$@"
