"""tool_choice and response_format over real HTTP: honoured through output grammars, or refused naming the option.

The tiny model is random: a reply that parses, follows the schema, or calls the named tool on every seed is the
grammar's doing."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx
import pytest

from tests.unit.serve_server import ThreadServer, build_serve_model

openai = pytest.importorskip("openai")
MODEL = "tiny-constrained"
HI = [{"role": "user", "content": "Guess the number between 1 and 10."}]
VERDICT = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["higher", "lower", "correct"]},
        "guess": {"type": "integer", "minimum": 1, "maximum": 10},
        "sure": {"type": "boolean"},
    },
    "required": ["verdict", "guess", "sure"],
    "additionalProperties": False,
}
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "one arithmetic step",
        "parameters": {
            "type": "object",
            "properties": {"op": {"enum": ["add", "mul"]}, "x": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["op", "x"],
            "additionalProperties": False,
        },
    },
}
JUDGE = {"type": "function", "function": {"name": "judge", "parameters": VERDICT}}
# A tool whose parameters refer to their own definitions (as pydantic writes nested models).
NESTED = {
    "type": "function",
    "function": {
        "name": "move",
        "parameters": {
            "$defs": {
                "Step": {
                    "type": "object",
                    "properties": {"dx": {"enum": [-1, 0, 1]}},
                    "required": ["dx"],
                    "additionalProperties": False,
                }
            },
            "type": "object",
            "properties": {"step": {"$ref": "#/$defs/Step"}},
            "required": ["step"],
            "additionalProperties": False,
        },
    },
}


def follows_verdict(value) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"verdict", "guess", "sure"}
        and value["verdict"] in ("higher", "lower", "correct")
        and type(value["guess"]) is int
        and 1 <= value["guess"] <= 10
        and type(value["sure"]) is bool
    )


def follows_calculator(arguments) -> bool:
    return set(arguments) == {"op", "x"} and arguments["op"] in ("add", "mul") and 0 <= arguments["x"] <= 99


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_serve_model(tmp_path_factory.mktemp("constrained") / "tiny")


@pytest.fixture(scope="module")
def served(model_dir):
    pytest.importorskip("llguidance")
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.models.loading import load_causal_lm, load_tokenizer
    from agentrl.serve.app import build_app
    from agentrl.serve.completions import Completions
    from agentrl.serve.generation import LocalBackend

    tokenizer = load_tokenizer(str(model_dir))
    engine = ContinuousTorchEngine(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id, seed=0)
    records = []
    completions = Completions(LocalBackend(engine, tokenizer), tokenizer, MODEL, 1024, on_call=records.append)
    with ThreadServer(build_app(completions)) as server:
        server.records = records
        server.completions = completions
        yield server
    engine.shutdown()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.base_url + "/v1", api_key="unused", max_retries=0)


def chat(client, **options):
    return client.chat.completions.create(model=MODEL, messages=HI, **{"max_tokens": 120, "seed": 1, **options})


def test_json_schema_replies_parse_and_follow_the_schema_on_every_seed(client):
    form = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True}}
    replies = [choice for seed in (1, 100) for choice in chat(client, n=8, seed=seed, response_format=form).choices]
    for choice in replies:
        assert choice.finish_reason == "stop", choice.message.content
        assert follows_verdict(json.loads(choice.message.content)), choice.message.content
    assert len({choice.message.content for choice in replies}) > 4
    free = chat(client, n=4).choices
    assert not any(_parses(choice.message.content) for choice in free)  # the same model, unconstrained


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def test_json_object_replies_are_json_objects(client):
    replies = chat(client, n=8, max_tokens=300, response_format={"type": "json_object"}).choices
    finished = [choice for choice in replies if choice.finish_reason == "stop"]
    assert finished  # a random model keeps writing a key's string until it happens on the quote: some run out
    for choice in finished:
        assert isinstance(json.loads(choice.message.content), dict)
    for choice in replies:
        assert choice.message.content.startswith("{")


def test_a_named_tool_choice_always_calls_that_tool_with_arguments_that_follow_its_schema(client):
    named = {"type": "function", "function": {"name": "judge"}}
    for seed in (2, 200):
        for choice in chat(client, n=8, seed=seed, tools=[CALCULATOR, JUDGE], tool_choice=named).choices:
            assert choice.finish_reason == "tool_calls"
            (call,) = choice.message.tool_calls
            assert call.function.name == "judge"
            assert follows_verdict(json.loads(call.function.arguments))


def test_required_always_calls_some_tool(client):
    seen = set()
    options = {"tools": [CALCULATOR, NESTED], "tool_choice": "required", "max_tokens": 400}
    for choice in chat(client, n=8, seed=3, **options).choices:  # room for the calls one reply may chain
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice.message.content
        for call in choice.message.tool_calls:
            arguments = json.loads(call.function.arguments)
            seen.add(call.function.name)
            if call.function.name == "calculator":
                assert follows_calculator(arguments)
            else:
                assert call.function.name == "move" and arguments["step"]["dx"] in (-1, 0, 1)
    assert len(seen) > 1  # the grammar lets the model pick the tool


def test_required_without_parallel_calls_makes_exactly_one(client):
    options = {"tools": [CALCULATOR, JUDGE], "tool_choice": "required", "parallel_tool_calls": False}
    for choice in chat(client, n=8, seed=4, **options).choices:
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1


def test_auto_with_a_response_format_calls_a_tool_or_answers_in_the_format(client):
    form = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}}
    for choice in chat(client, n=8, seed=5, tools=[CALCULATOR], response_format=form, max_tokens=600).choices:
        if choice.finish_reason == "tool_calls":
            assert follows_calculator(json.loads(choice.message.tool_calls[0].function.arguments))
        else:
            assert choice.finish_reason == "stop", choice.message.content
            assert follows_verdict(json.loads(choice.message.content))


def test_tool_choice_none_renders_no_tools_and_parses_no_calls(served, client):
    form = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}}
    response = chat(client, tools=[CALCULATOR], tool_choice="none", response_format=form)
    assert response.choices[0].message.tool_calls is None
    assert follows_verdict(json.loads(response.choices[0].message.content))
    record = next(r for r in served.records if r.request_id == response.id)
    assert "calculator" not in served.completions.renderer.text(record.prompt_ids)


def test_a_streamed_constrained_reply_is_the_whole_reply(client):
    form = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}}
    whole = chat(client, seed=6, response_format=form).choices[0].message.content
    chunks = list(chat(client, seed=6, response_format=form, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    named = {"type": "function", "function": {"name": "calculator"}}
    streamed = list(chat(client, seed=6, tools=[CALCULATOR], tool_choice=named, stream=True))
    calls = [call for c in streamed if c.choices for call in c.choices[0].delta.tool_calls or []]
    assert [call.function.name for call in calls] == ["calculator"]
    assert follows_calculator(json.loads(calls[0].function.arguments))


def test_the_logprobs_recorded_are_the_unconstrained_ones(served, client):
    """What the gateway keeps for training: the engine's logprobs of the unmasked distribution."""
    form = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}}
    response = chat(client, seed=7, response_format=form, logprobs=True)
    record = next(r for r in served.records if r.request_id == response.id)
    shown = [entry.logprob for entry in response.choices[0].logprobs.content]
    assert shown == pytest.approx(record.logprobs[: len(shown)], abs=0)
    assert min(record.logprobs) < -1.0  # forced tokens the model alone finds unlikely keep their low logprob


