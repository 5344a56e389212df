#!/usr/bin/env bash
# Why `llava-norm train` runs below gpu_step.py's tokens/s (bench/RESULTS.md), in one device call:
# optionally fused_loss.py (FUSED_ARGS), then the kit's trainer run once per variant, each with its
# last steps profiled (GPU-busy share, device and host tables) and the allocator's retries logged.
#   bash bench/gpu_trainer_ab.sh NAME RUN "ENV..." "OVERRIDES..." [NAME RUN "ENV..." "OVERRIDES..."]...
# e.g. A llama3b_zero2 "" "train.cudnn_attention=null"  D llama3b_zero2 "" "" (torch's choice of
# sdpa kernels against the default, cuDNN's off)
# (ENV: env(1)'s arguments; OVERRIDES: llava-norm train's). Each result is copied into $OUT as soon
# as it exists ($OUT/NAME.json, NAME.log); the variants share BUDGET_S. Needs the carried wheels,
# as gpu_kit.sh does (bench/_kit_site.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
END=$((SECONDS + ${BUDGET_S:-560}))
OUT="${OUT:-runs/gpu_trainer_ab}"
WORK=/tmp/llava-norm-ab
mkdir -p "$OUT" "$WORK"
PY="${PYTHON:-python3}"
source bench/_kit_site.sh

if [ -n "${FUSED_ARGS:-}" ]; then
    # shellcheck disable=SC2086
    timeout "${FUSED_S:-100}" "$PY" bench/fused_loss.py --device cuda --dtype bf16 --repeats 10 $FUSED_ARGS 2>&1 \
        | grep -v Warning | tee "$OUT/fused.txt"
fi
while [ $# -ge 4 ]; do
    name=$1 run=$2 envs=$3 overrides=$4; shift 4
    # each later variant keeps RESERVE_S (a 3B variant took 110-140 s on the H200); this one may use
    # the rest (the first also writes the backbones, about 60 s), and what it leaves passes on
    left=$((END - SECONDS)); share=$((left - ${RESERVE_S:-150} * ($# / 4))); share=$((share > 60 ? share : 60))
    share=$((share < left ? share : left))
    # shellcheck disable=SC2086
    env $envs "$PY" bench/gpu_kit.py --only train --train-runs "$run" --deadline-s "$share" \
        --out "$WORK/$name" --work "$WORK/kit" ${overrides:+--train-overrides $overrides} 2>&1 \
        | grep -E "^\[train\] |profile:|results:|Error" | tail -12
    cp "$WORK/$name/gpu_kit.json" "$OUT/$name.json" 2>/dev/null
    cp "$WORK/$name/train_$run.log" "$OUT/$name.log" 2>/dev/null
done
echo "done with $((END - SECONDS)) s of the budget left"
