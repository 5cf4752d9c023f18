"""The training gateway over real HTTP: agent programs (Python with the openai SDK, shell with curl) run episodes
against the tiny model on the continuous engine; each session's exact tokens become the episode's samples."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from agentrl.engine.base import SamplingParams
from agentrl.gateway.episode import run_agent_episode
from agentrl.trajectory import Episode
from tests import apt
from tests.unit.serve_server import build_serve_model

openai = pytest.importorskip("openai")
SAMPLING = SamplingParams(max_new_tokens=6, temperature=1.0)

# Two calls, the second extending the first with the reply and a user message; the reward posted to /reward.
TWO_TURNS = """
import json, os, sys, httpx
from openai import OpenAI
task = json.load(sys.stdin)
client = OpenAI(max_retries=0)
messages = [{"role": "user", "content": task["question"]}]
reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
client.chat.completions.create(model="policy", messages=messages)
base = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
httpx.post(base + "/reward", json={"reward": 0.25, "success": True}, headers=headers).raise_for_status()
"""

# The second call rewrites the history (a summary): a second sample.
REWRITES = """
import json, sys
from openai import OpenAI
client = OpenAI(max_retries=0)
client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "first 1"}])
client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "summary 2"}])
print(json.dumps({"reward": 1.0}))
"""


class LoopThread:
    """The rollout worker's event loop, running in a thread so the test can drive episodes on it."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout=120):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.gateway.server import Gateway
    from agentrl.models.loading import load_causal_lm, load_tokenizer

    model_dir = build_serve_model(tmp_path_factory.mktemp("gateway") / "tiny")
    tokenizer = load_tokenizer(str(model_dir))
    engine = ContinuousTorchEngine(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id, seed=0)
    engine.weight_version = 7
    loop = LoopThread()
    made = Gateway(engine, tokenizer, 1024)
    loop.loop.call_soon_threadsafe(made.start, loop.loop)
    deadline = time.monotonic() + 30
    while made.server is None or not made.server.started:
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.02)
    made.loop_thread, made.tokenizer, made.engine = loop, tokenizer, engine
    yield made
    made.server.should_exit = True
    time.sleep(0.3)
    loop.close()
    engine.shutdown()


def agent(command, timeout_s=60.0):
    return SimpleNamespace(command=command, service=False, timeout_s=timeout_s, cwd=None)


def episode(group=0, **row):
    return Episode(group=group, task_seed=0, task_id="t", task_options=row or {"question": "hi", "answer": 1})


def run(gateway, config, made=None, sampling=SAMPLING):
    made = made or episode()
    return gateway.loop_thread.run(run_agent_episode(gateway, config, made, sampling))


def test_an_agent_program_trains_on_the_exact_tokens_of_its_calls_merged_into_one_sample(gateway):
    done = run(gateway, agent([sys.executable, "-c", TWO_TURNS]))
    assert done.error is None, done.error
    assert done.reward == 0.25 and done.success and done.turns == 2 and done.more_samples == []
    assert done.weight_version == 7 and done.finish == "terminated"
    (first_span, second_span) = done.turn_spans
    generated = [t for t, m in zip(done.tokens, done.loss_mask, strict=True) if m]
    assert len(generated) == (first_span[1] - first_span[0]) + (second_span[1] - second_span[0])
    assert set(done.token_versions[s] for s in range(*first_span)) == {7}
    # the second prompt is the first prompt, the first reply's tokens, then the template's tokens for "again"
    tail = gateway.tokenizer.decode(done.tokens[first_span[1] : second_span[0]])
    assert "again" in tail
    assert gateway.tokenizer.decode(done.tokens[: done.prompt_len]).count("hi") == 1


