#!/usr/bin/env bash
# Installs agentrl's missing dependencies (pydantic, gymnasium, datasets, MPICH, mpi4py 4.1.2, ...) and agentrl itself, editable, into python3's own environment.
# For a GPU machine without network: it reads only the wheels in $WHEELS (default .whl, made with `pip download`, carried with the tree).
# Usage: [WHEELS=dir] bash benchmarks/gpu_setup.sh   (needs setuptools>=68 already in that environment, for the editable install)
set -euo pipefail

cd "$(dirname "$0")/.."
WHEELS="${WHEELS:-.whl}"

shopt -s nullglob
wheels=("$WHEELS"/*.whl)
shopt -u nullglob
if [ "${#wheels[@]}" -eq 0 ]; then
    echo "gpu_setup.sh: no wheels in '$WHEELS' (set WHEELS, or carry .whl)" >&2
    exit 1
fi

# Into the interpreter's own prefix (no --target): MPICH's libmpi.so.12 lands in <prefix>/lib, where mpi4py looks,
# and mpirun/mpiexec in <prefix>/bin.
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade "${wheels[@]}"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .

python3 -c 'import agentrl, mpi4py.MPI, pydantic, gymnasium, datasets; print(mpi4py.MPI.Get_library_version()[:40])'
if ! which mpirun; then
    bindir="$(python3 -c 'import os, sys; print(os.path.join(sys.prefix, "bin"))')"
    echo "gpu_setup.sh: mpirun is not on PATH; it was installed in $bindir: export PATH=$bindir:\$PATH" >&2
    exit 1
fi