REFUSALS = [
    ({"tool_choice": "sometimes"}, "tool_choice", "none"),
    ({"tool_choice": {"type": "function"}}, "tool_choice", "name"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [CALCULATOR], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools", "tool 0 has no function name"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}, None, "name"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "strang"}}}},
        "response_format",
        "strang",
    ),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strang"}}}],
            "tool_choice": "required",
        },
        "tool_choice",
        "strang",
    ),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos", "ignore_eos"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
        "messages.0.content",
        "'image_url' content parts",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
            ]
        },
        "messages.0.content",
        "'input_audio'",
    ),
    ({"messages": [{"role": "user", "content": None}]}, "messages.0", "a user message needs content"),
    ({"messages": [{"role": "assistant"}]}, "messages.0", "only an assistant message with tool_calls"),
]


@pytest.mark.parametrize(("body", "param", "words"), REFUSALS)
def test_options_it_cannot_honour_are_refused_naming_them(served, body, param, words):
    payload = {"model": MODEL, "messages": HI, "max_tokens": 4, **body}
    reply = httpx.post(served.base_url + "/v1/chat/completions", json=payload, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    if param is not None:
        assert error["param"] == param
    else:
        assert error["param"].startswith("response_format.json_schema")
    assert words in error["message"]


def test_the_openai_client_raises_on_a_refused_option(client):
    with pytest.raises(openai.BadRequestError, match="nope"):
        chat(client, tools=[CALCULATOR], tool_choice={"type": "function", "function": {"name": "nope"}})


def test_an_assistant_message_with_tool_calls_may_have_null_content(client):
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"op": "add", "x": 1}'}}
    messages = [
        *HI,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
    ]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR], max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_body_that_is_not_declared_json_gets_415_naming_the_header(served):
    body = json.dumps({"model": MODEL, "messages": HI, "max_tokens": 2})
    url = served.base_url + "/v1/chat/completions"
    for media_type in ("text/plain", "application/x-www-form-urlencoded"):
        reply = httpx.post(url, content=body, headers={"Content-Type": media_type}, timeout=30)
        assert reply.status_code == 415
        error = reply.json()["error"]
        assert error["param"] == "Content-Type" and media_type in error["message"]
        assert "application/json" in error["message"]
    for media_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        assert httpx.post(url, content=body, headers={"Content-Type": media_type}, timeout=30).status_code == 200
    assert httpx.post(url, content=body, timeout=30).status_code == 200  # no header: read as JSON


