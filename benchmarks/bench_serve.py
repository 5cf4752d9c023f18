"""`agentrl serve` under load: requests/s, tokens/s and per-call latency over HTTP, against the same engine called
in-process and against `model.generate` one request at a time.

    python benchmarks/bench_serve.py                       # 1, 8 and 64 concurrent clients, 20 new tokens each
    python benchmarks/bench_serve.py --concurrency 1,8,64 --new-tokens 20 --shape 256x4x8

A random Qwen2-shaped model (hidden x layers x heads, built locally with agentrl.models.tiny, no hub) is served by
`agentrl serve` in a subprocess (continuous scheduler). At each concurrency C, C client coroutines of the async
`openai` client each send chat completions one after the other (every call: its own short prompt, its own
seed, exactly max_tokens new tokens (`ignore_eos`), temperature 1); `in-process` runs the same prompt ids and
sampling through the engine `agentrl serve` builds (its engine section), in this process, with C coroutines;
`generate` runs `model.generate` on each prompt in turn.
`httpx` (concurrency 1) sends the same JSON with a bare httpx client, to tell the openai client's own cost apart.

`raw socket` writes the request bytes on kept-alive sockets (one per client) and reads the replies: no client library.

The HTTP layer's cost per call is read two ways at concurrency 1:
- split: the server reports how long its app took with each reply (`Server-Timing: app;dur=MS`, from the route
  handler's start to its response body: parsing the JSON, rendering the chat template, the engine, the response).
  The call's latency minus that is what the client library, the connection and uvicorn took, in the same call on
  the same engine;
- paired: each prompt goes once in-process and once over HTTP, back to back, and the median of the differences is
  taken. This also holds the app's own work (chat template, JSON), and two processes' engines, whose decode speed
  differs by a percent or two.
At the highest concurrency: median(HTTP latency) - median(in-process latency) over the pooled calls, as a share of
the HTTP call's median latency, and the throughputs' ratio.

`--rounds` repeats every concurrency level, each way in turn, and pools the calls. On a machine with 2 or more
cores the server is pinned to the last core and this process (the clients, and the in-process engine) to the
others (`--no-pin` leaves both free), so that the engine has one core either way and the clients' own work does
not take the server's core.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "An agent reads the observation and then decides what to do next.",
    "Guess a number between 1 and 100; the host answers higher or lower.",
    "12 + 30 = 42, 7 * 8 = 56, 99 - 17 = 82",
    string.printable,
]
MODEL = "bench"


CALLS = itertools.count()


def prompts(count: int) -> list[str]:
    """Prompts no call sent before: an engine reuses the KV of a prompt prefix it has seen, so a prompt sent twice
    (by two ways in turn) would prefill faster the second time. Only the chat template's head is shared."""
    return [f"Call {n}: {TEXTS[i % 4]}" for i, n in enumerate(itertools.islice(CALLS, count))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def summary(
    name: str, concurrency: int, latencies: list[float], tokens: int, wall: float, outside: list | None = None
) -> dict:
    """`outside`: each call's latency minus the server's app time, where the server reported it."""
    latencies = sorted(latencies)
    return {
        "outside": outside or [],
        "way": name,
        "clients": concurrency,
        "latencies": latencies,
        "tokens": tokens,
        "wall": wall,
        "calls": len(latencies),
        "req_s": len(latencies) / wall,
        "tok_s": tokens / wall,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p90_ms": latencies[int(0.9 * (len(latencies) - 1))] * 1e3,
        "outside_ms": statistics.median(outside) * 1e3 if outside else None,
    }


async def closed_loop(concurrency: int, calls: int, one_call) -> tuple[list[float], int, float, list[float]]:
    """`concurrency` workers share `calls` calls; each call's latency, the tokens made, the wall time, and each
    call's latency minus the server's app time where `one_call(index, app_times)` reported one."""
    latencies, outside, made = [], [], [0]
    queue = list(range(calls))

    async def worker():
        while queue:
            index = queue.pop()
            app_times: list[float] = []
            started = time.perf_counter()
            tokens = await one_call(index, app_times)  # not `made[0] += await ...`: reads made[0] before awaiting
            made[0] += tokens
            latency = time.perf_counter() - started
            latencies.append(latency)
            outside.extend(latency - app for app in app_times)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, made[0], time.perf_counter() - started, outside


def app_seconds(headers) -> float:
    """The server's own time for the call, from its `Server-Timing: app;dur=MS` header."""
    return float(headers["server-timing"].partition("app;dur=")[2].split(",")[0]) / 1e3


def chat_body(text: str, seed: int, new_tokens: int) -> dict:
    messages = [{"role": "user", "content": text}]
    return {"model": MODEL, "messages": messages, "max_tokens": new_tokens, "seed": seed, "ignore_eos": True}


async def openai_call(client, text: str, seed: int, new_tokens: int, app_times: list | None = None) -> int:
    """One chat completion through the `openai` client; the tokens it made (and the server's app time)."""
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": text}],
        max_tokens=new_tokens,
        seed=seed,
        extra_body={"ignore_eos": True},
    )
    if app_times is not None:
        app_times.append(app_seconds(raw.headers))
    return raw.parse().usage.completion_tokens


