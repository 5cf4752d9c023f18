"""agentrl serve against hostile or careless clients: huge bodies and prompts are refused before any work, the API key
guards every route but /health, `--no-list-tools` keeps tools out of the prompt, and a client that goes away stops
its generations."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from agentrl.serve.protocol import MAX_CHOICES, ChatMessage
from tests.conftest import ROOT
from tests.unit.serve_server import ThreadServer, build_serve_model, free_port

openai = pytest.importorskip("openai")
MODEL = "tiny"
KEY = "the-server-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_serve_model(tmp_path_factory.mktemp("limits") / "tiny")


@pytest.fixture(scope="module")
def served(model_dir, tmp_path_factory):
    """`agentrl serve` as its own process (as deployed): the key from AGENTRL_API_KEY, tools not listed."""
    port = free_port()
    env = {**os.environ, "AGENTRL_API_KEY": KEY, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "agentrl.cli", "serve", str(model_dir), "--port", str(port)]
    log_path = tmp_path_factory.mktemp("served") / "serve.log"
    with open(log_path, "w") as log:  # a file, not a pipe: a full pipe would stall the server
        process = subprocess.Popen(
            [*command, "--model-name", MODEL, "--no-list-tools"], cwd=ROOT, env=env, stdout=log, stderr=log
        )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise AssertionError(f"agentrl serve did not come up: exit {process.returncode}\n{log_path.read_text()}")
        time.sleep(0.2)
    yield SimpleNamespace(base_url=base_url, port=port, pid=process.pid)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    assert process.returncode == 0, f"exit {process.returncode}\n{log_path.read_text()[-3000:]}"
    assert "API key required" in log_path.read_text()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


class HealthPoller:
    """GET /health over and over in a thread, keeping each answer's latency."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                started = time.perf_counter()
                assert client.get(self.base_url + "/health").status_code == 200
                self.latencies.append(time.perf_counter() - started)
                time.sleep(0.005)

    def __enter__(self) -> HealthPoller:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)


def post_huge(port: int, size: int, chunked: bool, headers: dict[str, str]) -> tuple[bytes, float, float]:
    """POST a chat body of `size` bytes over a raw socket, all of it, as clients do; the response, the seconds
    until it had come whole and the seconds the sending took."""
    prefix = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "<>"}]}).encode().split(b"<>")[0]
    piece = b"x" * (1 << 16)
    framing = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(size)}
    head = "".join(f"{name}: {value}\r\n" for name, value in {**headers, **framing}.items())
    sock = socket.create_connection(("127.0.0.1", port))
    response = bytearray()
    answered_after: list[float] = []

    def read() -> None:
        while chunk := sock.recv(1 << 16):
            response.extend(chunk)
            head, _, body = bytes(response).partition(b"\r\n\r\n")
            length = next(
                (int(line[15:]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length")), None
            )
            if length is not None and len(body) >= length:
                answered_after.append(time.perf_counter() - started)
                return

    reader = threading.Thread(target=read, daemon=True)
    started = time.perf_counter()
    reader.start()
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode())
    sent = 0
    while sent < size:
        data = prefix if sent == 0 else piece[: size - sent]
        sock.sendall(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
        sent += len(data)
    if chunked:
        sock.sendall(b"0\r\n\r\n")
    sending = time.perf_counter() - started
    reader.join(30)
    sock.close()
    assert answered_after, f"no whole response: {bytes(response[:300])!r}"
    return bytes(response), answered_after[0], sending


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_50_mb_body_is_refused_at_once_and_the_server_stays_responsive_and_small(served, chunked):
    before = rss_bytes(served.pid)
    with HealthPoller(served.base_url) as health:
        time.sleep(0.1)
        response, elapsed, sending = post_huge(
            served.port, 50 << 20, chunked, {**AUTH, "Content-Type": "application/json"}
        )
        time.sleep(0.1)
    grown = rss_bytes(served.pid) - before
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), response[:300]
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large" and str(4 << 20) in error["message"]
    print(
        f"\n50 MB body ({'chunked' if chunked else 'Content-Length'}): 413 after {elapsed * 1e3:.0f} ms, "
        f"all sent after {sending * 1e3:.0f} ms, "
        f"/health max {max(health.latencies) * 1e3:.1f} ms over {len(health.latencies)} polls, "
        f"RSS {grown / 2**20:+.1f} MiB"
    )
    assert elapsed < 1.0
    assert len(health.latencies) >= 5 and max(health.latencies) < 0.1
    assert grown < 50 << 20


def test_a_prompt_longer_than_any_context_is_refused_before_it_is_tokenized(served, model_dir):
    """3 MB of text, within the body limit: tokenizing it takes seconds (measured here), its refusal a blink."""
    from agentrl.models.loading import load_tokenizer

    text = "x" * (3 << 20)
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    with HealthPoller(served.base_url) as health:
        started = time.perf_counter()
        reply = httpx.post(served.base_url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
        refused = time.perf_counter() - started
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded"
    assert "3145728 characters" in reply.json()["error"]["message"]
    tokenizer = load_tokenizer(str(model_dir))
    started = time.perf_counter()
    tokenizer(text[: 1 << 20], add_special_tokens=False)
    tokenizing = (time.perf_counter() - started) * 3
    print(f"\n3 MB prompt: refused in {refused * 1e3:.0f} ms; tokenizing it would take ~{tokenizing:.1f} s")
    assert refused < min(0.5, tokenizing / 4)
    assert max(health.latencies) < 0.1


def test_the_api_key_guards_every_route_but_health(served):
    base = served.base_url
    chat = {"model": MODEL, "messages": HI, "max_tokens": 2}
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/nowhere")]:
        for headers, code in [({}, "missing_key"), ({"Authorization": "Bearer wrong"}, "invalid_api_key")]:
            reply = httpx.request(method, base + path, json=chat, headers=headers, timeout=30)
            assert reply.status_code == 401, (method, path, reply.text)
            assert reply.json()["error"]["code"] == code and reply.headers["www-authenticate"] == "Bearer"
    assert httpx.get(base + "/health", timeout=10).status_code == 200
    client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
    assert client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2).choices[0].message.role == "assistant"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()


def test_no_list_tools_keeps_the_tools_out_of_the_prompt(served, model_dir):
    from agentrl.models.loading import load_tokenizer
    from agentrl.serve.render import ChatRenderer

    client = openai.OpenAI(base_url=served.base_url + "/v1", api_key=KEY, max_retries=0)
    with_tools = client.chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, max_tokens=1)
    without = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=1)
    renderer = ChatRenderer(load_tokenizer(str(model_dir)))
    messages = [ChatMessage(**m) for m in HI]
    assert with_tools.usage.prompt_tokens == without.usage.prompt_tokens == len(renderer.prompt_ids(messages))
    assert len(renderer.prompt_ids(messages, TOOLS)) > without.usage.prompt_tokens  # listed, they would show


