from pathlib import Path

import pytest

from agentrl.config import ConfigError, LayoutConfig
from agentrl.layout import Role, assign_roles, bind_gpus
from agentrl.run.plan import JobShape, format_plan, plan


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
    rows = plan(LayoutConfig(trainer=8, rollout=8, env=0), JobShape(16, ranks_per_node=8, gpus_per_node=8))
    assert [r.node for r in rows] == [0] * 8 + [1] * 8
    assert [r.gpu for r in rows] == list(range(8)) * 2
    assert rows[8].role is Role.ROLLOUT and rows[8].role_rank == 0


def test_plan_four_nodes_of_eight_gpus_with_a_cpu_env_tail():
    # 4 x 8 GPUs: 16 trainers on nodes 0-1, 14 rollout ranks on nodes 2-3, 2 env ranks last on node 3.
    rows = plan(LayoutConfig(trainer=16, rollout=14, env=2), JobShape(32, ranks_per_node=8, gpus_per_node=8))
    assert [r.role for r in rows] == [Role.TRAINER] * 16 + [Role.ROLLOUT] * 14 + [Role.ENV] * 2
    assert [r.node for r in rows] == [n for n in range(4) for _ in range(8)]
    assert [r.role_rank for r in rows if r.role is Role.ROLLOUT] == list(range(14))
    assert [r.gpu for r in rows] == list(range(8)) * 3 + [0, 1, 2, 3, 4, 5, None, None]
    gpus_in_use = {(r.node, r.gpu) for r in rows if r.gpu is not None}
    assert len(gpus_in_use) == 30  # no two ranks share a GPU


def test_plan_more_ranks_than_gpus_on_a_node_wraps_around():
    rows = plan(LayoutConfig(trainer=2, rollout=4, env=2), JobShape(8, ranks_per_node=8, gpus_per_node=4))
    assert [r.gpu for r in rows] == [0, 1, 2, 3, 0, 1, None, None]


class DoneRequest:
    def Test(self):
        return True


class FakeComm:
    """Enough of an MPI communicator for `Layout` in one process: rank `rank` of `size`, all on one node.

    Records the colors passed to Split, so a test can see which communicators this rank joined.
    """

    def __init__(self, rank: int, size: int, uses_gpu: list[bool]):
        self.rank, self.size, self.uses_gpu = rank, size, uses_gpu
        self.split_colors: list[int] = []

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Ibarrier(self):
        return DoneRequest()  # alone: every rank is here

    def Split(self, color, key):
        self.split_colors.append(color)
        return self

    def Split_type(self, split_type, key):
        return self

    def allgather(self, value):
        return [value] * self.size  # every rank on one host

    def Free(self):
        pass


def test_weight_group_is_the_trainer_leader_and_every_rollout_rank():
    from mpi4py import MPI

    from agentrl.layout import Layout

    config = LayoutConfig(trainer=2, rollout=3, env=1)
    uses_gpu = [True] * 5 + [False]
    in_weight_group, gpus = [], []
    for rank in range(6):
        comm = FakeComm(rank, 6, uses_gpu)
        layout = Layout(config, comm=comm, gpus_per_node=8)
        _role_color, weight_color = comm.split_colors
        in_weight_group.append(weight_color != MPI.UNDEFINED)
        gpus.append(layout.gpu)
        assert layout.gpus == [0, 1, 2, 3, 4, None]  # every rank knows where the whole job sits
    assert in_weight_group == [True, False, True, True, True, False]
    assert gpus == [0, 1, 2, 3, 4, None]


def test_colocate_puts_rollout_rank_i_on_trainer_rank_is_gpu():
    rows = plan(
        LayoutConfig(trainer=4, rollout=4, env=1, colocate=True), JobShape(9, ranks_per_node=9, gpus_per_node=4)
    )
    assert [r.gpu for r in rows] == [0, 1, 2, 3, 0, 1, 2, 3, None]
    rows = plan(LayoutConfig(trainer=2, rollout=1, env=0, colocate=True), JobShape(3, gpus_per_node=8))
    assert [r.gpu for r in rows] == [0, 1, 0]


def test_colocate_refuses_more_rollout_than_trainer_ranks():
    with pytest.raises(ConfigError, match=r"layout.rollout=3 > layout.trainer=2"):
        plan(LayoutConfig(trainer=2, rollout=3, env=0, colocate=True), JobShape(5, gpus_per_node=8))