def test_a_rewritten_history_trains_as_two_samples_sharing_the_reward(gateway):
    done = run(gateway, agent([sys.executable, "-c", REWRITES]))
    assert done.error is None, done.error
    (extra,) = done.more_samples
    assert done.reward == extra.reward == 1.0 and extra.group == done.group and extra.sample == 1
    assert "first 1" in gateway.tokenizer.decode(done.tokens) and "summary 2" in gateway.tokenizer.decode(extra.tokens)


@pytest.mark.parametrize(
    ("code", "timeout_s", "expected"),
    [
        ("import sys; sys.exit(4)", 30, "exited 4"),
        ("import time; time.sleep(30)", 1.0, "timeout_s=1"),
        ("print('{\"reward\": 1}')", 30, "never called the model"),
    ],
)
def test_a_crashing_hanging_or_idle_agent_fails_its_episode(gateway, code, timeout_s, expected):
    done = run(gateway, agent([sys.executable, "-c", code], timeout_s))
    assert done.finish == "error" and expected in done.error and done.reward == 0.0


def test_an_agent_without_a_reward_fails_with_the_three_ways_to_give_one(gateway):
    code = "from openai import OpenAI; OpenAI(max_retries=0).completions.create(model='policy', prompt='hi')"
    done = run(gateway, agent([sys.executable, "-c", code]))
    assert done.finish == "error" and "/reward" in done.error and "reward_fn" in done.error


def test_a_session_key_opens_its_own_session_only(gateway):
    async def check():
        first, second = gateway.table.open({}), gateway.table.open({})
        body = {"model": "policy", "prompt": "hi", "max_tokens": 2}
        try:
            async with httpx.AsyncClient() as client:

                async def status(session, key):
                    url = f"{session.base_url}/completions"
                    reply = await client.post(url, json=body, headers={"Authorization": f"Bearer {key}"})
                    return reply.status_code, reply.json()

                assert (await status(first, first.key))[0] == 200
                assert (await status(first, "wrong"))[0] == 401
                code, error = await status(second, first.key)
                assert code == 403 and error["error"]["code"] == "wrong_session"
                gateway.table.close(first)
                assert (await status(first, first.key))[0] == 404
                malformed = await client.post(
                    f"{second.base_url}/chat/completions",
                    content=b"{",
                    headers={"Authorization": f"Bearer {second.key}"},
                )
                assert malformed.status_code == 400 and "not valid JSON" in malformed.json()["error"]["message"]
        finally:
            gateway.table.close(first)
            gateway.table.close(second)

    gateway.loop_thread.run(check())


