"""A multi-policy gateway over real HTTP: one agent program calls two policies by model name in one session, each
on its own engine (the tiny model, its weight version telling the engines apart); each call's tokens land in the
episode of the policy it named, with that policy's reward. A model name no policy has is one line naming the known
ones, counted, and the root cause of the episode it fails."""

from __future__ import annotations

import json
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from agentrl.engine.base import SamplingParams
from agentrl.gateway.policy_episode import run_policy_session
from agentrl.trajectory import Episode
from tests.unit.serve_server import build_serve_model
from tests.unit.test_gateway import LoopThread

openai = pytest.importorskip("openai")
VERSIONS = {"proposer": 3, "solver": 5}  # each engine's weight version: a token's version names its engine

# proposer, solver, then the proposer again on its own history: the proposer's two calls are one sample. Rewards: the
# proposer's own, the solver's turn (call 1), and the session's (every policy that acted, unless it has its own).
TWO_POLICIES = """
import json, os, sys, httpx
from openai import OpenAI
client = OpenAI(max_retries=0)
print(json.dumps(sorted(m.id for m in client.models.list().data)))
mine = [{"role": "user", "content": "pose 1"}]
reply = client.chat.completions.create(model="proposer", messages=mine).choices[0].message
client.chat.completions.create(model="solver", messages=[{"role": "user", "content": "solve 2"}])
mine += [reply.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
client.chat.completions.create(model="proposer", messages=mine)
base = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
for body in ({"reward": 1.0, "policy": "proposer", "success": True}, {"reward": 0.5, "call": 1}, {"reward": 0.25}):
    httpx.post(base + "/reward", json=body, headers=headers).raise_for_status()
"""

