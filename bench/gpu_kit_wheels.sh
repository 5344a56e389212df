#!/usr/bin/env bash
# Empties .whl/ and downloads into it the wheels pinned in bench/gpu_kit_wheels.txt, for the GPU
# machine (Python 3.12, x86-64 Linux; PYVER for another Python). deepspeed publishes no wheel: it
# is built here from its source release with its ops off (they JIT-build on the GPU when used).
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${PYVER:-3.12}"
PY="${PYTHON:-python3}"
rm -rf .whl && mkdir -p .whl
mapfile -t PINS < <(grep -v '^#' bench/gpu_kit_wheels.txt | grep -v '^deepspeed==' | grep .)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${PINS[@]}"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps -w .whl "$(grep '^deepspeed==' bench/gpu_kit_wheels.txt)"
du -sh .whl && ls .whl