def test_a_long_lived_service_claims_the_session_calls_the_model_and_ends_it(gateway):
    service_key = gateway.table.service_key

    def service():
        with httpx.Client(timeout=30) as client:
            claim = client.post(f"{gateway.url}/sessions/claim", headers={"Authorization": f"Bearer {service_key}"})
            session = claim.json()
            model = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
            model.chat.completions.create(model="policy", messages=[{"role": "user", "content": session["task"]["q"]}])
            end = f"{session['base_url'].removesuffix('/v1')}/end"
            headers = {"Authorization": f"Bearer {session['api_key']}"}
            client.post(end, json={"reward": 0.5}, headers=headers).raise_for_status()

    wrong = httpx.post(f"{gateway.url}/sessions/claim", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    thread = threading.Thread(target=service)
    thread.start()
    config = SimpleNamespace(command=None, service=True, timeout_s=30.0, claim_timeout_s=30.0, cwd=None)
    done = run(gateway, config, episode(q="from the service"))
    thread.join(10)
    assert done.error is None and done.reward == 0.5 and done.turns == 1
    assert "from the service" in gateway.tokenizer.decode(done.tokens[: done.prompt_len])


def test_a_session_no_service_claims_fails_naming_the_claim_timeout(gateway):
    config = SimpleNamespace(command=None, service=True, timeout_s=30.0, claim_timeout_s=0.5, cwd=None)
    done = run(gateway, config)
    assert done.finish == "error" and "claim_timeout_s=0.5" in done.error
    assert not gateway.table.sessions  # closed: a late claim cannot take it


def test_a_shell_agent_with_curl_and_jq_runs_episodes(gateway, tmp_path):
    missing = apt.ensure(("jq", "bc", "curl"), lambda: all(shutil.which(p) for p in ("jq", "bc", "curl")))
    if missing:
        pytest.skip(missing)
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "shell_agent" / "agent.sh"
    done = run(gateway, agent(["bash", str(script)]), episode(question="What is 2 + 3?", answer=5))
    assert done.error is None, done.error
    assert done.reward in (0.0, 1.0) and done.turns >= 1
    assert "What is 2 + 3?" in gateway.tokenizer.decode(done.tokens[: done.prompt_len])


def test_256_concurrent_sessions_lose_no_call_and_mix_no_tokens(gateway):
    """Each session asks with its own marker; every recorded call holds that session's marker only, and the reply
    each client got is the text of its own session's generated tokens."""
    sessions = 256

    async def one(index: int, client: httpx.AsyncClient):
        session = gateway.table.open({})
        session.sampling = SAMPLING
        marker = f"s{index}x"
        try:
            reply = await client.post(
                f"{session.base_url}/chat/completions",
                json={"model": "policy", "messages": [{"role": "user", "content": marker}]},
                headers={"Authorization": f"Bearer {session.key}"},
            )
            reply.raise_for_status()
            return marker, session, reply.json()["choices"][0]["message"]["content"]
        finally:
            gateway.table.close(session)

    async def all_of_them():
        limits = httpx.Limits(max_connections=sessions)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            return await asyncio.gather(*(one(i, client) for i in range(sessions)))

    results = gateway.loop_thread.run(all_of_them(), timeout=300)
    for marker, session, content in results:
        (call,) = session.calls
        prompt = gateway.tokenizer.decode(call.prompt_ids)
        assert marker in prompt and sum(f"s{i}x" in prompt for i in range(sessions)) == 1
        assert content == call.text
    assert len({json.dumps(session.calls[0].prompt_ids) for _, session, _ in results}) == sessions


def post_to_session(gateway, endpoint: str, body: bytes):
    """POST `body` to a new session's /reward or /end, then a good reward to its /reward; (both replies, session)."""

    async def post():
        session = gateway.table.open({})
        try:
            async with httpx.AsyncClient() as client:
                headers = {"Authorization": f"Bearer {session.key}"}
                base = session.base_url.removesuffix("/v1")
                first = await client.post(f"{base}/{endpoint}", content=body, headers=headers)
                later = await client.post(f"{base}/reward", json={"reward": 1.0}, headers=headers)
            return first, later, session
        finally:
            gateway.table.close(session)

    return gateway.loop_thread.run(post())


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        (b'{"reward": NaN}', "got nan"),
        (b'{"reward": Infinity, "success": true}', "got inf"),
        (b'{"reward": 1e309}', "got inf"),
        (b'{"reward": -1e309}', "got -inf"),
        (b'{"reward": 1e39}', "got 1e+39"),
        (b'{"reward": "high"}', "got 'high' (str)"),
        (b'{"reward": true}', "got True (bool)"),
    ],
)
@pytest.mark.parametrize("endpoint", ["reward", "end"])
def test_a_reward_that_is_not_a_finite_number_is_refused_and_fails_the_session(gateway, body, shown, endpoint):
    refused, later, session = post_to_session(gateway, endpoint, body)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "reward" and error["type"] == "invalid_request_error" and error["code"] == "invalid_reward"
    assert f'"reward" must be a finite number, {shown}' in error["message"]
    assert "episode has failed and will not train" in error["message"]
    assert later.status_code == 200 and session.reward == 1.0  # taken, but the session stays failed
    assert session.refused is not None and shown in session.refused
    assert session.ended.is_set() == (endpoint == "end")  # a failed session's service need not end it again


