"""PPO's critic under mpirun: two trainer ranks (replicas, or FSDP2 shards) equal one rank on the whole batch,
and the critic's checkpoint resumes identically."""

import pytest

from tests.mpi.helpers import assert_ok, script

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("flags", [(), ("fsdp",)], ids=["replicas", "fsdp"])
def test_ppo_on_two_ranks_equals_one_rank_on_the_whole_batch(tmp_path, tiny_model_dir, flags):
    result = script(2, "ppo_equivalence.py", str(tiny_model_dir), str(tmp_path), *flags, timeout=180)
    assert_ok(result)
    assert "2 ranks == 1 rank on the whole batch (policy and critic)" in result.stdout
    assert "the critic checkpoint resumes identically" in result.stdout