async def httpx_call(client, text: str, seed: int, new_tokens: int, app_times: list | None = None) -> int:
    """The same call's JSON through a bare httpx client."""
    response = await client.post("/v1/chat/completions", json=chat_body(text, seed, new_tokens))
    if app_times is not None:
        app_times.append(app_seconds(response.headers))
    return response.json()["usage"]["completion_tokens"]


class RawSocket:
    """HTTP/1.1 on one kept-alive socket, no client library: the request's bytes out, the reply's bytes in."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.pending = bytearray()

    async def post(self, path: str, body: bytes) -> tuple[dict[str, str], bytes]:
        """(headers by lowercase name, body) of the reply; it must carry a Content-Length (JSON replies do)."""
        loop = asyncio.get_running_loop()
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        await loop.sock_sendall(self.sock, f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        while b"\r\n\r\n" not in self.pending:
            self.pending += await self._receive(loop)
        end = self.pending.index(b"\r\n\r\n") + 4
        lines = bytes(self.pending[: end - 4]).decode("latin-1").split("\r\n")[1:]  # after the status line
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        length = int(headers["content-length"])
        while len(self.pending) < end + length:
            self.pending += await self._receive(loop)
        body = bytes(self.pending[end : end + length])
        del self.pending[: end + length]
        return headers, body

    async def _receive(self, loop) -> bytes:
        chunk = await loop.sock_recv(self.sock, 1 << 16)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


async def raw_call(client: RawSocket, text: str, seed: int, new_tokens: int, app_times: list | None = None) -> int:
    """The same call's JSON, written and read on a bare socket."""
    headers, body = await client.post("/v1/chat/completions", json.dumps(chat_body(text, seed, new_tokens)).encode())
    if app_times is not None:
        app_times.append(app_seconds(headers))
    return json.loads(body)["usage"]["completion_tokens"]


async def engine_call(engine, prompt_ids: list[int], seed: int, new_tokens: int) -> int:
    """The same sampling on the engine in this process."""
    from agentrl.engine.base import SamplingParams

    sampling = SamplingParams(new_tokens, temperature=1.0, seed=seed)
    return len((await engine.generate(prompt_ids, sampling)).output_ids)


def over_http(base: str, concurrency: int, calls: int, new_tokens: int) -> dict:
    import openai

    texts = prompts(calls)

    async def run():
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)

        async def one_call(i: int, app_times: list) -> int:
            return await openai_call(client, texts[i], i, new_tokens, app_times)

        result = await closed_loop(concurrency, calls, one_call)
        await client.close()
        return result

    return summary("HTTP (openai client)", concurrency, *asyncio.run(run()))


def over_httpx(base: str, calls: int, new_tokens: int) -> dict:
    import httpx

    texts = prompts(calls)

    async def run():
        async with httpx.AsyncClient(base_url=base, timeout=600) as client:

            async def one_call(i: int, app_times: list) -> int:
                return await httpx_call(client, texts[i], i, new_tokens, app_times)

            return await closed_loop(1, calls, one_call)

    return summary("HTTP (bare httpx)", 1, *asyncio.run(run()))


def over_raw_socket(port: int, concurrency: int, calls: int, new_tokens: int) -> dict:
    """`concurrency` kept-alive connections, one per client coroutine."""
    texts = prompts(calls)

    async def run():
        idle = [RawSocket(port) for _ in range(concurrency)]

        async def one_call(i: int, app_times: list) -> int:
            client = idle.pop()
            try:
                return await raw_call(client, texts[i], i, new_tokens, app_times)
            finally:
                idle.append(client)

        try:
            return await closed_loop(concurrency, calls, one_call)
        finally:
            for client in idle:
                client.close()

    return summary("HTTP (raw socket)", concurrency, *asyncio.run(run()))


