#!/usr/bin/env bash
# sbatch --array=0-N%K slurm/sweep.sh SPEC     (or let `agentrl sweep SPEC --slurm` submit it)
#
# One array task per trial of the sweep's budget (N = trials - 1), K at a time. Each task asks
# the sweep's study (a file journal in sweep_dir, locked for concurrent tasks) for its trial:
# one whose job died or was stopped is resumed in its own run folder first, else a new one
# is drawn. The first task to arrive checks the spec and starts the sweep folder. Each task
# needs the spec's `ranks` tasks (`--ntasks`), e.g. for ranks: 4
#   sbatch --array=0-15%4 --ntasks=4 slurm/sweep.sh launch/sweeps/quickstart_lr.yaml
#
# Environment:
#   AGENTRL_VENV=PATH   virtual environment to activate (default: .venv in the submit directory)
#
# Preemption and time limits, as slurm/train.sh: USR1 (120 s before the limit) or SIGTERM stops
# the trial with a checkpoint (exit 75); after USR1 this script requeues the task, which then
# claims the stopped trial again and resumes it. `agentrl sweep status SWEEP_DIR` shows the table.
#
#SBATCH --job-name=agentrl-sweep
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --time=01:00:00
#SBATCH --output=slurm-%x-%A_%a.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
set -uo pipefail
if [ $# -ne 1 ]; then
  echo "usage: sbatch --array=0-N%K slurm/sweep.sh SPEC" >&2
  exit 2
fi
spec=$1
cd "${SLURM_SUBMIT_DIR:-$(pwd)}" || exit 1
venv=${AGENTRL_VENV:-.venv}
# shellcheck disable=SC1091
[ -f "$venv/bin/activate" ] && . "$venv/bin/activate"
stopped=75
task="${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-none}}_${SLURM_ARRAY_TASK_ID:-0}"
echo "agentrl: sweep task $task restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST:-$(hostname)}: $(date -u)"

# The signal goes to this shell only (--signal=B:...); pass it on to the task, which stops its trial.
received=""
forward() {
  received=$1
  echo "agentrl: sweep task got SIG$1, forwarding it (pid $pid)"
  kill -s "$1" "$pid" 2>/dev/null
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
agentrl sweep task "$spec" &
pid=$!
while true; do
  wait "$pid"
  status=$?
  kill -0 "$pid" 2>/dev/null || break
done

if [ "$status" = "$stopped" ] && [ "$received" = USR1 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
  echo "agentrl: trial stopped before the time limit; requeueing task $task to resume it"
  scontrol requeue "$SLURM_JOB_ID" && exit 0
fi
exit "$status"
