#!/usr/bin/env bash
# sbatch slurm/train.sh CONFIG [key=value ...]
# One SPMD job: the config's layout must add up to nodes x tasks per node.
#SBATCH --job-name=agentrl
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=1
#SBATCH --time=01:00:00
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: sbatch slurm/train.sh CONFIG [key=value ...]" >&2
  exit 2
fi
cd "${SLURM_SUBMIT_DIR:-$(pwd)}"
[ -f .venv/bin/activate ] && . .venv/bin/activate
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
# AGENTRL_LAUNCHER=srun uses SLURM's PMI; the default runs the venv's mpirun inside the allocation.
if [ "${AGENTRL_LAUNCHER:-mpirun}" = srun ]; then
  exec srun --mpi="${AGENTRL_SRUN_MPI:-pmi2}" agentrl train "$@"
fi
exec mpirun -n "${SLURM_NTASKS:-4}" agentrl train "$@"
