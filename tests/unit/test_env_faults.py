"""Env faults on the host: raising and hanging plugins end their episode, the host goes on, counts reconcile."""

import asyncio
import time

import pytest

from agentrl.engine.base import SamplingParams
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.models.chat_format import ChatFormat
from agentrl.models.loading import load_tokenizer
from agentrl.rollout.agent_loop import EpisodeLimits, EpisodeRules, run_episode
from agentrl.trajectory import Episode
from tests.fault_envs import fails
from tests.unit.test_agent_loop import ScriptedEngine

PLUGIN = "tests.fault_envs:FaultyEnv"


@pytest.mark.parametrize("fault", ["raise", "hang"])
def test_host_batch_contains_faults_within_the_timeout(fault):
    host = EnvHost(PLUGIN, {"fault": fault, "every": 3}, call_timeout_s=0.5)
    seeds = list(range(6))
    assert all(r.ok for r in host.handle_batch([("reset", s, s, None) for s in seeds]))
    started = time.monotonic()
    results = host.handle_batch([("step", s, "5") for s in seeds])
    assert time.monotonic() - started < 2.0  # two faulty calls side by side cost one timeout, not two
    failed = [s for s, r in zip(seeds, results, strict=True) if not r.ok]
    assert failed == [s for s in seeds if fails(s, 3)] == [0, 3]
    word = "injected fault" if fault == "raise" else "timed out after 0.5s"
    assert all(word in results[s].error for s in failed)
    host.handle_batch([("close", s) for s in seeds])
    assert host.counts() == {"started": 6, "finished": 4, "failed": 2, "open": 0}
    assert host.handle("reset", 9, 1, None).ok  # the host keeps serving


def test_episodes_with_faults_finish_as_errors_and_reconcile(tiny_model_dir):
    chat = ChatFormat(load_tokenizer(str(tiny_model_dir)))
    host = EnvHost(PLUGIN, {"fault": "hang", "every": 2}, call_timeout_s=0.3)
    client = LocalEnvClient(host)
    guess = [*chat.tokenizer("5", add_special_tokens=False)["input_ids"], chat.eos_id]
    sampling = SamplingParams(max_new_tokens=4, stop_token_ids=chat.stop_ids)

    async def episodes():
        runs = []
        for seed in range(6):
            engine = ScriptedEngine([guess] * 4, chat.eos_id)
            episode = Episode(group=seed, task_seed=seed)
            runs.append(
                run_episode(engine, client, chat, EpisodeRules(sampling, EpisodeLimits(4, 4, 400)), episode, key=seed)
            )
        return await asyncio.gather(*runs)

    done = asyncio.run(episodes())
    errors = [e for e in done if e.finish == "error"]
    assert [e.task_seed for e in errors] == [0, 2, 4]
    assert all("timed out" in e.error and sum(e.loss_mask) == 0 for e in errors)
    counts = host.counts()
    assert counts["started"] == len(done) == counts["finished"] + counts["failed"] and counts["open"] == 0


SANDBOX = "agentrl.env.subprocess_env:SubprocessEnv"


@pytest.mark.parametrize("fault", ["exit", "hang", "raise"])
def test_sandboxed_env_survives_its_process_dying_or_hanging(fault):
    host = EnvHost(SANDBOX, {"env_id": PLUGIN, "kwargs": {"fault": fault, "every": 2}}, call_timeout_s=3.0)
    seeds = [0, 1]
    assert all(r.ok for r in host.handle_batch([("reset", s, s, None) for s in seeds]))
    doomed = host.envs[0]
    bad, good = host.handle_batch([("step", s, "5") for s in seeds])
    word = {"exit": "exited with code 3", "hang": "timed out after 3s", "raise": "injected fault for seed 0"}[fault]
    assert not bad.ok and word in bad.error
    assert good.ok
    assert doomed.process.poll() is not None  # the failed episode's process is gone, whatever the fault
    host.handle_batch([("close", s) for s in seeds])
    assert host.counts() == {"started": 2, "finished": 1, "failed": 1, "open": 0}
    calculator = EnvHost(SANDBOX, {"env_id": "calculator"})
    obs, _, tools = calculator.handle("reset", "a", 0, None).value
    assert tools[0]["function"]["name"] == "calculator" and obs
    assert calculator.handle("close", "a").ok and calculator.counts()["finished"] == 1
