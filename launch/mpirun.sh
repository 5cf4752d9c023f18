#!/usr/bin/env bash
# mpirun -n N agentrl train CONFIG [key=value ...], for MPICH or Open MPI.
# Open MPI needs --oversubscribe on small machines and --allow-run-as-root as root.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: launch/mpirun.sh NPROCS CONFIG [key=value ...]" >&2
  exit 2
fi
np=$1; shift
extra=()
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  extra+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec mpirun "${extra[@]}" -n "$np" agentrl train "$@"