def paired_overhead(base: str, port: int, engine, renderer, calls: int, new_tokens: int) -> dict[str, float]:
    """Median per-call latency difference (ms) of HTTP minus in-process, each prompt once each way, back to back."""
    import httpx
    import openai

    from agentrl.serve.protocol import ChatMessage

    ids = [renderer.prompt_ids([ChatMessage(role="user", content=text)]) for text in prompts(calls)]
    texts = {way: prompts(calls) for way in ("openai", "httpx", "raw socket")}

    async def run():
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
        bare = httpx.AsyncClient(base_url=base, timeout=600)
        raw = RawSocket(port)
        gaps = {"openai": [], "httpx": [], "raw socket": []}
        for i in range(calls):  # each prompt: its own text each way, of the same length
            started = time.perf_counter()
            await engine_call(engine, ids[i], i, new_tokens)
            local = time.perf_counter() - started
            for way, call in (
                ("openai", openai_call(client, texts["openai"][i], i, new_tokens)),
                ("httpx", httpx_call(bare, texts["httpx"][i], i, new_tokens)),
                ("raw socket", raw_call(raw, texts["raw socket"][i], i, new_tokens)),
            ):
                started = time.perf_counter()
                await call
                gaps[way].append(time.perf_counter() - started - local)
        await client.close()
        await bare.aclose()
        raw.close()
        return {way: statistics.median(values) * 1e3 for way, values in gaps.items()}

    return asyncio.run(run())


def pooled(parts: list[dict]) -> dict:
    """One row from the same way's rounds: their calls pooled, rates over their summed wall time."""
    latencies = [latency for part in parts for latency in part["latencies"]]
    wall = sum(part["wall"] for part in parts)
    outside = [value for part in parts for value in part["outside"]]
    return summary(parts[0]["way"], parts[0]["clients"], latencies, sum(p["tokens"] for p in parts), wall, outside)


def in_process(engine, renderer, concurrency: int, calls: int, new_tokens: int) -> dict:
    from agentrl.serve.protocol import ChatMessage

    ids = [renderer.prompt_ids([ChatMessage(role="user", content=text)]) for text in prompts(calls)]

    async def one_call(i: int, app_times: list) -> int:
        return await engine_call(engine, ids[i], i, new_tokens)

    return summary("in-process engine", concurrency, *asyncio.run(closed_loop(concurrency, calls, one_call)))


def hf_generate(model, renderer, calls: int, new_tokens: int) -> dict:
    import torch

    from agentrl.serve.protocol import ChatMessage

    ids = [renderer.prompt_ids([ChatMessage(role="user", content=text)]) for text in prompts(calls)]
    latencies, made = [], 0
    started = time.perf_counter()
    for prompt in ids:
        begin = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=new_tokens,
                do_sample=True,
                top_k=0,
                min_new_tokens=new_tokens,
                pad_token_id=renderer.tokenizer.pad_token_id,
            )
        made += out.shape[1] - len(prompt)
        latencies.append(time.perf_counter() - begin)
    return summary("model.generate, one at a time", 1, latencies, made, time.perf_counter() - started)


def start_server(model_dir: Path, port: int, max_batch_size: int, cores: set[int] | None) -> subprocess.Popen:
    import httpx

    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "agentrl.cli", "serve", str(model_dir), "--port", str(port)]
    server = subprocess.Popen(
        [*command, "--model-name", MODEL, f"max_batch_size={max_batch_size}"],
        env=env,
        cwd=ROOT,
        preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.3)
    server.kill()
    raise RuntimeError("agentrl serve did not come up within 180 s")