def test_without_llguidance_the_options_are_refused_naming_the_extra(served, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # `import llguidance` now fails as if not installed
    url = served.base_url + "/v1/chat/completions"
    for option, value in (
        ("response_format", {"type": "json_object"}),
        ("tool_choice", "required"),
    ):
        payload = {"model": MODEL, "messages": HI, "tools": [CALCULATOR], option: value}
        reply = httpx.post(url, json=payload, timeout=30)
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["param"] == option and "pip install 'agentrl[grammar]'" in error["message"]
    plain = {"model": MODEL, "messages": HI, "max_tokens": 2, "tools": [CALCULATOR], "tool_choice": "auto"}
    assert httpx.post(url, json=plain, timeout=30).status_code == 200  # nothing to constrain: served


def test_an_engine_that_cannot_constrain_refuses_the_options(model_dir):
    from agentrl.models.loading import load_tokenizer
    from agentrl.serve.completions import Completions
    from agentrl.serve.protocol import APIError

    class Unconstrained:  # an engine whose allow_grammars says no (SGLang as agentrl runs it)
        def allow_grammars(self, tokenizer):
            return False

    from agentrl.serve.generation import LocalBackend

    tokenizer = load_tokenizer(str(model_dir))
    completions = Completions(LocalBackend(Unconstrained(), tokenizer), tokenizer, MODEL, 1024)
    payload = {"model": MODEL, "messages": HI, "response_format": {"type": "json_object"}}
    with pytest.raises(APIError, match="cannot do") as refused:
        asyncio.run(completions.chat(payload))
    assert refused.value.param == "response_format" and refused.value.status == 400


def test_a_gateway_session_keeps_the_grammar_under_the_rollouts_sampling(model_dir):
    """The gateway replaces the agent's sampling with the rollout's: the output grammar survives that."""
    pytest.importorskip("llguidance")
    import threading

    from agentrl.engine.base import SamplingParams
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.gateway.server import Gateway
    from agentrl.models.loading import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    engine = ContinuousTorchEngine(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id, seed=0)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    gateway = Gateway(engine, tokenizer, 1024)
    loop.call_soon_threadsafe(gateway.start, loop)
    deadline = time.monotonic() + 30
    while gateway.server is None or not gateway.server.started:
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.02)
    try:
        session = gateway.table.open({})
        session.sampling = SamplingParams(max_new_tokens=100, temperature=1.0)  # the rollout's
        agent = openai.OpenAI(base_url=session.base_url, api_key=session.key, max_retries=0)
        form = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}}
        named = {"type": "function", "function": {"name": "calculator"}}
        for seed in range(4):
            reply = agent.chat.completions.create(
                model="policy", messages=HI, seed=seed, max_tokens=100, response_format=form
            )
            assert follows_verdict(json.loads(reply.choices[0].message.content))
            reply = agent.chat.completions.create(
                model="policy", messages=HI, seed=seed, tools=[CALCULATOR], tool_choice=named
            )
            (call,) = reply.choices[0].message.tool_calls
            assert call.function.name == "calculator" and follows_calculator(json.loads(call.function.arguments))
        assert all(call.finish_reason == "stop" for call in session.calls)
    finally:
        gateway.server.should_exit = True
        time.sleep(0.3)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        engine.shutdown()


def test_langchain_structured_output_works(served):
    """LangChain's with_structured_output: its default (json_schema) and its function calling."""
    langchain_openai = pytest.importorskip("langchain_openai")
    from typing import Literal

    from pydantic import BaseModel, Field

    class Verdict(BaseModel):
        """A verdict on a guess."""

        verdict: Literal["higher", "lower", "correct"]
        sure: bool
        guess: int = Field(ge=1, le=10)

    llm = langchain_openai.ChatOpenAI(
        base_url=served.base_url + "/v1", api_key="unused", model=MODEL, max_tokens=120, seed=1, max_retries=0
    )
    for method in ("json_schema", None):
        structured = llm.with_structured_output(Verdict, **({"method": method} if method else {}))
        answer = structured.invoke("Guess the number between 1 and 10.")
        assert isinstance(answer, Verdict) and 1 <= answer.guess <= 10
