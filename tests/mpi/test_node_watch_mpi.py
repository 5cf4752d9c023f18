"""`agentrl sft` and `agentrl serve` over two (simulated) nodes: a node that freezes (SIGSTOP: its ranks and their
heartbeat thread stop, nothing closes) ends the job within runtime.peer_timeout_s, naming the node."""

import json
import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.conftest import ROOT, mpirun_command
from tests.mpi.helpers import finish, job_env, rank_command, ranks_with
from tests.unit.serve_server import build_serve_model, free_port

pytestmark = pytest.mark.mpi

TIMEOUT_S = 2.0


def start(args: list[str]) -> subprocess.Popen:
    env = {**job_env(), "AGENTRL_RANKS_PER_NODE": "1"}  # each rank its own node, so rank 1 leads node 1
    command = [*mpirun_command(2), *rank_command(), "-m", "agentrl.cli", *args]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, **pipes)


def freeze_rank_one_and_expect_the_end(job: subprocess.Popen, argument: str) -> None:
    """SIGSTOP world rank 1 (the job's ranks have `argument` on their command line); the job must end, naming it."""
    frozen = ranks_with(argument)[1]
    os.kill(frozen, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        out, err = finish(job, 60, "the job after node 1 froze")
    finally:
        if os.path.exists(f"/proc/{frozen}"):
            os.kill(frozen, signal.SIGKILL)
    took = time.monotonic() - stopped_at
    assert job.returncode != 0, out + err[-3000:]
    assert f"nothing heard from node 1 (its first rank, 1) for {TIMEOUT_S:.0f}." in err, err[-3000:]
    assert "presumed lost" in err
    assert took < TIMEOUT_S + 20, f"the job ended {took:.1f} s after the freeze"


def test_sft_ends_when_a_node_freezes(tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": f"guess {i}"}, {"role": "assistant", "content": str(i)}]}
        for i in range(8)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = tmp_path / "sft"
    settings = {
        "run_dir": run,
        "model.path": tmp_path / "model",
        "model.tiny": "{hidden_size: 32, num_layers: 2, num_heads: 4, vocab_size: 96}",
        "sft.train": tmp_path / "train.jsonl",
        "sft.epochs": 100000,  # far longer than the test: the freeze ends it
        "sft.batch_size": 4,
        "sft.micro_batch_size": 2,
        "checkpoint.every": 0,
        "logging.progress": "false",
        "runtime.peer_timeout_s": TIMEOUT_S,
    }
    job = start(["sft", str(ROOT / "launch/configs/sft_example.yaml"), *[f"{k}={v}" for k, v in settings.items()]])
    deadline = time.monotonic() + 180
    while not ((run / "tb").is_dir() and any((run / "tb").glob("events.*"))):  # the logger is up: training
        if job.poll() is not None or time.monotonic() > deadline:
            out, err = finish(job, 5, "sft")
            raise AssertionError(f"sft did not start training: exit {job.returncode}\n{out}\n{err[-3000:]}")
        time.sleep(0.2)
    freeze_rank_one_and_expect_the_end(job, f"run_dir={run}")


def test_serve_ends_when_a_node_freezes(tmp_path):
    model = build_serve_model(tmp_path / "tiny")
    port = free_port()
    job = start(["serve", str(model), "--port", str(port), "--peer-timeout-s", str(TIMEOUT_S)])
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if job.poll() is not None or time.monotonic() > deadline:
            out, err = finish(job, 5, "serve")
            raise AssertionError(f"the server did not come up: exit {job.returncode}\n{out}\n{err[-3000:]}")
        time.sleep(0.3)
    freeze_rank_one_and_expect_the_end(job, str(port))
