#!/usr/bin/env bash
# The GPU kit (bench/gpu_kit.py) with the machine's own torch and triton, and the wheels carried in
# .whl/ (bench/gpu_kit_wheels.sh writes them) installed into a scratch site first. PART=1 or PART=2
# runs one half. Without .whl/ it stops at once, unless KIT_NO_WHEELS=1 (a machine with everything).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
ARGS=("$@")
if [ -n "${PART:-}" ]; then ARGS=(--part "$PART" "${ARGS[@]}"); fi
WHEELS="${KIT_WHEELS:-.whl}"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    SITE="${KIT_SITE:-/tmp/llava-norm-kit-site}"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
elif [ "${KIT_NO_WHEELS:-0}" != 1 ]; then
    echo "gpu_kit: no wheels in $WHEELS/: run 'bash bench/gpu_kit_wheels.sh' here and carry .whl (or KIT_NO_WHEELS=1)" >&2
    exit 2
fi
export PYTHONUNBUFFERED=1
exec "$PY" bench/gpu_kit.py "${ARGS[@]}"
