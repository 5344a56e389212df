# Sourced by the sbatch examples in this folder: the rendezvous every node's torchrun agent joins.
# MASTER_ADDR is the job's first node; MASTER_PORT is the job's own, so jobs sharing a node do
# not collide; a requeued job gets the same port and resumes from its last complete checkpoint.
# Both are set whatever the environment holds: sbatch hands the submitting shell's on, and a
# MASTER_ADDR left there (a login node's, another job's) would have every node wait for it.
: "${SLURM_JOB_ID:?submit this with sbatch}"
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 40000))
export NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
# sbatch hands the submitting shell's environment on: a GPUS_PER_NODE left there from other work
# would launch that many processes on the GPUs Slurm gave this job.
if [ -n "${GPUS_PER_NODE:-}" ] && [ -n "${SLURM_GPUS_ON_NODE:-}" ] && [ "$GPUS_PER_NODE" != "$SLURM_GPUS_ON_NODE" ]; then
  echo "GPUS_PER_NODE=$GPUS_PER_NODE (from the environment the job was submitted with) but Slurm gave this" \
       "job $SLURM_GPUS_ON_NODE GPUs per node (SLURM_GPUS_ON_NODE): unset GPUS_PER_NODE before sbatch" >&2
  exit 2
fi
export GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}

# one task per node, each a torchrun agent of GPUS_PER_NODE processes (scripts/_launch.sh)
on_every_node() {
  srun --nodes="$NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c 'NODE_RANK="$SLURM_NODEID" exec "$@"' _ "$@"
}
