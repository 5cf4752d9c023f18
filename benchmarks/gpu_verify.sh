#!/usr/bin/env bash
# The whole GPU check in one command, for a GPU machine without network (docs/gpu.md): set-up from the carried
# wheels (benchmarks/gpu_setup.sh), the CUDA-only tests, benchmarks/gpu_check.py's table, then the mpirun tests
# on this machine's GPUs; PARTS=setup,vs_trl runs the side-by-side with TRL instead. Each part has its own time
# limit and its own log in $OUT (default gpu-results/), so a part that fails or runs out of time costs the others
# nothing. PARTS picks some (comma-separated; set-up is skipped where agentrl and its dependencies already import).
#   OUT=dir [PARTS=setup,gpu_tests,gpu_check,mpi_tests REPEATS=3 SECTIONS=weights,tokens GPU_CHECK_S=300 ...] \
#     bash benchmarks/gpu_verify.sh
# On one H200 (16 cores, 2026-11-27): set-up 14 s, the CUDA tests 60 s, gpu_check about 4 minutes with REPEATS=2, the
# mpirun suite about 5 minutes with 10 workers. Within a 10-minute call, run it as two calls on one warm machine:
# PARTS=setup,gpu_tests,gpu_check REPEATS=2, then PARTS=setup,mpi_tests.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
PARTS=${PARTS:-setup,gpu_tests,gpu_check,mpi_tests}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 TRANSFORMERS_VERBOSITY=error

wanted() { [[ ",$PARTS," == *",$1,"* ]]; }

part() {
    local name=$1 limit=$2 started rc
    shift 2
    started=$(date +%s)
    timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc after $(($(date +%s) - started)) s (limit $limit s)"
    tail -n "${TAIL_LINES:-15}" "$OUT/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if wanted setup; then
    if python3 -c 'import agentrl, pydantic, gymnasium, datasets, fastapi, mpi4py.MPI' 2>/dev/null; then
        echo "== setup: agentrl and its dependencies import already"
    else
        part setup "${SETUP_S:-150}" bash benchmarks/gpu_setup.sh
    fi
fi
prefix=$(python3 -c 'import sys; print(sys.prefix)')
export PATH="$prefix/bin:$PATH" PYTHONPATH="$PWD"  # PYTHONPATH: agentrl imports even where the editable install failed
# The wheels put MPICH beside python3, where mpi4py finds it by itself (setting MPI4PY_LIBMPI to its path broke the
# import on an H200 image: "libmpi.so.12: cannot open shared object file").
echo "mpirun: $(command -v mpirun)"
mpirun -n 2 python3 -c 'from mpi4py import MPI; print("mpi4py sees", MPI.COMM_WORLD.Get_size(), "ranks")'
if wanted gpu_tests; then
    part gpu_tests "${GPU_TESTS_S:-120}" python3 -m pytest -q -p no:cacheprovider -rs \
        tests/unit/test_continuous_engine.py tests/unit/test_weights_nccl.py tests/mpi/test_weight_sync_cuda_ipc.py \
        -k "cuda_graph or cuda_ipc_reaches or ipc_handle or two_readers"
fi
if wanted gpu_check; then
    part gpu_check "${GPU_CHECK_S:-300}" python3 benchmarks/gpu_check.py --repeats "${REPEATS:-3}" \
        --out "$OUT/gpu_check.md" ${SECTIONS:+--sections "$SECTIONS"}
fi
if wanted vs_trl; then
    # TRL's GRPOTrainer and agentrl train the 0.5B shape on the GPU (docs/performance.md); the runs' logs and
    # results in $OUT/vs_trl.tgz
    part vs_trl "${VS_TRL_S:-430}" python3 benchmarks/vs_trl.py --shape "${VS_TRL_SHAPE:-qwen0.5b}" \
        --trl-python "${VS_TRL_PYTHON:-python3}" --tasks ${VS_TRL_TASKS:-digit guess} --seeds ${VS_TRL_SEEDS:-0} \
        --steps "${VS_TRL_STEPS:-20}" --warmup 5 \
        --sides ${VS_TRL_SIDES:-trl agentrl-1 agentrl-1cp agentrl-2acp} --out /tmp/vs-trl --report "$OUT/vs_trl.md"
    tar czf "$OUT/vs_trl.tgz" -C /tmp/vs-trl logs results
fi
if wanted mpi_tests; then
    # -v: a line per test as it ends, and each failure's report in mpi_failures.log as it happens, so a run cut
    # short by its limit still says which passed and why the others failed. Every rank starts cold, as a user's
    # does (no forks of a preloaded parent: tests/mpi/forkserver.py), so CUDA is first touched in the rank itself.
    AGENTRL_TEST_FORKSERVER=0 AGENTRL_FAILURE_LOG="$OUT/mpi_failures.log" part mpi_tests "${MPI_TESTS_S:-420}" python3 -m pytest -v \
        -p no:cacheprovider -n "${MPI_WORKERS:-10}" -rfE --durations=15 tests/mpi
    echo "mpi_tests: $(grep -c ' PASSED' "$OUT/mpi_tests.log") passed, $(grep -c ' SKIPPED' "$OUT/mpi_tests.log") skipped," \
        "$(grep -cE ' (FAILED|ERROR)' "$OUT/mpi_tests.log") failed or errors"
fi
