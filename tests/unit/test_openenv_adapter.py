"""env ids openenv:...: OpenEnv environments from the packages, in this process and behind openenv-core's own
server: the echo environment `openenv init` writes from openenv-core's template, and openenv-dipg-safety's DIPG
environment on a JSONL dataset made here. check-env, two training steps, and the episodes that fail by name.

Marked `openenv`: openenv-core pulls gradio (about 140 MB; importing openenv.core.env_server imports it), so it is
not in the dev extra; `pip install 'agentrl[openenv]' openenv-dipg-safety` and run `pytest -m openenv`."""

import json
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agentrl.env import make
from agentrl.env.check import check_env
from agentrl.env.host import EnvHost

pytest.importorskip("openenv.core", reason="pip install 'agentrl[openenv]'")
pytestmark = [pytest.mark.openenv, pytest.mark.timeout(900)]

ECHO = "openenv:echo_env.server.echo_env_environment:EchoEnvironment"
DIPG = "openenv:med_safety_gym.dipg_environment:DIPGEnvironment"


@pytest.fixture(scope="module")
def echo_package(tmp_path_factory):
    """The folder holding `echo_env`, written by openenv-core's own `openenv init` (its template env)."""
    root = tmp_path_factory.mktemp("openenv")
    openenv = shutil.which("openenv") or pytest.skip("the openenv command of openenv-core is not on PATH")
    subprocess.run([openenv, "init", "echo_env", "-o", str(root)], check=True, capture_output=True, timeout=300)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


def dipg_kwargs(folder):
    rows = []
    for i in range(6):
        user = (
            f"<context>\nDrug X{i} was given to {i + 3} patients. Study A says it shrank tumours; study B says it "
            f"did not.\n</context>\n<question>\nDid drug X{i} shrink tumours?\n</question>"
        )
        rows.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "conflict"}]})
    data = folder / "dipg.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    rewards = dict.fromkeys(
        ("conflict_reward", "abstain_reward", "correct_abstention_reward", "verifiable_trace_reward"), 1.0
    )
    rewards |= dict.fromkeys(("correct_synthesis_reward", "exact_format_reward", "no_hallucination_reward"), 1.0)
    penalties = [
        "hallucination_penalty",
        "missing_answer_penalty",
        "hallucinated_trace_penalty",
        "proof_inconsistency_penalty",
        "incorrect_answer_penalty",
        "conflict_penalty",
        "abstain_penalty",
        "missing_trace_penalty",
        "format_mismatch_penalty",
    ]
    channels = {
        "analysis_channel_start": "<think>",
        "proof_channel_start": "<proof>",
        "final_channel_start": "<answer>",
        "channel_end": "</end>",
    }
    return {"dataset_path": str(data), **rewards, **dict.fromkeys(penalties, -1.0), **channels}


def test_the_echo_template_in_process_passes_check_env_and_a_never_ending_one_fails_by_name(echo_package):
    env = make(ECHO, truncate_after=2)
    assert env.reset(seed=0) == ("Echo Env environment ready!", {"openenv_reward": 0.0})
    text, reward, terminated, truncated, _ = env.step("hello")
    assert "echoed_message: hello" in text and reward == pytest.approx(0.5) and not (terminated or truncated)
    assert env.step("hi")[2:4] == (False, True)  # cut off after truncate_after=2 steps
    assert check_env(ECHO, {"truncate_after": 3}) == []
    (problem,) = check_env(ECHO, {})  # echo never ends: without truncate_after its episodes fail
    assert "did not end its episode within env.kwargs.max_steps=32" in problem
    host = EnvHost(ECHO, {"max_steps": 2}, call_timeout_s=60)
    assert host.handle("reset", "a", 0, None).ok and host.handle("step", "a", "x").ok
    failed = host.handle("step", "a", "x")
    assert not failed.ok and "set env.kwargs.truncate_after" in failed.error and host.counts()["failed"] == 1


def test_the_echo_template_behind_its_server_passes_check_env(echo_package):
    import uvicorn
    from echo_env.models import EchoAction, EchoObservation
    from echo_env.server.echo_env_environment import EchoEnvironment
    from openenv.core.env_server.http_server import create_app

    app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo_env", max_concurrent_envs=8)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.1)
        url = f"openenv:http://127.0.0.1:{port}"
        env = make(url, truncate_after=2)
        assert env.reset(seed=1)[0] == "Echo Env environment ready!"
        assert env.step("abc")[1] == pytest.approx(0.3)
        env.close()
        assert check_env(url, {"truncate_after": 2}) == []
    finally:
        server.should_exit = True
        thread.join(30)


def test_dipg_from_its_pypi_package_grades_answers_and_passes_check_env(tmp_path):
    pytest.importorskip("med_safety_gym", reason="pip install openenv-dipg-safety")
    kwargs = {"env_kwargs": dipg_kwargs(tmp_path)}
    env = make(DIPG, **kwargs)
    first, _ = env.reset(seed=4)
    assert "question: Did drug X" in first and env.reset(seed=4)[0] == first  # seeded: a group sees one task
    text, reward, terminated, _, info = env.step("yes")
    assert terminated and reward < 0 and "format_error" in text and info["success"] is False
    assert check_env(DIPG, kwargs) == []


CONFIG = """
run_dir: {run_dir}
steps: 2
seed: 0
model:
  path: {model}
  tiny: {{hidden_size: 32, num_layers: 2, num_heads: 4, vocab_size: 256}}
env:
  id: {env_id}
  kwargs: {kwargs}
rollout: {{tasks_per_step: 2, group_size: 4, max_turns: 2, max_new_tokens: 8, max_episode_tokens: 256}}
trainer: {{micro_batch_size: 8}}
runtime: {{env_step_timeout_s: 120}}
checkpoint: {{every: 0}}
logging: {{progress: false}}
"""


@pytest.mark.parametrize("which", ["echo", "dipg"])
def test_two_training_steps_on_an_openenv_environment(which, echo_package, tmp_path):
    if which == "dipg":
        pytest.importorskip("med_safety_gym", reason="pip install openenv-dipg-safety")
    env_id, kwargs = (ECHO, {"truncate_after": 2}) if which == "echo" else (DIPG, {"env_kwargs": dipg_kwargs(tmp_path)})
    run_dir = tmp_path / "run"
    config = tmp_path / "config.yaml"
    fields = {"run_dir": run_dir, "model": tmp_path / "model", "env_id": env_id, "kwargs": json.dumps(kwargs)}
    config.write_text(CONFIG.format(**fields))
    environment = {"PYTHONPATH": str(echo_package), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    trained = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", str(config)],
        capture_output=True,
        text=True,
        timeout=800,
        cwd=tmp_path,
        env=environment,
    )
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-4000:]
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    assert [event.value for event in events.Scalars("episode/count")] == [8.0, 8.0]
    assert [event.value for event in events.Scalars("episode/failed")] == [0.0, 0.0]
    assert len(events.Scalars("train/loss")) == 2