def test_colocate_refuses_a_rollout_rank_on_another_node_than_its_trainer():
    with pytest.raises(ConfigError, match=r"rollout rank 2 runs on node 1 but its trainer rank 0 on node 0"):
        plan(LayoutConfig(trainer=2, rollout=2, env=0, colocate=True), JobShape(4, ranks_per_node=2, gpus_per_node=2))


def test_colocate_without_gpus_binds_nothing():
    rows = plan(LayoutConfig(trainer=1, rollout=1, env=0, colocate=True), JobShape(2, gpus_per_node=0))
    assert [r.gpu for r in rows] == [None, None]


def test_layout_object_colocates_each_rollout_rank_with_its_trainer():
    from agentrl.layout import Layout

    config = LayoutConfig(trainer=2, rollout=2, env=1, colocate=True)
    uses_gpu = [True] * 4 + [False]
    gpus = [Layout(config, comm=FakeComm(rank, 5, uses_gpu), gpus_per_node=4).gpu for rank in range(5)]
    assert gpus == [0, 1, 0, 1, None]


def test_a_tensor_parallel_engine_gets_its_own_consecutive_gpus():
    rows = plan(
        LayoutConfig(trainer=2, rollout=3, env=1), JobShape(6, ranks_per_node=6, gpus_per_node=8), rollout_gpus=2
    )
    assert [r.gpu for r in rows] == [0, 1, 2, 4, 6, None]  # engines on GPUs 2-3, 4-5, 6-7
    rows = plan(LayoutConfig(trainer=1, rollout=2, env=0), JobShape(3, gpus_per_node=4), rollout_gpus=2)
    assert [r.gpu for r in rows] == [0, 1, 0]  # engine on GPUs 1-2; the next would need 3-4: it starts over at 0
    with pytest.raises(ConfigError, match=r"rollout.engine.tp_size=16 GPUs per engine, but nodes have 8"):
        plan(LayoutConfig(trainer=1, rollout=1, env=0), JobShape(2, gpus_per_node=8), rollout_gpus=16)
    with pytest.raises(ConfigError, match=r"set rollout.engine.tp_size=1 or layout.colocate=false"):
        plan(LayoutConfig(trainer=1, rollout=1, env=0, colocate=True), JobShape(2, gpus_per_node=8), rollout_gpus=2)


def test_layout_command_takes_overrides_after_options(capsys):
    from agentrl.cli import main

    config = str(Path(__file__).resolve().parents[2] / "launch" / "configs" / "qwen2.5-0.5b-4gpu.yaml")
    assert main(["layout", config, "--np", "6", "--gpus-per-node", "8", "rollout.engine.tp_size=2"]) == 0
    devices = [line.split()[4] for line in capsys.readouterr().out.splitlines()[1:]]
    assert devices == ["cuda:0", "cuda:1", "cuda:2", "cuda:4", "cpu", "cpu"]


def test_weights_column_names_the_node_leader_that_gets_the_broadcast_and_engines_viewing_the_window():
    rows = plan(LayoutConfig(trainer=1, rollout=3, env=0), JobShape(4, ranks_per_node=2), shm_mapped=False)
    assert [(r.node, r.weights) for r in rows] == [(0, "send"), (0, "shm"), (1, "bcast+shm"), (1, "shm")]
    rows = plan(LayoutConfig(trainer=1, rollout=3, env=0), JobShape(4, ranks_per_node=2))  # auto: node 1 has two
    assert [r.weights for r in rows] == ["send", "shm view", "bcast+shm view", "shm view"]
    rows = plan(LayoutConfig(trainer=1, rollout=2, env=1), JobShape(4, ranks_per_node=2))  # auto: one per node copies
    assert [r.weights for r in rows] == ["send", "shm", "bcast+shm", "-"]
    rows = plan(LayoutConfig(trainer=2, rollout=3, env=1), JobShape(6, ranks_per_node=2), shm_mapped=False)
    assert [r.weights for r in rows] == ["send", "-", "bcast+shm", "shm", "bcast+shm", "-"]  # node 0: trainers
    rows = plan(LayoutConfig(trainer=1, rollout=2, env=1), JobShape(4, ranks_per_node=2), weights_transport="mpi")
    assert [r.weights for r in rows] == ["send", "mpi", "mpi", "-"]
    rows = plan(LayoutConfig(trainer=1, rollout=3, env=0), JobShape(4, ranks_per_node=2), in_place="auto")
    assert [r.weights for r in rows] == ["send in place", "shm view", "bcast+shm view", "shm view"]
    rows = plan(LayoutConfig(trainer=1, rollout=2, env=1), JobShape(4, ranks_per_node=2), in_place="auto")
    assert rows[0].weights == "send", "copying engines: the trainer cannot train where they read"


