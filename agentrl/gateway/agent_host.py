"""Agent programs on env ranks (`layout.env` with `agent.command`): the env rank starts each episode's program
against the session its rollout rank's gateway opened, so the programs' CPU work (a verifiers harness, a LangChain
agent) leaves the rollout rank's node share.

The rollout rank sends `("agent", key, task, base_url, api_key)` through its env client (agentrl/env/client.py)
and gets back the `AgentRun` as an `EnvResult`; the env rank answers with `AgentHost.handle_batch`, in place of an
`EnvHost`. The programs of one batch run side by side, each bounded by agent.timeout_s (agent_process.run_agent).
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import astuple, dataclass

from agentrl.config import AgentConfig
from agentrl.env.host import EnvResult
from agentrl.errors import UserError
from agentrl.gateway.agent_process import AgentRun, run_agent

AGENT_OP = "agent"


@dataclass
class AgentHost:
    """Runs the agent program of each `agent` request; counts like an EnvHost (`agentrl.roles.env.serve`)."""

    agent: AgentConfig
    started: int = 0
    finished: int = 0
    failures: int = 0

    def handle_batch(self, requests: list[tuple]) -> list[EnvResult]:
        return asyncio.run(self._run_all(requests))

    async def _run_all(self, requests: list[tuple]) -> list[EnvResult]:
        return list(await asyncio.gather(*(self._run(request) for request in requests)))

    async def _run(self, request: tuple) -> EnvResult:
        op, _key, *args = request
        if op != AGENT_OP:
            self.failures += 1
            return EnvResult(
                False,
                error=f"an env rank running agent programs got env op {op!r}; agent: and an env.id TextEnv cannot "
                "share a run",
            )
        task, base_url, api_key = args
        self.started += 1
        agent = self.agent
        run = await run_agent(agent.command, task, base_url, api_key, agent.timeout_s, cwd=agent.cwd)
        if run.error is None:
            self.finished += 1
        else:
            self.failures += 1
        return EnvResult(True, astuple(run))

    def counts(self) -> dict[str, int]:
        return {"started": self.started, "finished": self.finished, "failed": self.failures, "open": 0}


async def run_agent_remotely(env_client, key, task: dict, base_url: str, api_key: str) -> AgentRun:
    """One run of the agent program on the env rank behind `env_client`; a lost env rank is a failed run."""
    result = await env_client.call(AGENT_OP, key, task, base_url, api_key)
    if not result.ok:
        return AgentRun(None, None, None, result.error)
    return AgentRun(*result.value)


def check_gateway_reachable(agent: AgentConfig, rollout_host: str, env_host: str) -> None:
    """An env rank on another node than its rollout rank reaches the gateway only at an address other than loopback."""
    if rollout_host == env_host:
        return
    if agent.host == "localhost" or _loopback(agent.host):
        raise UserError(
            f"agent.host={agent.host} serves the gateway on loopback only, but this rollout rank (on {rollout_host}) "
            f"runs its agent programs on an env rank on {env_host}, which cannot reach it; set agent.host=0.0.0.0 "
            "(the programs get this node's host name), or place each env rank on its rollout rank's node"
        )


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