def table(rows: list[dict]) -> str:
    lines = [
        "| way | clients | calls | requests/s | tokens/s | latency p50 (ms) | p90 (ms) | outside the app p50 (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        outside = "" if r["outside_ms"] is None else f"{r['outside_ms']:.2f}"
        lines.append(
            f"| {r['way']} | {r['clients']} | {r['calls']} | {r['req_s']:.1f} | {r['tok_s']:.0f} | "
            f"{r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {outside} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="256x4x8", help="hidden x layers x heads of the random Qwen2 model")
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated numbers of concurrent clients")
    parser.add_argument("--new-tokens", type=int, default=20, help="max_tokens of every call")
    parser.add_argument("--calls-per-client", type=int, default=3, help="calls per client (at least 24 in all)")
    parser.add_argument("--rounds", type=int, default=3, help="times every level is measured, each way in turn")
    parser.add_argument("--no-pin", action="store_true", help="leave the server and the clients on every core")
    args = parser.parse_args()

    import torch

    from agentrl.commands.serve import engine_section
    from agentrl.engine import build_torch_engine
    from agentrl.models.loading import load_causal_lm, load_tokenizer
    from agentrl.models.tiny import TinyShape, build_tiny_model
    from agentrl.serve.render import ChatRenderer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    levels = [int(c) for c in args.concurrency.split(",")]
    hidden, layers, heads = (int(x) for x in args.shape.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(
            Path(tmp) / "model", TEXTS, TinyShape(hidden_size=hidden, num_layers=layers, num_heads=heads)
        )
        model = load_causal_lm(str(model_dir))
        tokenizer = load_tokenizer(str(model_dir))
        renderer = ChatRenderer(tokenizer)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"model {args.shape} ({params:.2f}M parameters), {args.new_tokens} new tokens per call", flush=True)
        port = free_port()
        cores = sorted(os.sched_getaffinity(0))
        server_cores = None
        if not args.no_pin and len(cores) >= 2:
            server_cores = {cores[-1]}
            os.sched_setaffinity(0, set(cores[:-1]))
            print(f"server pinned to core {cores[-1]}, clients and the in-process engine to {cores[:-1]}", flush=True)
        server = start_server(model_dir, port, max(levels), server_cores)
        base = f"http://127.0.0.1:{port}"
        parts: dict[tuple[str, int], list[dict]] = {}
        try:
            over_http(base, 4, 8, args.new_tokens)  # warm-up: first calls, the engine's thread, connections
            # The server's own engine settings (`agentrl serve`'s defaults), so only the HTTP layer differs.
            section = engine_section([f"max_batch_size={max(levels)}"])
            engine = build_torch_engine(model, section, pad_token_id=tokenizer.pad_token_id, seed=0)
            in_process(engine, renderer, 4, 8, args.new_tokens)
            for _ in range(args.rounds):
                for concurrency in levels:
                    calls = max(24, concurrency * args.calls_per_client)
                    measured = [
                        over_http(base, concurrency, calls, args.new_tokens),
                        over_raw_socket(port, concurrency, calls, args.new_tokens),
                        in_process(engine, renderer, concurrency, calls, args.new_tokens),
                    ]
                    if concurrency == 1:
                        measured.append(over_httpx(base, calls, args.new_tokens))
                    for row in measured:
                        parts.setdefault((row["way"], row["clients"]), []).append(row)
                    print(table(measured).split("\n", 2)[-1], flush=True)
            gaps = paired_overhead(base, port, engine, renderer, 24 * args.rounds, args.new_tokens)
            rows = [pooled(group) for group in parts.values()]
            rows.sort(key=lambda row: row["clients"])
            rows.append(hf_generate(model, renderer, 24, args.new_tokens))
            engine.shutdown()
        finally:
            server.terminate()
            server.wait(timeout=30)
    print()
    print(table(rows))
    by = {(r["way"], r["clients"]): r for r in rows}
    http1, local1 = by[("HTTP (openai client)", 1)], by[("in-process engine", 1)]
    top = max(levels)
    local_top = by[("in-process engine", top)]
    split = {way: by[(f"HTTP ({way})", 1)]["outside_ms"] for way in ("raw socket", "bare httpx", "openai client")}
    print()
    print(
        "HTTP layer at 1 client, split (median of latency - the server's app time, per call; goal < 1 ms): "
        + ", ".join(f"{value:.2f} ms with {way}" for way, value in split.items())
    )
    print(
        "HTTP at 1 client, paired (median over "
        f"{24 * args.rounds} prompts of HTTP latency - in-process engine latency, back to back; the app's chat "
        "template and JSON included): "
        + ", ".join(f"{value:.2f} ms with {way}" for way, value in gaps.items())
        + f". Pooled medians, openai client: {http1['p50_ms'] - local1['p50_ms']:.2f} ms"
    )
    for way in ("raw socket", "openai client"):
        http_top = by[(f"HTTP ({way})", top)]
        share = (http_top["p50_ms"] - local_top["p50_ms"]) / http_top["p50_ms"]
        print(
            f"HTTP at {top} clients with {way}: median latency {share:.1%} above the in-process engine's, of a "
            f"{args.new_tokens}-token call (goal < 5%); throughput {http_top['tok_s'] / local_top['tok_s']:.2f}x "
            "the in-process engine's"
        )


if __name__ == "__main__":
    main()
