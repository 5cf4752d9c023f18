"""Generated requests against agentrl serve and the training gateway over real HTTP: mutations of valid requests
(wrong types, huge and negative numbers, odd unicode, missing and extra fields, deeper nesting, random tools,
messages and roles, broken bodies). Not one may get a 500 or a body that is not JSON (streams: JSON events, no
error event), and each server answers a normal request after."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from collections import Counter

import httpx
import pytest

from agentrl.config.schema import AgentConfig
from agentrl.serve.protocol import ROLES
from tests.unit.serve_server import ThreadServer, build_serve_model

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MODEL = "tiny"
MAX_MODEL_LEN = 64  # short, so that generations stay a few tokens whatever a request asks
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
DEEP = "\x00deep\x00"  # a value the encoder replaces with JSON nested `depth` levels


def fuzz_settings(examples: int):
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same requests every run: CI stays reproducible
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )


# ---- what requests are made of ---------------------------------------------------------------------------------

odd_text = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(categories=["Cs", "Co", "Cc", "Zl", "Mn"]), max_size=6),  # lone surrogates, controls
    st.sampled_from(
        ["", " ", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "{{ x }}", "\u202e", "x" * 5000]
    ),
)
numbers = st.one_of(
    st.integers(-5, 5),
    st.integers(),
    st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, -(10**30)]),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, odd_text)
FIELDS = [
    "model", "messages", "prompt", "role", "content", "type", "text", "function", "name", "arguments", "tools",
    "tool_calls", "tool_call_id", "tool_choice", "parameters", "n", "seed", "max_tokens", "stop", "stream",
    "stream_options", "include_usage", "logprobs", "top_logprobs", "temperature", "top_p", "reward", "success",
]  # fmt: skip
keys = st.one_of(st.sampled_from(FIELDS), odd_text)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4), max_leaves=10
)
content_parts = st.lists(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(odd_text, json_values)}),
        st.dictionaries(keys, json_values, max_size=3),
        json_values,
    ),
    max_size=3,
)
tool_calls = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {
                "id": odd_text,
                "type": st.sampled_from(["function", "other"]),
                "function": st.fixed_dictionaries(
                    {"name": odd_text, "arguments": st.one_of(odd_text, st.just('{"x": 1}'), json_values)}
                ),
            }
        ),
        json_values,
    ),
    max_size=2,
)
messages = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"role": st.one_of(st.sampled_from(ROLES), odd_text), "content": st.one_of(odd_text, content_parts)},
            optional={"tool_calls": tool_calls, "tool_call_id": odd_text, "name": odd_text},
        ),
        st.dictionaries(keys, json_values, max_size=3),
    ),
    max_size=4,
)
tools = st.lists(
    st.one_of(
        st.just(TOOLS[0]),
        st.fixed_dictionaries(
            {"type": st.sampled_from(["function", "x"]), "function": st.dictionaries(keys, json_values, max_size=3)}
        ),
        st.dictionaries(keys, json_values, max_size=3),
    ),
    max_size=3,
)
# A field's new value: anything at all, or something of the shape that field takes.
new_values = st.one_of(json_values, messages, tools, content_parts, tool_calls, st.just(DEEP))


def chat_base(model: str):
    extras = st.fixed_dictionaries(
        {},
        optional={
            "seed": st.integers(0, 9),
            "temperature": st.just(0.7),
            "n": st.integers(1, 3),
            "stream": st.booleans(),
            "stream_options": st.just({"include_usage": True}),
            "tools": st.just(TOOLS),
            "tool_choice": st.sampled_from(["auto", "none"]),
            "stop": st.just(["x"]),
            "logprobs": st.just(True),
            "top_logprobs": st.just(1),
        },
    )
    return extras.map(lambda e: {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **e})


def completion_base(model: str):
    extras = st.fixed_dictionaries(
        {},
        optional={
            "prompt": st.sampled_from([[5, 6, 7], ["a", "b"], [[5, 6], [7]]]),
            "seed": st.integers(0, 9),
            "n": st.integers(1, 3),
            "stream": st.booleans(),
            "echo": st.booleans(),
            "logprobs": st.just(1),
            "stop": st.just("x"),
        },
    )
    return extras.map(lambda e: {"model": model, "prompt": "hi", "max_tokens": 2, **e})


def _paths(value, path=()):
    """Every place in a JSON document: (path, is a container)."""
    yield path, isinstance(value, dict | list)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _paths(item, (*path, key))


def _at(document, path):
    for key in path:
        document = document[key]
    return document


@st.composite
def mutated(draw, base):
    """A valid request, then one to three edits: set, delete, add, or wrap a value anywhere in it."""
    document = copy.deepcopy(draw(base))  # edited in place: no value a strategy holds (st.just) may change
    for _ in range(draw(st.integers(1, 3))):
        places = list(_paths(document))
        path, container = draw(st.sampled_from(places))
        edit = draw(st.sampled_from(["set", "delete", "add", "wrap"]))
        if not path:  # the root: replace it, wrap it, or add to it
            if edit in ("set", "wrap") or not container:
                document = [document] if edit == "wrap" else draw(json_values)
                continue
            edit = "add"
        if edit == "add" and container:
            target = _at(document, path)
            if isinstance(target, dict):
                target[draw(keys)] = copy.deepcopy(draw(new_values))
            else:
                target.append(copy.deepcopy(draw(new_values)))
            continue
        parent, key = _at(document, path[:-1]), path[-1]
        if edit == "delete":
            del parent[key]
        elif edit == "wrap":
            parent[key] = draw(st.sampled_from([[parent[key]], {"value": parent[key]}]))
        else:
            parent[key] = copy.deepcopy(draw(new_values))
    return document


@st.composite
def bodies(draw, base):
    """The bytes of a request body: mostly a mutated request (NaN and lone surrogates as JSON writes them, DEEP as
    JSON nested up to 100k levels), now and then a valid one, or bytes that are not a JSON object at all."""
    kind = draw(st.sampled_from(["mutated"] * 7 + ["valid"] * 2 + ["broken", "deep"]))
    if kind == "broken":
        return draw(
            st.one_of(
                st.binary(max_size=40),
                st.sampled_from([b"", b"{", b"null", b"[]", b'"x"', b"1e999", b'{"model": "tiny", "messages": [}']),
            )
        )
    document = draw(mutated(base)) if kind == "mutated" else copy.deepcopy(draw(base))
    if kind == "deep":
        document[draw(st.sampled_from(list(document)))] = DEEP
    depth = draw(st.sampled_from([50, 900, 5000, 100_000]))
    text = json.dumps(document)  # NaN, Infinity and lone surrogates (escaped) as Python's json writes them
    return text.replace(json.dumps(DEEP), "[" * depth + "]" * depth).encode()


# ---- checking one answer ------------------------------------------------------------------------------------------


def check_answer(reply: httpx.Response, seen: Counter, where: str) -> None:
    seen[(where, reply.status_code)] += 1
    assert reply.status_code < 500, f"{where}: {reply.status_code} {reply.text[:500]}"
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line[6:] for line in reply.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", reply.text[-500:]
        for event in events[:-1]:
            assert "error" not in json.loads(event), event  # every refusal comes before the stream starts
        return
    body = reply.json()  # raises on a body that is not JSON
    if reply.status_code >= 400:
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"], body


def post(client: httpx.Client, url: str, body: bytes, headers: dict | None = None) -> httpx.Response:
    return client.post(url, content=body, headers={"Content-Type": "application/json", **(headers or {})})


# ---- agentrl serve ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_serve_model(tmp_path_factory.mktemp("fuzz") / "tiny")


@pytest.fixture(scope="module")
def served(model_dir):
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.models.loading import load_causal_lm, load_tokenizer
    from agentrl.serve.app import build_app
    from agentrl.serve.completions import Completions
    from agentrl.serve.generation import LocalBackend

    tokenizer = load_tokenizer(str(model_dir))
    engine = ContinuousTorchEngine(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id, seed=0)
    completions = Completions(LocalBackend(engine, tokenizer), tokenizer, MODEL, MAX_MODEL_LEN)
    with ThreadServer(build_app(completions)) as server, httpx.Client(base_url=server.base_url, timeout=60) as client:
        server.client = client
        yield server
    engine.shutdown()


SERVE_SEEN: Counter = Counter()


@fuzz_settings(examples=1500)
@given(endpoint=st.sampled_from(["chat", "completions"]), data=st.data())
def test_serve_answers_thousands_of_mutated_requests_in_json_without_a_500(served, endpoint, data):
    base = chat_base(MODEL) if endpoint == "chat" else completion_base(MODEL)
    body = data.draw(bodies(base))
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    check_answer(post(served.client, path, body), SERVE_SEEN, endpoint)


def test_serve_answers_normally_after_the_fuzzing(served):
    """Runs after the fuzz test (file order): the server is alive, idle, and right."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 1}
    first = served.client.post("/v1/chat/completions", json=chat).json()
    again = served.client.post("/v1/chat/completions", json=chat).json()
    assert first["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"]
    assert 0 < first["usage"]["completion_tokens"] <= 3
    health = served.client.get("/health").json()
    assert health["in_flight"] == 0
    print(f"\nserve fuzz: {sum(SERVE_SEEN.values())} requests, statuses {sorted(SERVE_SEEN.items())}")


