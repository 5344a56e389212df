#!/usr/bin/env bash
# Chain stage 1 -> stage 2 -> evaluation -> results table for a list of arms; a finished step is reused
# only when its provenance record matches what it would compute now (see README, "Provenance").
# Usage: scripts/pipeline.sh [options] ARM_CONFIG_DIR...   (the first arm is the baseline)
#   e.g. EVAL_DATA=/datasets/eval scripts/pipeline.sh --runs runs/llama \
#          configs/llama3.2-3b/none configs/llama3.2-3b/ln_textnorm configs/llama3.2-3b/ln_textnorm_gwc
# Options: --runs DIR, --data-root DIR, --benchmarks a,b, --stage1 K=V, --stage2 K=V, --eval-arg ARG,
#          --table PREFIX, --stream, --code-counts, --reuse-stale. Training and evaluation use GPUS_PER_NODE / NNODES like the other scripts.
set -euo pipefail
# the paths you type are read from here; the chain runs in the checkout (the configs' own paths)
export LLAVA_NORM_CALLED_FROM="$PWD"
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" -m llava_norm.cli pipeline "$@"
