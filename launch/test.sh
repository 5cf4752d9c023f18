#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: unit tests and real mpirun jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
. .venv/bin/activate
export OMP_NUM_THREADS=1
python -m compileall -q agentrl envs tests >/dev/null  # each mpirun rank then reads bytecode, not source
python -m pytest -q -n "${AGENTRL_TEST_WORKERS:-2}" --dist loadgroup --durations=30 "$@" tests
