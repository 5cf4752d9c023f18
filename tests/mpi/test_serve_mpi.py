"""`mpirun -n 2 agentrl serve`: rank 0's HTTP front spreads calls over both ranks' engines and stops on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time

import httpx
import pytest

from tests.conftest import ROOT, mpirun_command
from tests.mpi.helpers import finish, job_env, rank_command
from tests.unit.serve_server import build_serve_model, free_port

pytestmark = pytest.mark.mpi
openai = pytest.importorskip("openai")


def test_two_ranks_serve_concurrent_calls_and_stop_on_sigterm(tmp_path):
    model = build_serve_model(tmp_path / "tiny")
    port = free_port()
    command = [*mpirun_command(2), *rank_command(), "-m", "agentrl.cli", "serve", str(model), "--port", str(port)]
    job = subprocess.Popen(
        [*command, "--model-name", "tiny", "max_batch_size=16"],
        cwd=ROOT,
        env=job_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if job.poll() is not None or time.monotonic() > deadline:
            os.killpg(job.pid, signal.SIGKILL)
            out, err = job.communicate()
            raise AssertionError(f"the server did not come up: exit {job.returncode}\n{out}\n{err[-3000:]}")
        time.sleep(0.3)

    async def calls():
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        chats = [
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"guess {i % 4}"}], max_tokens=6, seed=i % 4
            )
            for i in range(16)
        ]
        return await asyncio.gather(*chats)

    try:
        responses = asyncio.run(calls())
        health = httpx.get(base + "/health", timeout=5).json()
        streamed = openai.OpenAI(base_url=base + "/v1", api_key="unused").chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "guess 1"}], max_tokens=6, seed=1, stream=True
        )
        stream_text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    finally:
        job.send_signal(signal.SIGTERM)  # to mpirun, which passes it to both ranks
    out, err = finish(job, 60, "mpirun -n 2 agentrl serve after SIGTERM")
    assert job.returncode == 0, f"exit {job.returncode}\n{out}\n{err[-3000:]}"
    assert "server stopped" in out
    assert all(r.choices[0].finish_reason in ("length", "stop") for r in responses)
    texts = {}
    for i, response in enumerate(responses):  # same prompt and seed: the same reply, whichever rank made it
        texts.setdefault(i % 4, set()).add(response.choices[0].message.content)
    assert all(len(replies) == 1 for replies in texts.values())
    assert {stream_text} == texts[1]
    served = {rank["rank"]: rank["served"] for rank in health["ranks"]}
    assert served[0] > 0 and served[1] > 0 and sum(served.values()) == 16


def test_a_client_that_goes_away_stops_its_generations_on_every_rank(tmp_path):
    """A dropped call's generations on the other rank are cancelled there (rank 0 sends `cancel`): every rank's
    in_flight is 0 soon after the client left, and each rank reports the generations it dropped."""
    model = build_serve_model(tmp_path / "tiny")
    port = free_port()
    command = [*mpirun_command(2), *rank_command(), "-m", "agentrl.cli", "serve", str(model), "--port", str(port)]
    job = subprocess.Popen(
        [*command, "--model-name", "tiny"],
        cwd=ROOT,
        env=job_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def ranks() -> list[dict]:
        return httpx.get(base + "/health", timeout=5).json()["ranks"]

    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if job.poll() is not None or time.monotonic() > deadline:
            os.killpg(job.pid, signal.SIGKILL)
            out, err = job.communicate()
            raise AssertionError(f"the server did not come up: exit {job.returncode}\n{out}\n{err[-3000:]}")
        time.sleep(0.3)
    n = 16
    body = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "n": n,
            "max_tokens": 1000,
            "ignore_eos": True,
        }
    ).encode()
    try:
        sock = socket.create_connection(("127.0.0.1", port))
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)
        while sum(rank["in_flight"] for rank in ranks()) < n:
            assert time.monotonic() < deadline + 60, "the generations did not start"
            time.sleep(0.02)
        time.sleep(0.2)
        sock.close()
        gone = time.monotonic()
        while sum(rank["in_flight"] for rank in ranks()) > 0:
            assert time.monotonic() - gone < 3.0, f"generations went on after the client left: {ranks()}"
            time.sleep(0.02)
        health = ranks()
    finally:
        job.send_signal(signal.SIGTERM)
    out, err = finish(job, 60, "mpirun -n 2 agentrl serve after SIGTERM")
    assert job.returncode == 0, f"exit {job.returncode}\n{out}\n{err[-3000:]}"
    assert [rank["dropped"] for rank in health] == [n // 2, n // 2], health