def test_a_call_asks_for_at_most_max_choices_completions(served):
    url = served.base_url + "/v1/completions"
    for prompts, n in [(2000, 1), (MAX_CHOICES + 1, 1), (2, MAX_CHOICES)]:
        body = {"model": MODEL, "prompt": ["hi"] * prompts, "n": n, "max_tokens": 1}
        reply = httpx.post(url, json=body, headers=AUTH, timeout=30)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "too_many_choices", reply.text
        assert f"at most {MAX_CHOICES}" in reply.json()["error"]["message"]
    body = {"model": MODEL, "prompt": ["hi"] * 4, "n": MAX_CHOICES // 4, "max_tokens": 1}
    assert len(httpx.post(url, json=body, headers=AUTH, timeout=60).json()["choices"]) == MAX_CHOICES


# ---- a client that goes away ------------------------------------------------------------------------------------


def _in_process_server(model_dir, scheduler: str):
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.engine.torch_engine import TorchEngine
    from agentrl.models.loading import load_causal_lm, load_tokenizer
    from agentrl.serve.app import build_app
    from agentrl.serve.completions import Completions
    from agentrl.serve.generation import LocalBackend

    tokenizer = load_tokenizer(str(model_dir))
    engine_class = ContinuousTorchEngine if scheduler == "continuous" else TorchEngine
    engine = engine_class(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id, seed=0)
    completions = Completions(LocalBackend(engine, tokenizer), tokenizer, MODEL, 1024)
    return ThreadServer(build_app(completions)), engine


@pytest.mark.parametrize(
    ("scheduler", "stream"), [("continuous", False), ("continuous", True), ("batch", False)], ids=str
)
def test_a_client_that_goes_away_stops_its_generations(model_dir, scheduler, stream):
    n, max_tokens = 16, 1000
    body = {"model": MODEL, "messages": HI, "n": n, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    payload = json.dumps(body).encode()
    server, engine = _in_process_server(model_dir, scheduler)
    try:
        with server:

            def in_flight() -> int:
                return httpx.get(server.base_url + "/health", timeout=10).json()["in_flight"]

            sock = socket.create_connection(("127.0.0.1", server.port))
            request = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n"
            sock.sendall(request.encode() + b"Content-Type: application/json\r\n\r\n" + payload)
            deadline = time.monotonic() + 30
            while in_flight() < n:
                assert time.monotonic() < deadline, "the generations did not start"
                time.sleep(0.01)
            if stream:
                assert sock.recv(1 << 16).startswith(b"HTTP/1.1 200")  # tokens are coming
            time.sleep(0.1)
            sock.close()
            gone = time.perf_counter()
            while in_flight() > 0:
                assert time.perf_counter() - gone < 2.0, "the generations went on after the client left"
                time.sleep(0.01)
            stopped_after = time.perf_counter() - gone
            # The engine is free again: a new call is answered, and the dropped rows made far from their tokens.
            reply = httpx.post(
                server.base_url + "/v1/chat/completions",
                json={"model": MODEL, "messages": HI, "max_tokens": 2},
                timeout=60,
            )
            assert reply.status_code == 200
            health = httpx.get(server.base_url + "/health", timeout=10).json()
    finally:
        engine.shutdown()
    generated = engine.stats["generated_tokens"]
    print(f"\n{scheduler} stream={stream}: in_flight 0 after {stopped_after * 1e3:.0f} ms, {generated} tokens made")
    assert health["dropped"] == n
    assert generated < n * max_tokens // 2


# ---- every error in OpenAI's shape ----------------------------------------------------------------------------------

CHAT = {"model": MODEL, "messages": HI, "max_tokens": 2}


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages.0.content", "5"),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800"}]}',
            "messages.0.content",
            "surrogate",
        ),
        ({**CHAT, "tools": [{}]}, "tools", "no function name"),
        ({**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}, "tools", "parameters"),
        ({**CHAT, "seed": 2**64}, "seed", str(2**63 - 1)),
        ({**CHAT, "seed": 2**64, "stream": True}, "seed", str(2**63 - 1)),  # refused before the stream starts
        ({**CHAT, "seed": -(2**63) - 1}, "seed", str(-(2**63))),
        (b'{"model": "tiny", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None, "too deeply"),
    ],
    ids=["number-text", "lone-surrogate", "empty-tool", "tool-parameters", "seed", "seed-stream", "seed-low", "deep"],
)
def test_malformed_requests_get_a_400_naming_the_field(served, body, param, words):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**AUTH, "Content-Type": "application/json"}
    reply = httpx.post(served.base_url + "/v1/chat/completions", content=content, headers=headers, timeout=30)
    assert reply.status_code == 400 and reply.headers["content-type"] == "application/json", reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_the_largest_seeds_sample(served):
    client = openai.OpenAI(base_url=served.base_url + "/v1", api_key=KEY, max_retries=0)
    for seed in (2**63 - 1, -(2**63)):
        reply = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, n=2, seed=seed)
        assert [choice.index for choice in reply.choices] == [0, 1]


