#!/usr/bin/env bash
# The demonstration end to end: SFT, then RL of the calculator agent (a service on the openai SDK) through the gateway.
#   bash examples/openai_agent/run.sh [key=value ...]      # extra overrides go to the RL command
set -euo pipefail
cd "$(dirname "$0")/../.."
. .venv/bin/activate
export OMP_NUM_THREADS=1
run_dir=runs/openai_agent_rl
for arg in "$@"; do case $arg in run_dir=*) run_dir=${arg#run_dir=};; esac; done
[ -d runs/calculator_sft/final ] || agentrl sft launch/configs/calculator_sft.yaml
python examples/openai_agent/service.py "$run_dir" --concurrency 32 &
service=$!
trap 'kill $service 2>/dev/null || true' EXIT
mpirun -n 3 agentrl train examples/openai_agent/rl.yaml "$@"
wait $service