@pytest.mark.parametrize("body", [b'{"reward": null}', b'{"success": true}'])
def test_reward_needs_a_reward_and_end_does_not(gateway, body):
    refused, _, session = post_to_session(gateway, "reward", body)
    assert refused.status_code == 400 and "got None" in refused.json()["error"]["message"] and session.refused
    ended, _, session = post_to_session(gateway, "end", body)
    assert ended.status_code == 200 and session.refused is None and session.ended.is_set()


def test_an_agent_that_posts_a_nan_reward_then_ends_normally_does_not_train(gateway):
    code = """
import json, os, httpx
from openai import OpenAI
OpenAI(max_retries=0).completions.create(model="policy", prompt="hi")
base = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
httpx.post(base + "/reward", content=b'{"reward": NaN}', headers=headers)  # 400, unread
httpx.post(base + "/reward", json={"reward": 1.0}, headers=headers).raise_for_status()
print(json.dumps({"reward": 1.0}))
"""
    done = run(gateway, agent([sys.executable, "-c", code]))
    assert done.finish == "error" and done.reward == 0.0 and done.more_samples == []
    assert "the gateway refused the agent's reward" in done.error and "got nan" in done.error
    assert sum(done.loss_mask) == 0


def test_an_agent_that_prints_a_nan_reward_fails_saying_so(gateway):
    code = """
from openai import OpenAI
OpenAI(max_retries=0).completions.create(model="policy", prompt="hi")
print('{"reward": NaN, "success": true}')
"""
    done = run(gateway, agent([sys.executable, "-c", code]))
    assert done.finish == "error" and done.reward == 0.0 and sum(done.loss_mask) == 0
    assert "last stdout line must be a finite number, got nan" in done.error


def test_a_service_ending_with_an_infinite_reward_fails_at_once(gateway):
    def service():
        with httpx.Client(timeout=30) as client:
            headers = {"Authorization": f"Bearer {gateway.table.service_key}"}
            session = client.post(f"{gateway.url}/sessions/claim", headers=headers).json()
            model = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
            model.completions.create(model="policy", prompt="hi")
            end = f"{session['base_url'].removesuffix('/v1')}/end"
            reply = client.post(
                end, content=b'{"reward": 1e309}', headers={"Authorization": f"Bearer {session['api_key']}"}
            )
            assert reply.status_code == 400

    thread = threading.Thread(target=service)
    thread.start()
    config = SimpleNamespace(command=None, service=True, timeout_s=60.0, claim_timeout_s=30.0, cwd=None)
    started = time.monotonic()
    done = run(gateway, config)
    thread.join(10)
    assert time.monotonic() - started < 30  # ended by the refused /end, not by agent.timeout_s
    assert done.finish == "error" and "got inf" in done.error


