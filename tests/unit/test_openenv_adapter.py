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

from agentrl.env import make
from agentrl.env.check import check_env
from agentrl.env.host import EnvHost
from tests.unit.ecosystem_runs import ON_AN_ENV_RANK, assert_clean_steps, evaluate, train, write_config

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


@pytest.fixture(scope="module")
def echo_server(echo_package):
    """openenv:http://127.0.0.1:PORT: the echo template behind openenv-core's own server (create_app), in a thread,
    with sessions for 8 episodes at once."""
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
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.1)
    yield f"openenv:http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def test_the_echo_template_behind_its_server_passes_check_env(echo_server):
    env = make(echo_server, truncate_after=2)
    assert env.reset(seed=1)[0] == "Echo Env environment ready!"
    assert env.step("abc")[1] == pytest.approx(0.3)
    env.close()
    assert check_env(echo_server, {"truncate_after": 2}) == []


def test_dipg_from_its_pypi_package_grades_answers_and_passes_check_env(tmp_path):
    pytest.importorskip("med_safety_gym", reason="pip install openenv-dipg-safety")
    kwargs = {"env_kwargs": dipg_kwargs(tmp_path)}
    env = make(DIPG, **kwargs)
    first, _ = env.reset(seed=4)
    assert "question: Did drug X" in first and env.reset(seed=4)[0] == first  # seeded: a group sees one task
    text, reward, terminated, _, info = env.step("yes")
    assert terminated and reward < 0 and "format_error" in text and info["success"] is False
    assert check_env(DIPG, kwargs) == []


OPENENV_RUN = {"rollout.max_turns": 2, "runtime.env_step_timeout_s": 120, "model.tiny.vocab_size": 256}


@pytest.mark.timeout(1800)
def test_two_training_steps_on_dipg_in_process_then_agentrl_eval(tmp_path):
    pytest.importorskip("med_safety_gym", reason="pip install openenv-dipg-safety")
    config = write_config(tmp_path, DIPG, {"env_kwargs": dipg_kwargs(tmp_path)}, **OPENENV_RUN)
    assert_clean_steps(train(config, timeout=800), steps=2, episodes=8)
    report = evaluate(config, "eval.seeds=[0,4]", "eval.n=1", timeout=800)
    assert report["metrics"]["episodes"] == 4 and report["metrics"]["failed"] == 0


@pytest.mark.timeout(1800)
def test_two_training_steps_on_an_env_rank_against_the_echo_server(echo_server, tmp_path):
    """mpirun -n 3: the env rank opens one WebSocket session of the server per episode; the server's 8 sessions
    hold a step's 8 episodes."""
    config = write_config(tmp_path, echo_server, {"truncate_after": 2}, **OPENENV_RUN, **ON_AN_ENV_RANK)
    logged = train(config, ranks=3, timeout=800)
    assert_clean_steps(logged, steps=2, episodes=8)
    assert [turns for _, turns in logged["episode/turns_mean"]] == [2.0, 2.0]  # cut off by truncate_after
