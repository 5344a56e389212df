#!/usr/bin/env bash
# Downloads into .whl/ the wheels bench/gpu_kit.sh installs on a GPU machine that has torch,
# tokenizers, safetensors, huggingface_hub, PIL, numpy and matplotlib but not the rest (Python 3.12,
# x86-64 Linux; set PYVER for another Python).
# DeepSpeed publishes no wheel: it is built here from its source release, ops off.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PYVER="${PYVER:-3.12}"
PY="${PYTHON:-python3}"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    "$(grep '^transformers==' requirements.txt)" "$(grep '^omegaconf==' requirements.txt)" \
    "$(grep '^peft==' requirements.txt)" "$(grep '^accelerate==' requirements.txt)" \
    hjson einops msgpack py-cpuinfo ninja pydantic pydantic-core annotated-types typing-inspection liger-kernel
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps -w .whl "$(grep '^deepspeed==' requirements.txt)"
ls .whl
