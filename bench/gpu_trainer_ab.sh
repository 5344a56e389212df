#!/usr/bin/env bash
# Why `llava-norm train` ran at a sixth of gpu_step.py's tokens/s (bench/RESULTS.md), in one device
# call: the chunked loss's softmax eager against compiled (fused_loss.py), then the kit's 3B ZeRO-2
# trainer run three times, each with its last steps profiled (GPU-busy share, device and host
# tables) and the allocator's retries logged:
#   A  as shipped;  B  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;  C  B with train.compile.
# Each result is copied into $OUT as soon as it exists; every step has its own deadline inside
# BUDGET_S. Needs the carried wheels (bash bench/gpu_kit_wheels.sh; carry .whl).
set -uo pipefail
cd "$(dirname "$0")/.."
END=$((SECONDS + ${BUDGET_S:-560}))
OUT="${OUT:-runs/gpu_trainer_ab}"
WORK=/tmp/llava-norm-ab
mkdir -p "$OUT" "$WORK"
SITE="${KIT_SITE:-/tmp/llava-norm-kit-site}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 2
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
cap() { local l=$((END - SECONDS - $2)); l=$((l > 30 ? l : 30)); echo $(($1 < l ? $1 : l)); }  # want, reserved after

timeout "$(cap 100 400)" python3 bench/fused_loss.py --device cuda --dtype bf16 --repeats 10 --kinds torch \
    --chunk-mib 512 1024 --softmax eager compiled 2>&1 | tee "$OUT/fused.txt" | grep -v Warning

trainer() {  # name, deadline, extra env..., then the run
    local name=$1 deadline=$2 run=$3; shift 3
    env "$@" python3 bench/gpu_kit.py --only train --train-runs "$run" --deadline-s "$deadline" \
        --out "$WORK/$name" --work "$WORK/kit" 2>&1 | grep -E "^\[train\] |profile:|results:|Error" | tail -12
    cp "$WORK/$name/gpu_kit.json" "$OUT/$name.json" 2>/dev/null
    cp "$WORK/$name/train_$run.log" "$OUT/$name.log" 2>/dev/null
}
trainer A "$(cap 190 270)" llama3b_zero2 -u PYTORCH_CUDA_ALLOC_CONF
trainer B "$(cap 130 140)" llama3b_zero2 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
trainer C "$(cap 200 5)" llama3b_zero2_compiled PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
echo "done with $((END - SECONDS)) s of the budget left"