def test_weights_column_on_gpus_shows_the_transport_auto_resolves_to():
    quickstart = LayoutConfig(trainer=1, rollout=2, env=1)
    rows = plan(quickstart, JobShape(4, gpus_per_node=1))  # one GPU: every rollout rank on the trainer leader's
    assert [(r.gpu, r.weights) for r in rows] == [(0, "send"), (0, "cuda_ipc"), (0, "cuda_ipc"), (None, "-")]
    rows = plan(quickstart, JobShape(4, gpus_per_node=8))
    assert [(r.gpu, r.weights) for r in rows] == [(0, "send"), (1, "nccl"), (2, "nccl"), (None, "-")]
    rows = plan(LayoutConfig(trainer=1, rollout=3, env=0), JobShape(4, gpus_per_node=2), in_place="auto")
    # some rollout ranks share the leader's GPU, some not: shm, and CUDA engines copy from it (no view, no in place)
    assert [(r.gpu, r.weights) for r in rows] == [(0, "send"), (1, "shm"), (0, "shm"), (1, "shm")]
    rows = plan(quickstart, JobShape(4, gpus_per_node=8), weights_transport="mpi")  # an explicit choice stays
    assert [r.weights for r in rows] == ["send", "mpi", "mpi", "-"]
    with pytest.raises(ConfigError, match=r"share node 0's cuda:0; use weights.transport=auto \(picks cuda_ipc"):
        plan(quickstart, JobShape(4, gpus_per_node=1), weights_transport="nccl")
    assert plan(quickstart, JobShape(1, gpus_per_node=1), weights_transport="nccl")[0].weights == "in-process"


def test_plan_takes_a_running_jobs_nodes():
    rows = plan(LayoutConfig(trainer=1, rollout=2, env=1), JobShape(4, gpus_per_node=1, nodes=[0, 0, 1, 1]))
    assert [(r.node, r.gpu, r.weights) for r in rows] == [
        (0, 0, "send"),
        (0, 0, "shm"),
        (1, 0, "bcast+shm"),
        (1, None, "-"),
    ]