def test_one_call_after_another_waits_for_no_delayed_ack(gateway):
    """The gateway's connections send small replies at once (TCP_NODELAY): without it each reply's body waited for
    the client's delayed ACK of its headers, 40 ms a call."""
    with httpx.Client(timeout=10) as client:
        client.get(f"{gateway.url}/health")
        latencies = []
        for _ in range(20):
            started = time.perf_counter()
            assert client.get(f"{gateway.url}/health").status_code == 200
            latencies.append(time.perf_counter() - started)
    assert sorted(latencies)[len(latencies) // 2] < 0.02, latencies


# Three calls in one sample; per-turn rewards posted by call index (the second by -1, the latest; two for the third,
# which add up), then the outcome without a call.
PER_TURN = """
import json, os, sys, httpx
from openai import OpenAI
client = OpenAI(max_retries=0)
base = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
def reward(**body):
    httpx.post(base + "/reward", json=body, headers=headers).raise_for_status()
messages = [{"role": "user", "content": "hi"}]
for turn in range(3):
    reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
    messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
    if turn == 0:
        reward(reward=0.5, call=0)
    if turn == 1:
        reward(reward=0.25, call=-1)
reward(reward=0.1, call=2)
reward(reward=0.2, call=2)
reward(reward=1.0, success=False)
"""

# Two samples (the second call rewrites the history), a reward for each call and none for the episode.
PER_TURN_TWO_SAMPLES = """
import os, httpx
from openai import OpenAI
client = OpenAI(max_retries=0)
base = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "first 1"}])
client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "summary 2"}])
httpx.post(base + "/reward", json={"reward": 0.75, "call": 1}, headers=headers).raise_for_status()
httpx.post(base + "/reward", json={"reward": -0.25, "call": 0}, headers=headers).raise_for_status()
"""


def test_per_turn_rewards_posted_by_call_index_reach_the_turns_and_add_to_the_episode_reward(gateway):
    done = run(gateway, agent([sys.executable, "-c", PER_TURN]))
    assert done.error is None, done.error
    assert done.turns == 3 and len(done.turn_spans) == 3 and done.more_samples == []
    assert done.turn_calls == [0, 1, 2]
    assert done.turn_rewards == pytest.approx([0.5, 0.25, 0.3])
    assert done.reward == pytest.approx(0.5 + 0.25 + 0.3 + 1.0) and done.success is False


def test_per_turn_rewards_follow_their_calls_into_a_second_sample(gateway):
    done = run(gateway, agent([sys.executable, "-c", PER_TURN_TWO_SAMPLES]))
    assert done.error is None, done.error
    (extra,) = done.more_samples
    assert (done.turn_calls, done.turn_rewards) == ([0], [-0.25])
    assert (extra.turn_calls, extra.turn_rewards) == ([1], [0.75])
    assert done.reward == extra.reward == pytest.approx(0.5) and done.success  # no outcome: the turns' sum


@pytest.mark.parametrize(
    ("endpoint", "body", "shown"),
    [
        ("reward", b'{"reward": 1.0, "call": 0}', "this session has made no model call yet"),
        ("reward", b'{"reward": 1.0, "call": "0"}', '"call" must be an integer'),
        ("reward", b'{"reward": 1.0, "call": true}', '"call" must be an integer'),
        ("reward", b'{"reward": 1.0, "call": 0.0}', '"call" must be an integer'),
        ("end", b'{"reward": 1.0, "call": 0}', '"call" is for /reward'),
    ],
)
def test_a_per_turn_reward_with_a_bad_call_is_refused_naming_call(gateway, endpoint, body, shown):
    refused, _, session = post_to_session(gateway, endpoint, body)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "call" and error["code"] == "invalid_reward" and shown in error["message"]
    assert session.refused is not None and session.turn_rewards == {}


@pytest.mark.parametrize(
    ("posts", "shown"),
    [
        ([b'{"reward": 1.0, "call": 1}'], "one of this session's 1 model calls so far (0..0, or -1 for the latest)"),
        ([b'{"reward": 1.0, "call": -2}'], "got -2"),
        ([b'{"reward": NaN, "call": 0}'], "got nan"),
        ([b'{"reward": 3e38, "call": 0}', b'{"reward": 3e38, "call": -1}'], "call 0, summed, must be a finite"),
    ],
)
def test_an_agent_posting_a_bad_per_turn_reward_fails_its_episode_saying_why(gateway, posts, shown):
    code = f"""
import os, httpx
from openai import OpenAI
OpenAI(max_retries=0).completions.create(model="policy", prompt="hi")
base = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
headers = {{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}}
for body in {posts!r}:
    last = httpx.post(base + "/reward", content=body, headers=headers)
assert last.status_code == 400, last.text
httpx.post(base + "/reward", json={{"reward": 1.0}}, headers=headers).raise_for_status()
"""
    done = run(gateway, agent([sys.executable, "-c", code]))
    assert done.finish == "error" and done.reward == 0.0 and sum(done.loss_mask) == 0
    assert "the gateway refused the agent's reward" in done.error and shown in done.error
