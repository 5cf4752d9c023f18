#!/usr/bin/env bash
# Create .venv and install agentrl with a pip-installed MPI (MPICH) and the test tools.
# Idempotent: a second run only checks what is there. Override the interpreter with PYTHON=...
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# Pin torch first: an unpinned torch pulls the multi-GB CUDA build on CPU-only machines.
python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
python -m pip install -q -e ".[dev,mpich]"
echo "agentrl installed in $(pwd)/.venv ($(python -c 'import torch, mpi4py; print("torch", torch.__version__, "mpi4py", mpi4py.__version__)'))"
