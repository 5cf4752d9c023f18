"""Run the user's agent program for one episode: the task on stdin, the session's URL and key in its
environment, a deadline, and the reward it may print as its last line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
from dataclasses import dataclass

from agentrl.env.code_sandbox import kill_group
from agentrl.trajectory import RewardError, finite_reward

OUTPUT_TAIL_BYTES = 4000  # of stderr, kept for the error message of a failed run


@dataclass
class AgentRun:
    """How one run of the agent program ended."""

    returncode: int | None  # None: killed at the deadline
    reward: float | None  # from a last stdout line {"reward": x} (a finite number), else None
    success: bool | None
    error: str | None  # why the run counts as failed, else None
    stdout_tail: str = ""


def command_argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else list(command)


async def run_agent(
    command: str | list[str],
    task: dict,
    base_url: str,
    api_key: str,
    timeout_s: float,
    extra_env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> AgentRun:
    """Start `command` with OPENAI_BASE_URL/OPENAI_API_KEY set and `task` as JSON on stdin and in AGENTRL_TASK;
    wait for it at most `timeout_s` seconds (then kill its whole process group)."""
    task_json = json.dumps(task)
    env = {
        **os.environ,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": api_key,
        "AGENTRL_TASK": task_json,
        **(extra_env or {}),
    }
    argv = command_argv(command)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,  # its own process group: a kill at the deadline reaches its children too
        )
    except OSError as error:
        return AgentRun(None, None, None, f"agent.command {argv!r} could not start: {error}")
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(task_json.encode()), timeout_s)
    except asyncio.TimeoutError:
        kill_group(process.pid)
        await process.wait()
        return AgentRun(None, None, None, f"agent.command ran past agent.timeout_s={timeout_s:g} s and was killed")
    except asyncio.CancelledError:
        kill_group(process.pid)
        with contextlib.suppress(ProcessLookupError):
            await asyncio.shield(process.wait())
        raise
    out = stdout.decode(errors="replace")
    if process.returncode != 0:
        tail = stderr.decode(errors="replace")[-OUTPUT_TAIL_BYTES:]
        return AgentRun(process.returncode, None, None, f"agent.command exited {process.returncode}:\n{tail}")
    try:
        reward, success = last_line_reward(out)
    except RewardError as refused:
        return AgentRun(0, None, None, f"{refused}; the episode failed and does not train", out[-OUTPUT_TAIL_BYTES:])
    return AgentRun(0, reward, success, None, out[-OUTPUT_TAIL_BYTES:])


def last_line_reward(stdout: str) -> tuple[float | None, bool | None]:
    """(reward, success) from the last non-empty stdout line when it is a JSON object with a "reward"; (None, None)
    when it is not. RewardError when that "reward" is not a finite number (NaN, Infinity, 1e309, a string, null)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None, None
    try:
        payload = json.loads(lines[-1])
    except ValueError:  # not JSON (or an int past Python's digit limit)
        return None, None
    if not isinstance(payload, dict) or "reward" not in payload:
        return None, None
    reward = finite_reward(payload["reward"], 'the "reward" of the agent\'s last stdout line')
    success = payload.get("success")
    return reward, bool(success) if success is not None else None
