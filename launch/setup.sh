#!/usr/bin/env bash
# Create .venv and install agentrl with a pip-installed MPI (MPICH) and the test tools.
# Idempotent: a second run only checks what is there. Override the interpreter with PYTHON=...
# Installs with uv (parallel downloads, about 20 s on a fresh machine instead of minutes), reading pip's own
# settings (find-links, extra indexes, constraints); falls back to pip when uv cannot be had. AGENTRL_PIP=1 forces pip.
# Bytecode is compiled here, as pip does at install: uv skips it, and where PYTHONDONTWRITEBYTECODE=1 no process
# writes it later, so every rank would compile torch and transformers from source at each start (2.4x the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
# Pin torch: an unpinned torch pulls the multi-GB CUDA build on CPU-only machines.
packages=("torch==${TORCH_VERSION:-2.13.0}" -e ".[dev,mpich]")

install_with_uv() {
  [ -x .venv/bin/uv ] || python -m pip install -q uv >/dev/null 2>&1 || return 1
  local args=(--python .venv/bin/python --quiet --no-progress)
  local value
  for link in $(pip config get global.find-links 2>/dev/null) ${PIP_FIND_LINKS:-}; do args+=(--find-links "$link"); done
  value=$(pip config get global.index-url 2>/dev/null || true)
  if [ -n "${PIP_INDEX_URL:-$value}" ]; then args+=(--index-url "${PIP_INDEX_URL:-$value}"); fi
  for url in $(pip config get global.extra-index-url 2>/dev/null) ${PIP_EXTRA_INDEX_URL:-}; do args+=(--extra-index-url "$url"); done
  for file in $(pip config get global.constraint 2>/dev/null) ${PIP_CONSTRAINT:-}; do
    if [ -f "$file" ]; then args+=(--constraint "$file"); fi
  done
  uv pip install "${args[@]}" "${packages[@]}"
}

if [ -n "${AGENTRL_PIP:-}" ] || ! install_with_uv; then
  [ -n "${AGENTRL_PIP:-}" ] || echo "uv unavailable or failed; installing with pip" >&2
  python -m pip install -q --upgrade pip
  python -m pip install -q "${packages[0]}"
  python -m pip install -q "${packages[@]:1}"
fi
python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
echo "agentrl installed in $(pwd)/.venv ($(python -c 'import torch, mpi4py; print("torch", torch.__version__, "mpi4py", mpi4py.__version__)'))"
