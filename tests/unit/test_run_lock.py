"""The run_dir lock: one owner, refusals that name it, stale locks of dead processes taken over."""

import json
import os
import socket
import subprocess
import sys

import pytest

from agentrl.run.lock import LOCK_FILE, RunDirInUse, RunLock, why_stale


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_second_lock_is_refused_naming_the_owner(tmp_path):
    first = RunLock(tmp_path)
    assert first.acquire(["agentrl", "train", "a.yaml", "seed=0"]) is None
    with pytest.raises(RunDirInUse) as refused:
        RunLock(tmp_path).acquire(["agentrl", "train", "a.yaml", "seed=1"])
    message = str(refused.value)
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in message
    assert "agentrl train a.yaml seed=0" in message and "run_dir=" in message
    first.release()
    assert not (tmp_path / LOCK_FILE).exists()
    second = RunLock(tmp_path)
    assert second.acquire() is None
    second.release()


def test_a_lock_of_a_dead_process_is_taken_over(tmp_path):
    pid = dead_pid()
    holder = {"host": socket.gethostname(), "pid": pid, "started": "then", "command": "agentrl train old.yaml"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(holder))
    lock = RunLock(tmp_path)
    note = lock.acquire()
    assert f"pid {pid} is no longer running; it started then" in note
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_reused_pid_is_stale_and_a_live_owner_is_not():
    me = {"host": socket.gethostname(), "pid": os.getpid()}
    assert why_stale(me) is None  # alive, start time unknown
    assert why_stale({**me, "pid_start_ticks": 1}) == f"pid {os.getpid()} now belongs to another process"
    assert why_stale({"host": "another-host", "pid": dead_pid()}) is None  # cannot tell from here


def test_an_earlier_start_of_the_same_slurm_job_on_another_node_is_stale(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert "earlier start of this SLURM job (42)" in why_stale({"host": "node-7", "pid": 1, "slurm_job": "42"})
    assert why_stale({"host": "node-7", "pid": 1, "slurm_job": "41"}) is None


def test_release_leaves_a_lock_it_does_not_own(tmp_path):
    lock = RunLock(tmp_path)
    lock.acquire()
    other = {"host": "elsewhere", "pid": 1, "command": "someone else's"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(other))
    lock.release()
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == other


def test_a_file_that_is_not_a_lock_is_named(tmp_path):
    (tmp_path / LOCK_FILE).write_text("garbage")
    with pytest.raises(RunDirInUse, match=r"not a lock this version wrote .* delete"):
        RunLock(tmp_path).acquire()


def test_a_restart_waits_for_its_previous_start_to_exit(tmp_path):
    previous = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    holder = {"host": socket.gethostname(), "pid": previous.pid, "command": "the previous start"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(holder))
    with pytest.raises(RunDirInUse):
        RunLock(tmp_path).acquire()  # no wait: a live owner is another run
    lock = RunLock(tmp_path)
    note = lock.acquire(wait_s=30)  # not reaped by this test until the end: a zombie counts as gone
    assert f"pid {previous.pid} is no longer running" in note
    lock.release()
    previous.wait()


def test_an_earlier_start_under_the_same_supervisor_on_another_node_is_stale(monkeypatch):
    monkeypatch.setenv("AGENTRL_SUPERVISOR", "node0:100:5")
    monkeypatch.setenv("AGENTRL_RESTART_COUNT", "1")
    holder = {"host": "node1", "pid": 7, "supervisor": "node0:100:5", "restart": 0}
    assert "start 0 of this `agentrl supervise` (node0:100:5), on node1" in why_stale(holder)
    assert why_stale({**holder, "supervisor": "node0:101:5"}) is None  # another supervisor's job may be alive
    assert why_stale({**holder, "restart": 1}) is None  # this very start (or a later one): never stale
    monkeypatch.delenv("AGENTRL_SUPERVISOR")
    assert why_stale(holder) is None
