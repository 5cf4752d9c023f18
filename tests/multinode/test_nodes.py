"""Two nodes on one machine (network, UTS and mount namespaces): MPI across them, weights, a lost node, resume."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from agentrl.trainer import checkpoint
from tests.conftest import ROOT
from tests.mpi.helpers import scalars
from tests.multinode import cluster, jobs
from tests.multinode.compare import differences

pytestmark = [pytest.mark.multinode, pytest.mark.mpi]
HOSTS = {"node0": 2, "node1": 2}


def run_settings(run_dir, model_dir, **extra) -> list[str]:
    settings = {
        "run_dir": run_dir,
        "model.path": model_dir,
        "steps": 3,
        "rollout.tasks_per_step": 4,
        "rollout.group_size": 4,
        "checkpoint.every": 0,
        "logging.progress": "false",
        "eval.every": 0,
        **extra,
    }
    return [f"{key}={value}" for key, value in settings.items()]


def table(text: str) -> str:
    """The first placement table in a job's output."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("rank  role"))
    return "\n".join(lines[start : start + 5])


def test_every_node_has_its_own_name_memory_and_address(nodes):
    result = jobs.run(jobs.mpirun_argv(HOSTS, ["hostname"]), 60)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == ["node0", "node0", "node1", "node1"], result.stdout
    for private in ("/dev/shm", "/tmp"):
        marker = subprocess.run(cluster.exec_argv(0, ["touch", f"{private}/agentrl-probe"]), check=False)
        seen = subprocess.run(cluster.exec_argv(1, ["ls", private]), capture_output=True, text=True)
        assert marker.returncode == 0 and "agentrl-probe" not in seen.stdout  # node1 does not see node0's


def test_weights_cross_the_bridge_once_per_node_bit_for_bit(nodes, shared_model):
    script = str(ROOT / "tests" / "multinode" / "scripts" / "weights_across_nodes.py")
    result = jobs.run(jobs.mpirun_argv(HOSTS, [sys.executable, script, str(shared_model), "shm", "2"]), 240)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["hosts"] == ["node0", "node0", "node1", "node1"] and all(report["bit_for_bit"])
    size = report["model_bytes"]
    for into_node0, into_node1 in report["into_node_per_sync"]:
        assert size <= into_node1 < 1.1 * size + 64 * 1024, report  # one copy (plus headers and barriers)
        assert into_node0 < 64 * 1024, report  # nothing comes back


def test_a_lost_node_ends_the_job_and_the_run_resumes_without_losing_a_step(nodes, shared_model):
    run = jobs.shared_dir("lost-node") / "run"
    overrides = run_settings(run, shared_model, steps=6, **{"checkpoint.every": 2})
    lines = jobs.Lines(jobs.start(jobs.supervised_train_argv(HOSTS, overrides)))
    deadline = time.monotonic() + 240
    while checkpoint.latest(run) is None:
        assert lines.process.poll() is None and time.monotonic() < deadline, lines.text()[-4000:]
        time.sleep(0.1)
    killed_at = time.monotonic()
    assert cluster.kill_node(1), "node1 ran none of the job's processes"
    assert lines.wait(300) == 0, lines.text()[-6000:]
    text = lines.text()
    ended = lines.first("agentrl supervise: restart 1/2")
    assert ended is not None and ended - killed_at < 10, text[-6000:]
    assert re.search(r"resuming from .*step_00000[24] at step [24]", text), text[-6000:]
    assert "took over" in text  # rank 0's lock from the start that was lost
    assert checkpoint.latest(run)[0] == 6
    assert sorted(step for step, _ in scalars(run)["episode/count"]) == list(range(6))  # none lost or repeated
    planned = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "layout",
            jobs.QUICKSTART,
            *overrides,
            "--np",
            "4",
            "--hosts",
            "node0:2,node1:2",
        ],
        capture_output=True,
        text=True,
        env=jobs.job_env(),
        check=True,
    )
    assert table(text) == planned.stdout.strip() and "node1" in planned.stdout  # the job agrees with the plan
    print(f"\nnode1 killed: the supervisor saw the job end after {ended - killed_at:.2f} s")


PEER_TIMEOUT_S = 8  # runtime.peer_timeout_s for the cut link: short, yet well over a beat's lateness on 2 busy cores


def test_a_cut_link_ends_the_job_within_the_peer_timeout_and_the_run_resumes(nodes, shared_model):
    run = jobs.shared_dir("cut-link") / "run"
    steps = 6  # the cut can land after a later checkpoint than the first (steps run on while it goes unnoticed)
    overrides = run_settings(run, shared_model, steps=steps, **{"checkpoint.every": 2})
    overrides.append(f"runtime.peer_timeout_s={PEER_TIMEOUT_S}")
    lines = jobs.Lines(jobs.start(jobs.supervised_train_argv(HOSTS, overrides)))
    try:
        deadline = time.monotonic() + 240
        while checkpoint.latest(run) is None:
            assert lines.process.poll() is None and time.monotonic() < deadline, lines.text()[-4000:]
            time.sleep(0.1)
        cluster.set_link(1, False)  # node1's cable: nothing is closed, nothing is sent
        cut_at = time.monotonic()
        while lines.first("presumed lost") is None and lines.first("restart 1/2") is None:
            assert time.monotonic() < cut_at + PEER_TIMEOUT_S + 60, lines.text()[-6000:]
            time.sleep(0.1)
    finally:
        cluster.set_link(1, True)  # before the supervisor's restart needs it (its backoff: 1 s)
    assert lines.wait(300) == 0, lines.text()[-6000:]
    text = lines.text()
    ended = lines.first("agentrl supervise: restart 1/2")
    assert ended is not None and ended - cut_at < PEER_TIMEOUT_S + 5, text[-6000:]
    assert re.search(r"rank 0 on node0\): nothing heard from node1 \(its first rank, 2\) for [0-9.]+ s", text), text
    resumed = re.search(r"resuming from .*step_(\d+) at step (\d+)", text)
    assert resumed and int(resumed[1]) == int(resumed[2]) >= 2, text[-6000:]
    assert checkpoint.latest(run)[0] == steps
    assert sorted(step for step, _ in scalars(run)["episode/count"]) == list(range(steps))  # none lost or repeated
    print(f"\nnode1's link cut: the supervisor saw the job end after {ended - cut_at:.2f} s")


@pytest.mark.slow  # two more training jobs
def test_two_nodes_train_exactly_as_one(nodes, shared_model, tmp_path):
    two = jobs.shared_dir("two-nodes") / "run"
    one = jobs.shared_dir("one-node") / "run"
    assert jobs.run(jobs.train_argv(HOSTS, run_settings(two, shared_model)), 300).returncode == 0
    on_node0 = cluster.exec_argv(
        0, jobs.hydra_argv({"node0": 4}, jobs.train_argv_inner(run_settings(one, shared_model)))
    )
    result = jobs.run(on_node0, 300)
    assert result.returncode == 0, result.stderr[-4000:]
    tags, differ = differences(one, two)
    assert len(tags) > 20 and not differ, differ