def test_layout_command_on_one_gpu_shows_cuda_and_the_transport_a_run_uses(capsys):
    from agentrl.cli import EXIT_USER_ERROR, main

    config = str(Path(__file__).resolve().parents[2] / "launch" / "configs" / "quickstart.yaml")
    assert main(["layout", config, "--np", "4", "--gpus-per-node", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(row[4], " ".join(row[5:])) for row in rows] == [
        ("cuda:0", "send"),
        ("cuda:0", "cuda_ipc"),
        ("cuda:0", "cuda_ipc"),
        ("cpu", "-"),
    ]
    assert main(["layout", config, "--np", "4", "--gpus-per-node", "1", "weights.transport=nccl"]) == EXIT_USER_ERROR
    assert "weights.transport=nccl needs its own GPU" in capsys.readouterr().err


def test_simulated_nodes_come_from_the_environment(monkeypatch):
    from agentrl.layout import Layout, simulated_ranks_per_node

    monkeypatch.delenv("AGENTRL_RANKS_PER_NODE", raising=False)
    assert simulated_ranks_per_node() is None
    monkeypatch.setenv("AGENTRL_RANKS_PER_NODE", "2")
    assert simulated_ranks_per_node() == 2
    config = LayoutConfig(trainer=1, rollout=2, env=1)
    layouts = [Layout(config, comm=FakeComm(rank, 4, [True] * 3 + [False]), gpus_per_node=0) for rank in range(4)]
    assert [layout.node for layout in layouts] == [0, 0, 1, 1]
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("AGENTRL_RANKS_PER_NODE", bad)
        with pytest.raises(ConfigError, match=r"AGENTRL_RANKS_PER_NODE=.* must be a positive whole number"):
            simulated_ranks_per_node()


def test_layout_command_groups_ranks_into_simulated_nodes(capsys, monkeypatch):
    from agentrl.cli import main

    monkeypatch.setenv("AGENTRL_RANKS_PER_NODE", "2")
    config = str(Path(__file__).resolve().parents[2] / "launch" / "configs" / "quickstart.yaml")
    assert main(["layout", config, "--np", "4", "layout.rollout=3", "layout.env=0", "rollout.tasks_per_step=3"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    expected = [("0", "send in place"), ("0", "shm view"), ("1", "bcast+shm view"), ("1", "shm view")]
    assert [(row[3], " ".join(row[5:])) for row in rows] == expected
    overrides = ["layout.rollout=3", "layout.env=0", "rollout.tasks_per_step=3", "rollout.max_staleness=1"]
    assert main(["layout", config, "--np", "4", *overrides]) == 0  # running ahead: the trainer copies
    assert capsys.readouterr().out.splitlines()[1].split()[5:] == ["send"]


def test_layout_of_agentrl_eval_shows_the_trainer_leader_reporting_and_the_other_trainers_idle(capsys):
    from agentrl.cli import main

    config = str(Path(__file__).resolve().parents[2] / "launch" / "configs" / "quickstart.yaml")
    assert main(["layout", config, "--np", "5", "--eval", "layout.trainer=2", "--gpus-per-node", "4"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(row[1], row[4], row[5]) for row in rows] == [
        ("report", "-", "-"),
        ("idle", "-", "-"),
        ("rollout", "cuda:2", "-"),  # no weight sync: the rollout ranks load the checkpoint
        ("rollout", "cuda:3", "-"),
        ("env", "cpu", "-"),
    ]


def test_pinned_cores_give_trainers_their_own_share():
    from agentrl.layout import Role, pinned_cores

    quickstart = [Role.TRAINER, Role.ROLLOUT, Role.ROLLOUT, Role.ENV]
    assert pinned_cores([0, 1], quickstart, Role.TRAINER) == [0]
    assert pinned_cores([0, 1], quickstart, Role.ROLLOUT) == [1] == pinned_cores([0, 1], quickstart, Role.ENV)
    assert pinned_cores(list(range(16)), quickstart, Role.TRAINER) == [0, 1, 2, 3]
    assert pinned_cores(list(range(16)), quickstart, Role.ROLLOUT) == list(range(4, 16))
    two_trainers = [Role.TRAINER, Role.TRAINER, Role.ROLLOUT]
    assert pinned_cores([4, 5, 6], two_trainers, Role.TRAINER) == [4, 5]  # a share of the cores it was given
    assert pinned_cores([0], quickstart, Role.TRAINER) is None  # nothing to split
    assert pinned_cores([0, 1], [Role.ROLLOUT, Role.ENV], Role.ROLLOUT) is None  # no trainer on this node


def test_hosts_number_nodes_in_rank_order_and_show_by_name():
    from agentrl.layout import node_ids
    from agentrl.run.plan import format_plan, parse_hosts, plan

    assert parse_hosts("node1:2,node0,node2:1") == ["node1", "node1", "node0", "node2"]
    assert node_ids(["b", "b", "a", "b"]) == [0, 0, 1, 0]
    with pytest.raises(ConfigError, match="HOST:RANKS"):
        parse_hosts("node0:x")
    hosts = parse_hosts("node0:2,node1:2")
    rows = plan(LayoutConfig(trainer=1, rollout=2, env=1), JobShape(4, hosts=hosts))
    assert [(row.node, row.host) for row in rows] == [(0, "node0"), (0, "node0"), (1, "node1"), (1, "node1")]
    assert "host" in format_plan(rows).splitlines()[0] and "node1  cpu     bcast+shm" in format_plan(rows)
    with pytest.raises(ConfigError, match="--hosts places 2 ranks"):
        plan(LayoutConfig(trainer=1, rollout=2, env=1), JobShape(4, hosts=["a", "b"]))


@pytest.mark.parametrize(
    ("setting", "staleness", "roles", "role", "nice"),
    [
        ("auto", 1, "TRRE", Role.ROLLOUT, 10),  # running ahead, 4 ranks on 2 cores: the trainer goes first
        ("auto", 1, "TRRE", Role.ENV, 10),
        ("auto", 1, "TRRE", Role.TRAINER, 0),  # the trainer keeps its priority
        ("auto", 0, "TRRE", Role.ROLLOUT, 0),  # lockstep: the roles take turns
        ("auto", 1, "TR", Role.ROLLOUT, 0),  # a core for every rank
        ("true", 0, "TR", Role.ROLLOUT, 10),
        ("false", 1, "TRRE", Role.ROLLOUT, 0),
        ("true", 1, "RRE", Role.ROLLOUT, 0),  # no trainer on this node
    ],
)
def test_yield_to_trainer_lowers_the_other_ranks_priority_where_they_compete(setting, staleness, roles, role, nice):
    import multiprocessing
    import os
    from types import SimpleNamespace

    from agentrl.config import from_dict
    from agentrl.run.start import yield_to_trainer

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    config = from_dict(
        {
            "model": {"path": "some/model"},
            "rollout": {"max_staleness": staleness},
            "runtime": {"yield_to_trainer": setting},
        }
    )
    kinds = {"T": Role.TRAINER, "R": Role.ROLLOUT, "E": Role.ENV}
    node_roles = [kinds[letter] for letter in roles]
    rank = node_roles.index(role)
    layout = SimpleNamespace(
        roles=node_roles, nodes=[0] * len(roles), node=0, role=role, gpu=None, rank=rank, is_trainer_leader=rank == 0
    )

    def child(pipe):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
        before = os.nice(0)
        yield_to_trainer(config, layout)
        pipe.send(os.nice(0) - before)

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=child, args=(send,))
    process.start()
    assert receive.recv() == nice
    process.join(10)


def test_hybrid_ranks_are_trainers_and_rollout_ranks_at_once():
    from agentrl.layout import Layout

    config = LayoutConfig(trainer=3, hybrid=True)
    assert config.world_size == 3
    assert assign_roles(config, 3) == [Role.TRAINER] * 3
    layouts = [Layout(config, comm=FakeComm(rank, 3, [True] * 3), gpus_per_node=2) for rank in range(3)]
    assert all(layout.hybrid and layout.rollout_ranks == [0, 1, 2] == layout.trainer_ranks for layout in layouts)
    assert [layout.gpu for layout in layouts] == [0, 1, 0]
    rows = plan(config, JobShape(3, gpus_per_node=2))
    assert [(row.hybrid, row.weights) for row in rows] == [(True, "in-process")] * 3
    assert "hybrid" in format_plan(rows)


def test_hybrid_refuses_other_sizes_and_roles_it_cannot_hold():
    with pytest.raises(ConfigError, match=r"hybrid=true runs layout.trainer=2 ranks.*the job has 3.*mpirun -n 2"):
        assign_roles(LayoutConfig(trainer=2, hybrid=True), 3)
    with pytest.raises(ValueError, match=r"layout.rollout=1; leave layout.rollout out"):
        LayoutConfig(trainer=2, rollout=1, hybrid=True)
    with pytest.raises(ValueError, match=r"layout.env=1.*drop those"):
        LayoutConfig(trainer=2, env=1, hybrid=True)
    assert LayoutConfig(trainer=2, rollout=2, hybrid=True).world_size == 2


@pytest.mark.parametrize(
    "setting, fix",
    [
        ({"rollout": {"max_staleness": 1}}, "rollout.max_staleness=0"),
        ({"rollout": {"engine": {"backend": "sglang"}}}, "rollout.engine.backend=torch"),
        ({"rollout": {"dispatch": "dynamic"}}, "rollout.dispatch=static"),
        ({"weights": {"transport": "mpi"}}, "weights.transport=auto"),
    ],
)
def test_hybrid_refuses_what_a_rank_taking_turns_cannot_do(setting, fix):
    from agentrl.config import from_dict

    with pytest.raises(ConfigError, match=rf"layout.hybrid=true .*; set {fix}"):
        from_dict({"model": {"path": "m"}, "layout": {"trainer": 2, "hybrid": True}, **setting})


def test_hybrid_ranks_need_an_equal_share_of_tasks_only():
    from agentrl.config import from_dict

    with pytest.raises(ConfigError, match=r"tasks_per_step=3 must be a multiple of layout.trainer=2 with"):
        from_dict({"model": {"path": "m"}, "layout": {"trainer": 2, "hybrid": True}, "rollout": {"tasks_per_step": 3}})
    # each rank deals its one group to the other in turn: 2 tasks on 2 ranks give each trainer one group
    from_dict({"model": {"path": "m"}, "layout": {"trainer": 2, "hybrid": True}, "rollout": {"tasks_per_step": 2}})
