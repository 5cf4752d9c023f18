"""The user's agent program, run for one episode: task in, session URL and key in its environment, a deadline
that kills its whole process group, and the reward it prints last."""

import asyncio
import os
import sys
import time

import pytest

from agentrl.gateway.agent_process import last_line_reward, run_agent
from agentrl.trajectory import RewardError

ECHO_AGENT = """
import json, os, sys
task = json.load(sys.stdin)
assert json.loads(os.environ["AGENTRL_TASK"]) == task
print("thinking...")
print(json.dumps({"reward": task["x"] * 2, "success": True, "url": os.environ["OPENAI_BASE_URL"],
                  "key": os.environ["OPENAI_API_KEY"]}))
"""


def run(code, timeout_s=30.0, task=None):
    return asyncio.run(run_agent([sys.executable, "-c", code], task or {"x": 1.5}, "http://h/s/1/v1", "k1", timeout_s))


def test_the_task_arrives_on_stdin_and_in_a_variable_and_the_last_line_is_the_reward():
    result = run(ECHO_AGENT)
    assert result.error is None and result.returncode == 0
    assert result.reward == 3.0 and result.success is True
    assert '"url": "http://h/s/1/v1"' in result.stdout_tail and '"key": "k1"' in result.stdout_tail


def test_a_crashing_agent_fails_with_its_exit_code_and_stderr():
    result = run("import sys; sys.stderr.write('boom: no such tool'); sys.exit(3)")
    assert result.returncode == 3 and "exited 3" in result.error and "boom: no such tool" in result.error


def test_an_agent_past_its_deadline_is_killed_with_its_children(tmp_path):
    marker = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    result = run(code, timeout_s=1.5)
    assert time.monotonic() - started < 10
    assert result.returncode is None and "timeout_s=1.5" in result.error
    child = int(marker.read_text())
    for _ in range(50):  # the kill reached the grandchild too (it may linger as a zombie of init briefly)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if _is_zombie(child):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the agent's child {child} outlived the deadline")


def _is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


def test_a_command_that_does_not_exist_is_an_error_not_an_exception():
    result = asyncio.run(run_agent(["/no/such/agent"], {}, "u", "k", 5))
    assert result.error and "could not start" in result.error


def test_only_a_json_object_with_a_reward_counts():
    assert last_line_reward('log\n{"reward": 1}\n\n') == (1.0, None)
    assert last_line_reward('{"reward": 1}\nlater text') == (None, None)
    assert last_line_reward('{"score": 1}') == (None, None)
    assert last_line_reward("[1, 2]") == (None, None)
    assert last_line_reward("") == (None, None)


@pytest.mark.parametrize("printed", ["NaN", "-Infinity", "1e309", "-1e39", '"high"', "null", "true", "[1]"])
def test_a_printed_reward_that_is_not_a_finite_number_is_refused_naming_it(printed):
    with pytest.raises(RewardError, match=r"last stdout line must be a finite number, got"):
        last_line_reward(f'{{"reward": {printed}, "success": true}}')


def test_an_agent_printing_a_nan_reward_fails_saying_so_instead_of_giving_no_reward():
    result = run('print("working"); print(\'{"reward": NaN}\')')
    assert result.returncode == 0 and result.reward is None
    assert "must be a finite number, got nan" in result.error and "does not train" in result.error
