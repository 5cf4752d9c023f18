#!/usr/bin/env bash
# sbatch slurm/train.sh CONFIG [key=value ...]
#
# One SPMD job: the config's layout (trainer + rollout + env ranks; with layout.hybrid, layout.trainer) must add up to
# nodes x ntasks-per-node. Options given to sbatch override the defaults below, e.g.
#   sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 slurm/train.sh CONFIG layout.trainer=8 layout.rollout=8 layout.env=0
#
# Environment:
#   AGENTRL_LAUNCHER=mpirun|srun   mpirun (default): the venv's MPI inside the allocation;
#                                  srun: SLURM starts the ranks itself (needs an MPI built with PMI support)
#   AGENTRL_SRUN_MPI=pmi2|pmix     the PMI plugin srun uses (default pmi2)
#   AGENTRL_VENV=PATH              virtual environment to activate (default: .venv in the submit directory)
#   AGENTRL_MAX_RESTARTS=N         after a crash (a rank killed, out of memory, a lost node) start the
#                                  launcher again with resume=true, up to N times (default 0; `agentrl supervise`)
#   AGENTRL_RESTART_BACKOFF_S=S    wait before the first restart, doubling each time (default 3)
#
# Preemption and time limits: 120 s before the limit SLURM sends USR1 to this script, which
# forwards it to the launcher; the ranks finish the current step, write a checkpoint, and
# exit 75 (agentrl.run.preempt.EXIT_STOPPED); this script then requeues the job. SIGTERM
# (scancel, preemption, `scontrol requeue`) is forwarded the same way but does not requeue:
# SLURM decides that. Every start passes resume=true, so a requeued job continues at the
# last checkpoint with the same config.
#
#SBATCH --job-name=agentrl
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=1
#SBATCH --time=01:00:00
#SBATCH --output=slurm-%x-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: sbatch slurm/train.sh CONFIG [key=value ...]" >&2
  exit 2
fi
config=$1; shift
cd "${SLURM_SUBMIT_DIR:-$(pwd)}" || exit 1
if [ ! -f launch/mpirun.sh ]; then
  echo "agentrl: submit from the agentrl checkout (no launch/mpirun.sh in $(pwd)); or sbatch --chdir=CHECKOUT" >&2
  exit 2
fi
venv=${AGENTRL_VENV:-.venv}
# shellcheck disable=SC1091
[ -f "$venv/bin/activate" ] && . "$venv/bin/activate"
stopped=75

export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
ntasks=${SLURM_NTASKS:-4}
nodes=${SLURM_JOB_NUM_NODES:-1}
per_node=${SLURM_NTASKS_PER_NODE:-$(( (ntasks + nodes - 1) / nodes ))}
per_node=${per_node%%(*}  # "4(x2)" -> "4"
echo "agentrl: job ${SLURM_JOB_ID:-none} restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST:-$(hostname)}: $(date -u)"
hosts=()  # several nodes: the plan names them, as the job's own table will (block placement, per_node each)
if [ "$nodes" -gt 1 ] && [ -n "${SLURM_JOB_NODELIST:-}" ]; then
  hosts=(--hosts "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\$/:$per_node/" | paste -sd,)")
fi
agentrl layout "$config" "$@" --np "$ntasks" --ranks-per-node "$per_node" --gpus-per-node "${SLURM_GPUS_ON_NODE:-0}" \
  "${hosts[@]}" || exit 2

launcher=${AGENTRL_LAUNCHER:-mpirun}
max_restarts=${AGENTRL_MAX_RESTARTS:-0}
case $launcher in
  srun) command=(srun --mpi="${AGENTRL_SRUN_MPI:-pmi2}" --kill-on-bad-exit=1 agentrl train "$config" "$@" resume=true) ;;
  mpirun) command=(bash launch/mpirun.sh "$ntasks" "$config" "$@" resume=true) ;;
  *) echo "AGENTRL_LAUNCHER=$launcher: use srun or mpirun" >&2; exit 2 ;;
esac
if [ "$max_restarts" -gt 0 ]; then  # the supervisor passes USR1/TERM on to the launcher like a launcher would
  command=(env AGENTRL_MAX_RESTARTS=0 agentrl supervise --max-restarts "$max_restarts"
    --backoff-s "${AGENTRL_RESTART_BACKOFF_S:-3}" -- "${command[@]}")
fi

# A signal sent only to this shell (--signal=B:...) is passed on to the launcher, which
# passes it to every rank; `wait` returns early on each trapped signal, so wait again.
received=""
forward() {
  received=$1
  echo "agentrl: job script got SIG$1, forwarding it to the $launcher (pid $pid)"
  kill -s "$1" "$pid" 2>/dev/null
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
"${command[@]}" &
pid=$!
while true; do
  wait "$pid"
  status=$?
  kill -0 "$pid" 2>/dev/null || break
done

if [ "$status" = "$stopped" ] && [ "$received" = USR1 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
  echo "agentrl: stopped before the time limit; requeueing job $SLURM_JOB_ID to resume"
  scontrol requeue "$SLURM_JOB_ID" && exit 0
fi
exit "$status"
