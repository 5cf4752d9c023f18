"""Under mpirun: adapter-only syncs over mpi and shm hold PEFT's merge; a damaged one stops every rank."""

import pytest

from tests.mpi.helpers import assert_ok, script

pytestmark = pytest.mark.mpi
pytest.importorskip("peft")


def test_adapter_syncs_merge_as_peft_and_a_damaged_one_stops_every_rank(tiny_model_dir):
    """Over shm (the CPU default; tests/mpi/test_lora_mpi.py resumes over mpi): three ranks, two versions."""
    result = script(3, "lora_sync.py", str(tiny_model_dir), "shm", timeout=120)
    assert_ok(result)
    for rank in (1, 2):
        assert f"rank {rank}: version 1 holds PEFT's merge" in result.stdout
    for rank in (0, 1, 2):
        assert f"rank {rank}: StaleWeights at version 2" in result.stdout, result.stdout
    assert result.stdout.count("rollout rank 1 (weight-group rank 2) holds version 2 with adapter checksum") == 3
    assert "rollout rank 0 " not in result.stdout  # rank 1's engine got version 2 intact
