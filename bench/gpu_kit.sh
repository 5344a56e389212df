#!/usr/bin/env bash
# The GPU kit (bench/gpu_kit.py) with the machine's own torch and triton, and the wheels carried in
# .whl/ installed into a scratch site first (bench/_kit_site.sh). PART=1 or PART=2 runs one half.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
ARGS=("$@")
if [ -n "${PART:-}" ]; then ARGS=(--part "$PART" "${ARGS[@]}"); fi
source bench/_kit_site.sh
exec "$PY" bench/gpu_kit.py "${ARGS[@]}"
