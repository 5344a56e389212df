#!/usr/bin/env bash
# Shared launcher: single process, or torchrun over GPUS_PER_NODE x NNODES (Slurm sets the rest).
#   GPUS_PER_NODE  processes per node (default: visible GPUs, else 1; set 2 on CPU to test DeepSpeed)
#   NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT  multi-node rendezvous (defaults: 1, 0, 127.0.0.1, 29500)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if [ -z "${GPUS_PER_NODE:-}" ]; then
  GPUS_PER_NODE=$("$PY" -c 'import torch; print(max(torch.cuda.device_count(), 1))')
fi
NNODES=${NNODES:-${SLURM_NNODES:-1}}
NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-0}}
if [ "$GPUS_PER_NODE" -eq 1 ] && [ "$NNODES" -eq 1 ]; then
  exec "$PY" -m llava_norm.cli "$@"
fi
exec "$PY" -m torch.distributed.run --nproc_per_node="$GPUS_PER_NODE" --nnodes="$NNODES" \
  --node_rank="$NODE_RANK" --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${MASTER_PORT:-29500}" \
  -m llava_norm.cli "$@"
