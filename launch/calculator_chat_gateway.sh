#!/usr/bin/env bash
# The calculator SFT-then-RL demo in a model family's chat format, RL through the gateway with the openai-SDK agent
# (docs/chat-formats.md, "It learns in three formats"):
#   bash launch/calculator_chat_gateway.sh FAMILY [key=value ...]     # FAMILY: qwen3, llama3 or mistral
# SFT first when runs/calculator_FAMILY_sft/final is missing; extra overrides go to the RL command (seed=1
# run_dir=... for another seed).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export OMP_NUM_THREADS=1
family=${1:?usage: launch/calculator_chat_gateway.sh FAMILY [key=value ...]}
shift
config=launch/configs/calculator_${family}_gateway.yaml
[ -f "$config" ] || { echo "no $config: FAMILY is one of qwen3, llama3, mistral" >&2; exit 2; }
run_dir=runs/calculator_${family}_gateway
for arg in "$@"; do case $arg in run_dir=*) run_dir=${arg#run_dir=};; esac; done
[ -d "runs/calculator_${family}_sft/final" ] || agentrl sft "launch/configs/calculator_${family}_sft.yaml"
python examples/openai_agent/service.py "$run_dir" --concurrency 32 &
service=$!
trap 'kill $service 2>/dev/null || true' EXIT
mpirun -n 3 agentrl train "$config" "$@"
wait $service
