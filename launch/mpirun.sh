#!/usr/bin/env bash
# mpirun -n N agentrl train CONFIG [key=value ...], for MPICH or Open MPI.
# MPIRUN=/path/to/mpirun picks the launcher (default: the first mpirun on PATH, the venv's when it is active).
# Open MPI needs --oversubscribe on small machines and --allow-run-as-root as root; the venv's
# mpi4py loads the Open MPI library (MPI4PY_LIBMPI) instead of the pip MPICH it defaults to.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: launch/mpirun.sh NPROCS CONFIG [key=value ...]" >&2
  exit 2
fi
np=$1; shift
mpirun=${MPIRUN:-mpirun}
extra=()
if "$mpirun" --version 2>/dev/null | grep -q "Open MPI"; then
  extra+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
  export MPI4PY_LIBMPI=${MPI4PY_LIBMPI:-libmpi.so.40}
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$mpirun" "${extra[@]}" -n "$np" agentrl train "$@"
