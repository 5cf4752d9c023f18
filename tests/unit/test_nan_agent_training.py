"""A NaN agent in a group trains to the end with finite weights: `agentrl train` (world size 1) through the gateway
with an agent program of which one run in eight prints {"reward": NaN} last and one in eight posts 1e309 to its
session's /reward. Those episodes fail and are counted; the others train; no update is skipped."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from tests.unit.agent_runs import train_agent

pytest.importorskip("openai")

# Runs are numbered in the order they start (a locked counter file): runs 0, 8, 16 ... print NaN, runs 4, 12 ...
# post 1e309. With 8 episodes a step, each step holds one of each, wherever its groups fall.
AGENT = """
import fcntl, json, os, sys
import httpx
from openai import OpenAI
task = json.load(sys.stdin)
with open(os.environ["COUNTER"], "a+") as counter:
    fcntl.flock(counter, fcntl.LOCK_EX)
    counter.seek(0)
    run = len(counter.read())
    counter.write("x")
client = OpenAI(max_retries=0)
reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
text = reply.choices[0].message.content or ""
if run % 8 == 0:
    print('{"reward": NaN}')
elif run % 8 == 4:
    base = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
    refused = httpx.post(base + "/reward", content=b'{"reward": 1e309}', headers=headers)
    print(json.dumps({"reward": 1.0, "status": refused.status_code}))
else:
    print(json.dumps({"reward": float(len(text) % 2)}))
"""
STEPS = 2


def test_a_nan_agent_in_a_group_trains_to_the_end_with_finite_weights(tmp_path):
    # large steps: weights gone NaN would show at once
    run = train_agent(tmp_path, AGENT, STEPS, env={"COUNTER": str(tmp_path / "runs")}, **{"optimizer.lr": 0.05})
    assert len((tmp_path / "runs").read_text()) == 8 * STEPS  # every episode ran its agent once

    logged, run_dir, model = run.logged, run.run_dir, run.model
    assert [value for _, value in logged["episode/count"]] == [8.0] * STEPS
    assert [value for _, value in logged["episode/failed"]] == [2.0] * STEPS
    assert [value for _, value in logged["train/skipped_nonfinite"]] == [0.0] * STEPS
    for name in ("train/loss", "train/grad_norm", "episode/reward_mean"):
        assert all(math.isfinite(value) for _, value in logged[name]), name
    assert all(0.0 <= value <= 1.0 for _, value in logged["episode/reward_mean"])
    assert "last stdout line must be a finite number, got nan" in run.output
    assert "the gateway refused the agent's reward" in run.output

    (final,) = (run_dir / "checkpoints").iterdir()
    weights = {}
    for shard in final.glob("*.safetensors"):
        weights.update(load_file(shard))
    initial = {}
    for shard in model.glob("*.safetensors"):
        initial.update(load_file(shard))
    assert weights and all(torch.isfinite(tensor).all() for tensor in weights.values())
    assert any(not torch.equal(weights[name], initial[name]) for name in initial if name in weights)  # it trained
