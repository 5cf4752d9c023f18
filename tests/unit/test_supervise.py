"""`agentrl supervise` with real child processes: restarts on a crash, never on a stop, a user error or Ctrl-C."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from agentrl.run.supervise import backoff_s, describe_exit, exit_status, supervise

pytestmark = pytest.mark.timeout(60)


def child(tmp_path, body: str) -> list[str]:
    """A command that records its arguments and restart count, then runs `body` (may use `starts`)."""
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, sys, time
            from pathlib import Path
            log = Path(sys.argv[1])
            with log.open("a") as out:
                out.write(os.environ["AGENTRL_RESTART_COUNT"] + " " + " ".join(sys.argv[2:]) + "\\n")
            starts = len(log.read_text().splitlines())
            """
        )
        + textwrap.dedent(body)
    )
    return [sys.executable, str(script), str(tmp_path / "starts.log"), "train", "x.yaml"]


def starts(tmp_path) -> list[str]:
    return (tmp_path / "starts.log").read_text().splitlines()


def test_crashes_are_restarted_with_resume_until_it_succeeds(tmp_path, capfd):
    command = child(
        tmp_path, "os.kill(os.getpid(), signal.SIGKILL) if starts == 1 else sys.exit(1 if starts == 2 else 0)"
    )
    assert supervise(command, max_restarts=3, backoff_base_s=0.01) == 0
    assert starts(tmp_path) == ["0 train x.yaml", "1 train x.yaml resume=true", "2 train x.yaml resume=true"]
    err = capfd.readouterr().err
    assert "restart 1/3: the job exited 137 (killed by SIGKILL)" in err
    assert "restart 2/3: the job exited 1 after" in err and "with resume=true" in err


def test_gives_up_after_max_restarts(tmp_path, capfd):
    assert supervise(child(tmp_path, "sys.exit(3)"), max_restarts=2, backoff_base_s=0.01) == 3
    assert len(starts(tmp_path)) == 3
    assert "no restarts left (2 used)" in capfd.readouterr().err


@pytest.mark.parametrize("code", [75, 2, 130])
def test_a_stop_a_user_error_and_ctrl_c_are_not_restarted(tmp_path, code):
    assert supervise(child(tmp_path, f"sys.exit({code})"), max_restarts=3, backoff_base_s=0.01) == code
    assert len(starts(tmp_path)) == 1


def test_a_signal_to_the_supervisor_reaches_the_job_and_ends_it(tmp_path):
    body = """
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
        Path(sys.argv[1] + ".ready").touch()
        time.sleep(30)
    """
    command = [sys.executable, "-m", "agentrl.cli", "supervise", "--backoff-s", "0.01", "--", *child(tmp_path, body)]
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.monotonic() + 30
    while not (tmp_path / "starts.log.ready").exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 75
    assert len(starts(tmp_path)) == 1


def test_exit_descriptions_and_backoff():
    assert exit_status(-9) == 137 and exit_status(1) == 1
    assert describe_exit(75) == "exited 75 (stopped by a signal, with a checkpoint)"
    assert describe_exit(143) == "exited 143 (killed by SIGTERM)"
    assert [backoff_s(n, 3.0) for n in (1, 2, 3, 10)] == [3.0, 6.0, 12.0, 60.0]
