"""Under mpirun on a GPU: CUDA IPC from the trainer leader to two readers on its GPU (skipped without CUDA)."""

import pytest
import torch

from tests.mpi.helpers import assert_ok, script

pytestmark = pytest.mark.mpi


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU; this machine has none")
def test_cuda_ipc_reaches_two_readers_on_the_writers_gpu_bit_for_bit(tiny_model_dir):
    result = script(3, "weight_sync_cuda_ipc.py", str(tiny_model_dir), timeout=240)
    assert_ok(result)
    assert result.stdout.count("holds every version bit for bit") == 2
    assert "writer used 2 generations of handles" in result.stdout
