#!/usr/bin/env bash
# mpirun -n N agentrl train CONFIG [key=value ...], for MPICH or Open MPI.
#
#   bash launch/mpirun.sh [--max-restarts N] NPROCS CONFIG [key=value ...]
#
# MPIRUN=/path/to/mpirun picks the launcher (default: the first mpirun on PATH, the venv's when it is active).
# Open MPI needs --oversubscribe on small machines and --allow-run-as-root as root; the venv's
# mpi4py loads the Open MPI library (MPI4PY_LIBMPI) instead of the pip MPICH it defaults to.
# --max-restarts N (or AGENTRL_MAX_RESTARTS=N): when the job crashes (a rank killed, out of memory),
# start it again with resume=true, up to N times (`agentrl supervise`; the first wait is
# AGENTRL_RESTART_BACKOFF_S seconds, default 3, doubling each time). A stop by a signal (exit 75),
# a user error (2) or Ctrl-C (130) is never restarted.
set -euo pipefail
max_restarts=${AGENTRL_MAX_RESTARTS:-0}
if [ "${1:-}" = --max-restarts ]; then
  max_restarts=${2:?--max-restarts needs a number}
  shift 2
fi
if [ $# -lt 2 ]; then
  echo "usage: launch/mpirun.sh [--max-restarts N] NPROCS CONFIG [key=value ...]" >&2
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
command=("$mpirun" "${extra[@]}" -n "$np" agentrl train "$@")
if [ "$max_restarts" -gt 0 ]; then
  exec agentrl supervise --max-restarts "$max_restarts" --backoff-s "${AGENTRL_RESTART_BACKOFF_S:-3}" -- "${command[@]}"
fi
exec "${command[@]}"
