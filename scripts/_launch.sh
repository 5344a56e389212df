#!/usr/bin/env bash
# Shared launcher: single process, or torchrun over GPUS_PER_NODE x NNODES (Slurm sets the rest).
#   GPUS_PER_NODE  processes per node (default: visible GPUs, else 1; set 2 on CPU to test DeepSpeed)
#   NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT  multi-node rendezvous (defaults: 1, 0, -, 29500;
#   several nodes need MASTER_ADDR, the first node's address: scripts/slurm/_nodes.sh sets it)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if [ -z "${GPUS_PER_NODE:-}" ]; then
  GPUS_PER_NODE=$("$PY" -c 'import torch; print(max(torch.cuda.device_count(), 1))')
fi
NNODES=${NNODES:-${SLURM_NNODES:-1}}
NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-0}}
for name in GPUS_PER_NODE NNODES; do  # a count torchrun would meet as its own traceback
  case "${!name}" in
    ''|0*|*[!0-9]*) echo "$(basename "$0"): $name=${!name}: expected a whole number of at least 1" >&2; exit 2 ;;
  esac
done
if [ "$GPUS_PER_NODE" -eq 1 ] && [ "$NNODES" -eq 1 ]; then
  exec "$PY" -m llava_norm.cli "$@"
fi
if [ "$NNODES" -gt 1 ] && [ -z "${MASTER_ADDR:-}" ]; then
  echo "$(basename "$0"): NNODES=$NNODES needs MASTER_ADDR, the first node's address (under Slurm:" \
       "scontrol show hostnames \"\$SLURM_JOB_NODELIST\" | head -n 1; scripts/slurm/_nodes.sh sets it)" >&2
  exit 2
fi
# One node's processes meet on this machine: a MASTER_ADDR left in the environment from other
# work would have them wait for another host.
[ "$NNODES" -eq 1 ] && MASTER_ADDR=127.0.0.1
exec "$PY" -m torch.distributed.run --nproc_per_node="$GPUS_PER_NODE" --nnodes="$NNODES" \
  --node_rank="$NODE_RANK" --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${MASTER_PORT:-29500}" \
  -m llava_norm.cli "$@"
