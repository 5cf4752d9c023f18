import pytest

from agentrl.config import ConfigError, LayoutConfig
from agentrl.layout import Role, assign_roles, bind_gpus, plan


def test_roles_in_order():
    roles = assign_roles(LayoutConfig(trainer=1, rollout=2, env=1), 4)
    assert roles == [Role.TRAINER, Role.ROLLOUT, Role.ROLLOUT, Role.ENV]


def test_world_size_one_is_single_process():
    assert assign_roles(LayoutConfig(trainer=2, rollout=2, env=2), 1) == [Role.TRAINER]


def test_mismatch_names_both_sizes():
    with pytest.raises(ConfigError, match=r"layout needs 4 ranks .* but the job has 3"):
        assign_roles(LayoutConfig(trainer=1, rollout=2, env=1), 3)


def test_gpu_binding_is_node_local_and_skips_env_ranks():
    roles = [Role.TRAINER] * 2 + [Role.ROLLOUT] * 2 + [Role.ENV] * 2
    nodes = [0, 0, 0, 1, 1, 1]
    assert bind_gpus(roles, nodes, gpus_per_node=8) == [0, 1, 2, 0, None, None]
    assert bind_gpus(roles, nodes, gpus_per_node=0) == [None] * 6


def test_plan_multi_node():
    rows = plan(LayoutConfig(trainer=8, rollout=8, env=0), 16, ranks_per_node=8, gpus_per_node=8)
    assert [r.node for r in rows] == [0] * 8 + [1] * 8
    assert [r.gpu for r in rows] == list(range(8)) * 2
    assert rows[8].role is Role.ROLLOUT and rows[8].role_rank == 0