# ---- the training gateway ------------------------------------------------------------------------------------------


class LoopThread:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def gateway(model_dir):
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.gateway.server import Gateway
    from agentrl.models.loading import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    engine = ContinuousTorchEngine(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id, seed=0)
    loop = LoopThread()
    made = Gateway(engine, tokenizer, MAX_MODEL_LEN, AgentConfig(max_body_bytes=1 << 20))
    loop.loop.call_soon_threadsafe(made.start, loop.loop)
    deadline = time.monotonic() + 30
    while made.server is None or not made.server.started:
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.02)
    session = made.table.open({})
    session.sampling = SamplingParams(max_new_tokens=2, temperature=1.0)
    with httpx.Client(timeout=60) as client:
        made.client, made.session = client, session
        yield made
    made.server.should_exit = True
    time.sleep(0.3)
    loop.close()
    engine.shutdown()


GATEWAY_SEEN: Counter = Counter()
REWARD_BASE = st.fixed_dictionaries({"reward": st.just(1.0)}, optional={"success": st.booleans()})


@fuzz_settings(examples=800)
@given(
    route=st.sampled_from(["chat", "completions", "reward", "end"]),
    key=st.sampled_from(["own"] * 8 + ["x", ""]),
    data=st.data(),
)
def test_the_gateway_answers_mutated_requests_in_json_without_a_500(gateway, route, key, data):
    session = gateway.session
    base = {"chat": chat_base("policy"), "completions": completion_base("policy")}.get(route, REWARD_BASE)
    body = data.draw(bodies(base))
    path = {"chat": "v1/chat/completions", "completions": "v1/completions"}.get(route, route)
    url = f"{session.base_url.removesuffix('/v1')}/{path}"
    headers = {"Authorization": f"Bearer {session.key if key == 'own' else key}"} if key else {}
    check_answer(post(gateway.client, url, body, headers), GATEWAY_SEEN, route)


