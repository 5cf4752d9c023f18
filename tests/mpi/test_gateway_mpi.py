"""`mpirun agentrl train` with an agent program instead of an env: each rollout rank serves its gateway, starts the
agent per episode (or has its env rank start it, layout.env), and trains on the sessions' exact tokens; in lockstep
with evaluation and dumps, running ahead with dynamic dispatch, and with the programs on an env rank. The agent
sometimes rewrites its history, so episodes of several samples train too."""

import json

import pytest

from agentrl.data.episode_dump import read_steps
from tests.mpi.helpers import assert_ok, scalars, small_run, train
from tests.unit.serve_server import build_serve_model

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600)]

AGENT = """
import json, os, sys
from openai import OpenAI
task = json.load(sys.stdin)
with open("agent_ranks.txt", "a") as ranks:  # in agent.cwd: which rank started this program
    ranks.write((os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK", "?")) + "\\n")
client = OpenAI(max_retries=0)
messages = [{"role": "user", "content": task["question"]}]
reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": "sure?"}]
last = client.chat.completions.create(model="policy", messages=messages).choices[0].message
if task["rewrite"]:  # a summary of the history: a second sample
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "in short"}])
print(json.dumps({"reward": float(len(last.content or "") % 2), "success": bool(len(last.content or "") % 2)}))
"""


@pytest.fixture(scope="module")
def agent_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("agent_run")
    model = build_serve_model(folder / "tiny")
    rows = [{"question": f"What is {i} + 1?", "answer": i + 1, "rewrite": i % 2 == 0} for i in range(16)]
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "val.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[:4]))
    (folder / "agent.py").write_text(AGENT)
    return folder, model


@pytest.mark.parametrize(
    "mode",
    [
        {"eval.every": 2, "eval.split": "val", "rollout.dump_episodes": "true"},
        {"rollout.max_staleness": 1, "rollout.dispatch": "dynamic"},
        {"layout.rollout": 1, "layout.env": 1},
        {
            "layout.trainer": 2,
            "layout.hybrid": "true",
            "eval.every": 2,
            "eval.split": "val",
            "rollout.dump_episodes": "true",
        },
    ],
    ids=["lockstep-eval-dumps", "ahead-dynamic", "on-an-env-rank", "hybrid-ranks"],
)
def test_an_agent_program_trains_through_the_gateway(tmp_path, agent_files, mode):
    folder, model = agent_files
    overrides = small_run(
        tmp_path,
        model,
        steps=2,
        **{
            "layout.rollout": 2,
            "rollout.tasks_per_step": 2,
            "rollout.group_size": 2,
            "rollout.max_new_tokens": 6,
            "data.train": folder / "train.jsonl",
            "data.val": folder / "val.jsonl",
            "agent.command": f"'python {folder / 'agent.py'}'",
            "agent.timeout_s": 120,
            "agent.cwd": tmp_path,
            **mode,
        },
    )
    hybrid = "layout.hybrid" in mode
    result = train(2 if hybrid else 3, overrides, timeout=500)
    assert_ok(result)
    logged = scalars(tmp_path / "run")
    assert [value for _, value in logged["episode/count"]] == [4.0, 4.0]
    assert [value for _, value in logged["episode/failed"]] == [0.0, 0.0]
    # every call's tokens trained: two or three calls' replies per episode, at most 6 tokens each
    for _, value in logged["episode/response_tokens_mean"]:
        assert 2 <= value <= 18
    rewards = [value for _, value in logged["episode/reward_mean"]]
    assert all(0.0 <= r <= 1.0 for r in rewards)
    started_by = set((tmp_path / "agent_ranks.txt").read_text().split())
    if hybrid:  # both ranks run agent programs
        assert started_by == {"0", "1"}
    else:  # trainer 0, rollout ranks, env rank
        assert started_by == {"2"} if mode.get("layout.env") else started_by <= {"1", "2"}
    if "eval.every" in mode:
        assert [step for step, _ in logged["eval/success"]] == [2]
        assert [value for _, value in logged["eval/failed"]] == [0.0]
        records = [r for step in read_steps(tmp_path / "run").values() for r in step]
        assert len(records) == 8 and all(r["messages"] for r in records)
