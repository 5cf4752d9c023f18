"""agentrl serve over real HTTP: the tiny model on the continuous engine, driven by the openai client and curl."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import httpx
import numpy as np
import pytest

from agentrl.engine.base import SamplingParams
from agentrl.serve.protocol import ChatMessage
from tests.unit.serve_server import ThreadServer, build_serve_model

openai = pytest.importorskip("openai")
MODEL = "tiny-serve"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_serve_model(tmp_path_factory.mktemp("serve") / "tiny")


def _completions(model_dir, records):
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.models.loading import load_causal_lm, load_tokenizer
    from agentrl.serve.completions import Completions
    from agentrl.serve.generation import LocalBackend

    tokenizer = load_tokenizer(str(model_dir))
    engine = ContinuousTorchEngine(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id, seed=0)
    engine.weight_version = 3
    return Completions(LocalBackend(engine, tokenizer), tokenizer, MODEL, 1024, on_call=records.append), engine


@pytest.fixture(scope="module")
def served(model_dir):
    from agentrl.serve.app import build_app

    records = []
    completions, engine = _completions(model_dir, records)
    with ThreadServer(build_app(completions)) as server:
        server.records = records
        server.completions = completions
        yield server
    engine.shutdown()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.base_url + "/v1", api_key="unused", max_retries=0)


def _record(served, response_id: str, index: int = 0):
    return next(r for r in served.records if r.request_id == response_id and r.index == index)


def _chat(client, content="hello", **kwargs):
    options = {"max_tokens": 8, "seed": 1, **kwargs}
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **options)


def test_chat_answers_with_the_rendered_prompt_and_usage(served, client):
    response = _chat(client)
    choice = response.choices[0]
    assert response.object == "chat.completion" and response.model == MODEL
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("length", "stop")
    record = _record(served, response.id)
    assert record.prompt_ids == served.completions.renderer.prompt_ids([ChatMessage(role="user", content="hello")])
    assert response.usage.prompt_tokens == len(record.prompt_ids)
    assert response.usage.completion_tokens == len(record.output_ids) <= 8
    assert record.weight_version == 3


def test_stream_deltas_concatenate_to_the_text(served, client):
    whole = _chat(client, max_tokens=12, seed=11).choices[0].message.content
    chunks = list(_chat(client, max_tokens=12, seed=11, stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == whole
    assert sum(1 for piece in pieces if piece) > 1  # token by token, not the whole text at the end
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_n_choices_and_the_seed_reproduce(client):
    first = _chat(client, n=3, seed=5, max_tokens=10)
    again = _chat(client, n=3, seed=5, max_tokens=10)
    other = _chat(client, n=3, seed=6, max_tokens=10)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]
    assert texts != [c.message.content for c in other.choices]
    assert len(set(texts)) > 1  # each choice draws its own sample


def test_logprobs_are_the_engines(served, client, model_dir):
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.models.loading import load_causal_lm

    response = _chat(client, seed=21, max_tokens=10, logprobs=True, top_logprobs=1)
    record = _record(served, response.id)
    entries = response.choices[0].logprobs.content
    shown = len(entries)
    assert [e.logprob for e in entries] == pytest.approx(record.logprobs[:shown], abs=0)
    assert all(e.top_logprobs[0].logprob == e.logprob for e in entries)
    tokenizer = served.completions.tokenizer
    engine = ContinuousTorchEngine(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id)
    sampling = SamplingParams(10, temperature=1.0, stop_token_ids=(tokenizer.eos_token_id,), seed=21)
    try:
        alone = asyncio.run(engine.generate(record.prompt_ids, sampling))
    finally:
        engine.shutdown()
    assert alone.output_ids.tolist() == record.output_ids
    np.testing.assert_allclose(alone.logprobs, record.logprobs, atol=1e-4)


def test_stop_string_cuts_the_text_and_ends_the_generation(served, client):
    text = _chat(client, seed=31, max_tokens=16).choices[0].message.content
    stop = next(text[i : i + 2] for i in range(3, len(text) - 2) if text[i : i + 2].strip() and text[i] != text[i + 1])
    response = _chat(client, seed=31, max_tokens=16, stop=[stop])
    assert response.choices[0].message.content == text[: text.find(stop)]
    assert response.choices[0].finish_reason == "stop"
    assert len(_record(served, response.id).output_ids) < 16  # the engine stopped there, not at max_tokens
    streamed = _chat(client, seed=31, max_tokens=16, stop=[stop], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text[: text.find(stop)]


def test_32_concurrent_requests_each_answer_their_own_prompt(served):
    async def run():
        client = openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="unused", max_retries=0)
        calls = [
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x" * (1 + i % 8)}], max_tokens=6, seed=i % 8
            )
            for i in range(32)
        ]
        return await asyncio.gather(*calls)

    responses = asyncio.run(run())
    renderer = served.completions.renderer
    by_prompt = {}
    for i, response in enumerate(responses):
        prompt = renderer.prompt_ids([ChatMessage(role="user", content="x" * (1 + i % 8))])
        assert _record(served, response.id).prompt_ids == prompt
        assert response.usage.prompt_tokens == len(prompt)
        by_prompt.setdefault(i % 8, set()).add(response.choices[0].message.content)
    assert all(len(texts) == 1 for texts in by_prompt.values())  # same prompt and seed: same reply in any batch


def test_completions_take_text_or_token_ids_and_stream(served, client):
    ids = served.completions.tokenizer("guess the number")["input_ids"]
    by_text = client.completions.create(model=MODEL, prompt="guess the number", max_tokens=8, seed=2)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, seed=2, logprobs=1)
    assert by_text.object == "text_completion" and by_text.choices[0].text == by_ids.choices[0].text
    assert len(by_ids.choices[0].logprobs.token_logprobs) == len(by_ids.choices[0].logprobs.tokens) > 0
    streamed = client.completions.create(model=MODEL, prompt="guess the number", max_tokens=8, seed=2, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == by_text.choices[0].text


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        (b"{not json", 400, None, "not valid JSON"),
        ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, 404, "model", "tiny-serve"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x " * 600}]}, 400, "messages", "1024"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1020},
            400,
            "messages",
            "1024",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400, "temperature", "0"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 0}, 400, "n", "1"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens", "1"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role", "user"),
        ({"model": MODEL}, 400, "messages", "required"),
    ],
)
def test_bad_requests_get_openai_errors(served, body, status, param, words):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(served.base_url + "/v1/chat/completions", content=content, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and words in error["message"]


def test_context_error_names_both_numbers(served):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1020}
    message = httpx.post(served.base_url + "/v1/chat/completions", json=body, timeout=30).json()["error"]["message"]
    prompt = len(served.completions.renderer.prompt_ids([ChatMessage(role="user", content="hi")]))
    assert "maximum context length is 1024 tokens" in message and f"{prompt + 1020} tokens" in message


def test_the_openai_client_raises_on_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        _chat(client, temperature=-0.5)


def test_models_and_health(served, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    _chat(client, max_tokens=1)  # so that `served` counts one call when this test runs alone
    health = httpx.get(served.base_url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["model"] == MODEL and health["served"] > 0


def test_replies_carry_the_apps_time_and_wrong_methods_get_405(served):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 2}
    started = time.perf_counter()
    reply = httpx.post(served.base_url + "/v1/chat/completions", json=body, timeout=60)
    latency_ms = (time.perf_counter() - started) * 1e3
    name, _, duration = reply.headers["server-timing"].partition(";dur=")
    assert reply.status_code == 200 and name == "app" and 0 < float(duration) < latency_ms
    wrong = httpx.get(served.base_url + "/v1/chat/completions", timeout=10)
    assert wrong.status_code == 405 and "GET is not allowed" in wrong.json()["error"]["message"]
    assert httpx.head(served.base_url + "/health", timeout=10).status_code == 200


def test_curl_chat_stream_and_error(served):
    url = served.base_url + "/v1/chat/completions"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "seed": 4}

    def curl(payload: str) -> str:
        command = ["curl", "-sS", "-N", url, "-H", "Content-Type: application/json", "-d", payload]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout

    whole = json.loads(curl(json.dumps(body)))["choices"][0]["message"]["content"]
    lines = [line for line in curl(json.dumps({**body, "stream": True})).splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole
    assert json.loads(curl("{oops"))["error"]["code"] == "invalid_json"


def test_handlers_mount_under_a_session_prefix_with_a_hook(model_dir):
    """The training gateway's shape: the same routes under /sessions/{sid}/v1, a key per session, a record per call."""
    from fastapi import FastAPI

    from agentrl.serve.app import install_error_handlers, openai_router
    from agentrl.serve.protocol import APIError

    completions, engine = _completions(model_dir, [])
    keys, recorded = {"s1": "key-1"}, {}

    def hook_for(request):
        sid = request.path_params["sid"]
        if keys.get(sid) is None or request.headers.get("authorization") != f"Bearer {keys[sid]}":
            raise APIError("wrong API key for this session", status=401, code="invalid_api_key")
        return lambda record: recorded.setdefault(sid, []).append(record)

    app = FastAPI()
    install_error_handlers(app)
    app.include_router(openai_router(completions, hook_for), prefix="/sessions/{sid}/v1")
    try:
        with ThreadServer(app) as server:
            session = openai.OpenAI(base_url=f"{server.base_url}/sessions/s1/v1", api_key="key-1", max_retries=0)
            response = _chat(session)
            (record,) = recorded["s1"]
            assert record.request_id == response.id and record.weight_version == 3
            assert completions.tokenizer.decode(record.output_ids, skip_special_tokens=True).startswith(
                response.choices[0].message.content
            )
            wrong = openai.OpenAI(base_url=f"{server.base_url}/sessions/s1/v1", api_key="nope", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                _chat(wrong)
    finally:
        engine.shutdown()