def test_a_failure_inside_the_server_is_a_json_500_without_its_traceback():
    from fastapi import FastAPI

    from agentrl.serve.app import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    async def broken(request):
        raise KeyError("secret internals")

    app.add_route("/broken", broken, methods=["GET"])
    with ThreadServer(app) as server:
        reply = httpx.get(server.base_url + "/broken", timeout=10)
    assert reply.status_code == 500 and reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert error["type"] == "server_error" and "KeyError" in error["message"]
    assert "secret internals" not in reply.text and "Traceback" not in reply.text


def test_a_long_prompt_is_tokenized_off_the_event_loop(model_dir):
    """A prompt that may fit is tokenized whole: in a thread, while /health goes on being answered."""
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.models.loading import load_causal_lm, load_tokenizer
    from agentrl.serve.app import build_app
    from agentrl.serve.completions import Completions
    from agentrl.serve.generation import LocalBackend

    tokenizer = load_tokenizer(str(model_dir))
    text = "guess the number " * 60_000  # 1,020,000 characters: within every bound of a 1M-token context
    started = time.perf_counter()
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    tokenizing = time.perf_counter() - started
    engine = ContinuousTorchEngine(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id, seed=0)
    completions = Completions(LocalBackend(engine, tokenizer), tokenizer, MODEL, 1 << 20)
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1 << 20}
    try:
        with ThreadServer(build_app(completions)) as server, HealthPoller(server.base_url) as health:
            time.sleep(0.05)
            reply = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
            time.sleep(0.05)
    finally:
        engine.shutdown()
    error = reply.json()["error"]  # tokenized, then too long with its max_tokens
    assert error["code"] == "context_length_exceeded", error
    assert int(re.search(r"\((\d+) in the messages", error["message"]).group(1)) > tokens  # its whole prompt's ids
    print(
        f"\n{len(text)} characters ({tokens} tokens, {tokenizing:.2f} s to tokenize): /health max "
        f"{max(health.latencies) * 1e3:.1f} ms over {len(health.latencies)} polls"
    )
    assert tokenizing > 0.1  # on the loop, /health would have waited that long
    assert max(health.latencies) < max(0.1, tokenizing / 4)  # a loaded machine's hiccups are not that long