def test_the_gateway_answers_normally_after_the_fuzzing(gateway):
    session = gateway.session
    headers = {"Authorization": f"Bearer {session.key}"}
    chat = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    reply = gateway.client.post(f"{session.base_url}/chat/completions", json=chat, headers=headers)
    assert reply.status_code == 200 and 0 < reply.json()["usage"]["completion_tokens"] <= 2
    reward = gateway.client.post(
        f"{session.base_url.removesuffix('/v1')}/reward", json={"reward": 0.5}, headers=headers
    )
    assert reward.status_code == 200 and session.reward == 0.5
    print(f"\ngateway fuzz: {sum(GATEWAY_SEEN.values())} requests, statuses {sorted(GATEWAY_SEEN.items())}")


def test_the_gateways_reward_routes_refuse_huge_and_deep_bodies(gateway):
    session = gateway.session
    headers = {"Authorization": f"Bearer {session.key}", "Content-Type": "application/json"}
    for route in ("reward", "end"):
        url = f"{session.base_url.removesuffix('/v1')}/{route}"
        huge = gateway.client.post(url, content=b'{"reward": 1, "x": "' + b"x" * (2 << 20) + b'"}', headers=headers)
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"
        deep = gateway.client.post(url, content=b"[" * 100_000 + b"]" * 100_000, headers=headers)
        assert deep.status_code == 400 and "nests too deeply" in deep.json()["error"]["message"]
