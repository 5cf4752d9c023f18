"""`mpirun -n 2 agentrl serve`: rank 0's HTTP front spreads calls over both ranks' engines and stops on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
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
