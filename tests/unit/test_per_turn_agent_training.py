"""Per-turn rewards from an agent program train with turn_rloo: `agentrl train` (world size 1) through the gateway with
an agent that picks how many turns it takes (1 to 3, from its first reply) and posts each turn's reward to its
session's /reward by call index, and no reward for the episode."""

from __future__ import annotations

import pytest

from tests.unit.agent_runs import train_agent

pytest.importorskip("openai")

AGENT = """
import json, os, sys
import httpx
from openai import OpenAI
task = json.load(sys.stdin)
client = OpenAI(max_retries=0)
base = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
messages = [{"role": "user", "content": task["question"]}]
turns = None
call = 0
while turns is None or call < turns:
    reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
    text = reply.content or ""
    turns = turns or 1 + len(text) % 3
    httpx.post(base + "/reward", json={"reward": 0.5, "call": call}, headers=headers).raise_for_status()
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    call += 1
"""
STEPS = 2


def test_an_agent_posting_per_turn_rewards_trains_with_turn_rloo(tmp_path):
    logged = train_agent(tmp_path, AGENT, STEPS, **{"algorithm.name": "turn_rloo"}).logged
    assert [value for _, value in logged["episode/failed"]] == [0.0] * STEPS
    # every episode's reward is the sum of its turns' rewards: 0.5 per call
    for (_, reward), (_, turns) in zip(logged["episode/reward_mean"], logged["episode/turns_mean"], strict=True):
        assert reward == pytest.approx(0.5 * turns, abs=1e-5)
    # returns-to-go differ between turns and episodes of different lengths: the update has a signal
    assert all(value > 0 for _, value in logged["train/adv_abs_mean"])
    assert any(1.0 < value < 3.0 for _, value in logged["episode/turns_mean"])  # lengths differ
