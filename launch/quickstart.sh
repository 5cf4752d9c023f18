#!/usr/bin/env bash
# Set up (if needed) and train the quickstart on 4 MPI ranks: 1 trainer, 2 rollout, 1 env.
# Extra arguments are config overrides, e.g.  bash launch/quickstart.sh steps=50
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec bash launch/mpirun.sh 4 launch/configs/quickstart.yaml "$@"
