#!/usr/bin/env bash
# Evaluate one checkpoint, data-parallel over GPUS_PER_NODE processes (see _launch.sh).
# Usage: scripts/eval.sh CHECKPOINT [BENCHMARKS] [llava-norm eval options ...]
#   BENCHMARKS   comma-separated names or "all" (default)
#   EVAL_DATA    data root with one sub-directory per benchmark (default: data/eval; see eval/README.md)
# e.g. EVAL_DATA=/datasets/eval scripts/eval.sh runs/llama/ln_textnorm_gwc/stage2/model pope,mmlu --option mmlu.num_fewshot=5
set -euo pipefail
checkpoint=${1:?usage: scripts/eval.sh CHECKPOINT [BENCHMARKS] [options ...]}; shift
# a folder named from where you call it (a hub id stays one); _launch.sh runs from the repository root
[ -e "$checkpoint" ] && checkpoint="$(cd "$(dirname "$checkpoint")" && pwd)/$(basename "$checkpoint")"
benchmarks=all
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then benchmarks=$1; shift; fi
exec "$(dirname "$0")/_launch.sh" eval "$checkpoint" --benchmarks "$benchmarks" \
  --data-root "${EVAL_DATA:-data/eval}" "$@"
