#!/usr/bin/env bash
# The one-GPU recipe (docs/one_gpu_recipe.md): every arm x seeds 0,1,2 of SigLIP-base +
# Qwen2.5-0.5B-Instruct on slices of LLaVA-558K and LLaVA-NeXT, each evaluated on the first 500
# items of the nine benchmarks, then the table with intervals: runs/recipe-1gpu/results_stats.md.
# Needs LLAVA_DATA (data/README.md) and EVAL_DATA (eval/README.md). Rerunning resumes; any
# argument is passed on to `llava-norm sweep` (a later --seeds, --runs, ... wins).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export GPUS_PER_NODE=${GPUS_PER_NODE:-1}
exec "$PY" -m llava_norm.cli sweep configs/recipe-1gpu --seeds 0,1,2 --runs runs/recipe-1gpu \
  --eval-arg=--limit=500 "$@"