# Asks for a model no policy has: prints the error it got, then (RECOVER) calls a policy and finishes, or crashes.
UNKNOWN = """
import json, sys
from openai import OpenAI, NotFoundError
client = OpenAI(max_retries=0)
try:
    client.chat.completions.create(model="critic", messages=[{"role": "user", "content": "hi"}])
except NotFoundError as error:
    print(json.dumps({"status": error.status_code, "error": error.body}))
    if not RECOVER:
        raise
client.chat.completions.create(model="solver", messages=[{"role": "user", "content": "hi"}])
print(json.dumps({"reward": 1.0}))
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.gateway.server import Gateway
    from agentrl.models.loading import load_causal_lm, load_tokenizer

    model_dir = build_serve_model(tmp_path_factory.mktemp("gateway_policies") / "tiny")
    tokenizer = load_tokenizer(str(model_dir))
    engines = {}
    for name, version in VERSIONS.items():
        engines[name] = ContinuousTorchEngine(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id)
        engines[name].weight_version = version
    loop = LoopThread()
    served = {name: (engine, tokenizer) for name, engine in engines.items()}
    made = Gateway(None, None, 1024, policies=served)
    loop.loop.call_soon_threadsafe(made.start, loop.loop)
    deadline = time.monotonic() + 30
    while made.server is None or not made.server.started:
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.02)
    made.loop_thread, made.tokenizer = loop, tokenizer
    yield made
    made.server.should_exit = True
    time.sleep(0.3)
    loop.close()
    for engine in engines.values():
        engine.shutdown()


def play(gateway, code: str | None, timeout_s: float = 60.0):
    """One session of the agent `code` (None: a service claims it)."""
    command = None if code is None else [sys.executable, "-c", code]
    agent = SimpleNamespace(command=command, service=code is None, timeout_s=timeout_s, claim_timeout_s=30.0, cwd=None)
    episodes = {name: Episode(group=n, task_seed=0, task_id="t") for n, name in enumerate(VERSIONS)}
    sampling = {name: SamplingParams(max_new_tokens=4, temperature=1.0) for name in VERSIONS}
    return gateway.loop_thread.run(run_policy_session(gateway, agent, episodes, sampling))


def generated_versions(episode: Episode) -> set[int]:
    return {v for v, mask in zip(episode.token_versions, episode.loss_mask, strict=True) if mask}


def test_each_call_trains_into_the_policy_it_named_with_that_policys_reward(gateway):
    result = play(gateway, TWO_POLICIES)
    assert result.error is None, result.error
    proposer, solver = result.episodes["proposer"], result.episodes["solver"]
    # turn attribution: each policy's generated tokens came from its own engine, and only its own calls are there
    assert generated_versions(proposer) == {VERSIONS["proposer"]} and generated_versions(solver) == {VERSIONS["solver"]}
    assert proposer.turns == 2 and proposer.turn_calls == [0, 2] and proposer.more_samples == []
    assert solver.turns == 1 and solver.turn_calls == [1]
    proposer_text, solver_text = gateway.tokenizer.decode(proposer.tokens), gateway.tokenizer.decode(solver.tokens)
    assert "pose 1" in proposer_text and "again" in proposer_text and "solve 2" not in proposer_text
    assert "solve 2" in solver_text and "pose 1" not in solver_text
    # rewards: the proposer's own outcome (1.0, not the session's 0.25); the solver's: the session's plus its turn's
    assert proposer.reward == 1.0 and proposer.success and proposer.turn_rewards == [0.0, 0.0]
    assert solver.reward == 0.75 and solver.turn_rewards == [0.5]
    assert result.rewards == {"proposer": 1.0, "solver": 0.75} and result.unknown_models == []


def test_a_long_lived_service_calls_both_policies_in_the_session_it_claims(gateway):
    import httpx

    def service():
        with httpx.Client(timeout=60) as client:
            auth = {"Authorization": f"Bearer {gateway.table.service_key}"}
            session = client.post(f"{gateway.url}/sessions/claim", headers=auth).json()
            headers = {"Authorization": f"Bearer {session['api_key']}"}
            for model in ("solver", "proposer"):
                body = {"model": model, "messages": [{"role": "user", "content": f"to {model}"}], "max_tokens": 3}
                client.post(f"{session['base_url']}/chat/completions", json=body, headers=headers).raise_for_status()
            root = session["base_url"].removesuffix("/v1")
            client.post(f"{root}/reward", json={"reward": 0.5, "policy": "solver"}, headers=headers).raise_for_status()
            client.post(f"{root}/end", json={"reward": -1.0}, headers=headers).raise_for_status()

    thread = threading.Thread(target=service)
    thread.start()
    result = play(gateway, None)
    thread.join(30)
    assert result.error is None, result.error
    assert result.rewards == {"proposer": -1.0, "solver": 0.5}  # the session's outcome, unless a policy has its own
    for name, episode in result.episodes.items():
        assert generated_versions(episode) == {VERSIONS[name]} and episode.turn_calls == [int(name == "proposer")]
        assert f"to {name}" in gateway.tokenizer.decode(episode.tokens[: episode.prompt_len])


def test_the_models_endpoint_lists_every_policy(gateway):
    import httpx

    session = gateway.table.open({})
    try:
        headers = {"Authorization": f"Bearer {session.key}"}
        listed = httpx.get(f"{session.base_url}/models", headers=headers, timeout=30).json()
        assert [card["id"] for card in listed["data"]] == ["proposer", "solver"]
        one = httpx.get(f"{session.base_url}/models/solver", headers=headers, timeout=30)
        assert one.status_code == 200 and one.json()["id"] == "solver"
        missing = httpx.get(f"{session.base_url}/models/critic", headers=headers, timeout=30)
        assert missing.status_code == 404 and "proposer, solver" in missing.json()["error"]["message"]
    finally:
        gateway.table.close(session)


def test_an_unknown_model_is_one_line_naming_the_policies_and_is_counted(gateway):
    before = gateway.completions.unknown_calls
    result = play(gateway, "RECOVER = True\n" + UNKNOWN)
    assert result.error is None and result.unknown_models == ["critic"]
    assert gateway.completions.unknown_calls == before + 1
    assert set(result.episodes) == {"solver"} and result.episodes["solver"].reward == 1.0  # the rest still trains


def test_an_agent_that_crashes_on_an_unknown_model_fails_with_that_as_the_cause(gateway):
    result = play(gateway, "RECOVER = False\n" + UNKNOWN)
    assert result.unknown_models == ["critic"]
    first_line = result.error.splitlines()[0]
    assert first_line.startswith("The model `critic` is no policy of this job; call one of the policies by name: "
                                 "proposer, solver")  # fmt: skip
    assert all(e.finish == "error" and e.error == result.error for e in result.episodes.values())


def test_the_unknown_model_reply_is_a_404_naming_the_fix(gateway):
    import httpx

    session = gateway.table.open({})
    try:
        body = {"model": "critic", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": f"Bearer {session.key}"}
        reply = httpx.post(f"{session.base_url}/chat/completions", json=body, headers=headers, timeout=30)
        assert reply.status_code == 404
        error = reply.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "\n" not in error["message"] and "`critic`" in error["message"]
        assert "proposer, solver" in error["message"] and session.unknown_models == ["critic"]
    finally:
        gateway.table.close(session)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"reward": 1.0, "policy": "critic"}, "which this job does not train or serve; name one of proposer, solver"),
        ({"reward": 1.0, "policy": "solver", "call": 0}, '"call" and "policy" both name whose reward it is'),
    ],
)
def test_a_reward_for_no_policy_is_refused_and_fails_the_session(gateway, body, expected):
    import httpx

    session = gateway.table.open({})
    try:
        headers = {"Authorization": f"Bearer {session.key}"}
        httpx.post(
            f"{session.base_url}/chat/completions",
            json={"model": "solver", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers=headers,
            timeout=60,
        ).raise_for_status()
        root = session.base_url.removesuffix("/v1")
        reply = httpx.post(f"{root}/reward", content=json.dumps(body), headers=headers, timeout=30)
        assert reply.status_code == 400 and expected in reply.json()["error"]["message"]
        assert session.refused is not None and expected in session.refused
    finally:
        gateway.table.close(session)
