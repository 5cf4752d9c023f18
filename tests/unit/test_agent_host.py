"""The env rank's side of agent programs on env ranks (agentrl/gateway/agent_host.py): real programs started side by
side, their runs sent back whole, counted; an env op refused by name; a gateway on loopback across nodes refused.
The whole path under mpirun: tests/mpi/test_gateway_mpi.py::test_an_agent_program_trains_through_the_gateway."""

from __future__ import annotations

import sys
import time

import pytest

from agentrl.config import AgentConfig
from agentrl.errors import UserError
from agentrl.gateway.agent_host import AgentHost, check_gateway_reachable
from agentrl.gateway.agent_process import AgentRun

PROGRAM = """
import json, os, sys, time
task = json.loads(os.environ["AGENTRL_TASK"])
time.sleep(3)
if task["fail"]:
    sys.exit(3)
print(json.dumps({"reward": task["seed"] / 10, "success": os.environ["OPENAI_API_KEY"] == "key-" + str(task["seed"])}))
"""


def test_a_batch_of_programs_runs_side_by_side_and_comes_back_whole(tmp_path):
    (tmp_path / "agent.py").write_text(PROGRAM)
    host = AgentHost(AgentConfig(command=[sys.executable, "agent.py"], timeout_s=60, cwd=str(tmp_path)))
    requests = [
        ("agent", (1, f"session-{seed}"), {"seed": seed, "fail": seed == 3}, "http://127.0.0.1:9/v1", f"key-{seed}")
        for seed in range(4)
    ]
    started = time.monotonic()
    results = host.handle_batch(requests)
    assert time.monotonic() - started < 4 * 3.0  # side by side: less than the four programs' sleeps one after another
    runs = [AgentRun(*result.value) for result in results]
    assert all(result.ok for result in results)
    assert [(run.reward, run.success) for run in runs[:3]] == [(0.0, True), (0.1, True), (0.2, True)]
    assert runs[3].returncode == 3 and "agent.command exited 3" in runs[3].error
    assert host.counts() == {"started": 4, "finished": 3, "failed": 1, "open": 0}


def test_an_env_op_sent_to_an_agent_host_is_refused_naming_why():
    host = AgentHost(AgentConfig(command="true"))
    (result,) = host.handle_batch([("reset", (1, 0), 0, None)])
    assert not result.ok and "got env op 'reset'" in result.error
    assert host.counts()["failed"] == 1


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_a_loopback_gateway_is_refused_when_the_env_rank_is_on_another_node(host):
    with pytest.raises(UserError, match=r"loopback only.*on node-b, which cannot reach it; set agent.host"):
        check_gateway_reachable(AgentConfig(command="true", host=host), "node-a", "node-b")
    check_gateway_reachable(AgentConfig(command="true", host=host), "node-a", "node-a")  # one node: fine
    check_gateway_reachable(AgentConfig(command="true", host="0.0.0.0"), "node-a", "node-b")
