"""A quick env's calls on the main thread, under a timer signal's deadline (agentrl/env/host.py and
main_thread_timer.py)."""

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.env.main_thread_timer import MainThreadTimer

pytestmark = pytest.mark.skipif(MainThreadTimer.get() is None, reason="needs Linux timer signals on the main thread")


class ThreadEnv:
    """Tells which thread ran each call; its step's action says how to misbehave."""

    reusable = True
    killed = 0

    def reset(self, *, seed=None, options=None):
        return "go", {"thread": threading.current_thread().name}

    def step(self, action):
        if action == "sleep":
            time.sleep(60)
        elif action == "spin":
            while True:
                pass
        elif action == "catch-exception":
            try:
                time.sleep(60)
            except Exception:  # an env's own handler: must not swallow the deadline
                return "caught", 0.0, True, False, {}
        elif action == "asyncio":
            return asyncio.run(self._answer()), 1.0, True, False, {"thread": threading.current_thread().name}
        elif action.startswith("wait"):
            time.sleep(float(action[4:]))
        return "done", 1.0, True, False, {"thread": threading.current_thread().name}

    async def _answer(self):
        await asyncio.sleep(0)
        return "from asyncio.run"

    def close(self):
        pass


class KillableEnv(ThreadEnv):
    def kill(self):
        KillableEnv.killed += 1


def host_of(env_class=ThreadEnv, **kwargs) -> EnvHost:
    return EnvHost("thread-env", factory=lambda *a, **k: env_class(), **kwargs)


def threads_of(results) -> list[str]:
    return [r.value[4]["thread"] for r in results]


def play(host: EnvHost, keys, action="x") -> list:
    assert all(r.ok for r in host.handle_batch([("reset", k, 0, None) for k in keys]))
    return host.handle_batch([("step", k, action) for k in keys])


def test_quick_batches_run_on_the_main_thread_after_the_first():
    host = host_of(call_timeout_s=5.0)
    first = host.handle_batch([("reset", k, 0, None) for k in range(4)])
    assert all(r.value[1]["thread"] != "MainThread" for r in first)  # nothing known of the env yet: a worker
    assert threads_of(host.handle_batch([("step", k, "x") for k in range(4)])) == ["MainThread"] * 4
    host.handle_batch([("close", k) for k in range(4)])
    assert threads_of(play(host, range(4))) == ["MainThread"] * 4
    assert host.counts() == {"started": 8, "finished": 4, "failed": 0, "open": 4}


def test_off_switch_and_other_threads_keep_worker_threads():
    host = host_of(call_timeout_s=5.0, inline_quick_calls=False)
    for _ in range(3):
        assert "MainThread" not in threads_of(play(host, range(3)))
        host.handle_batch([("close", k) for k in range(3)])
    host = host_of(call_timeout_s=5.0)
    seen = []
    worker = threading.Thread(target=lambda: [seen.extend(threads_of(play(host, [k]))) for k in range(3)])
    worker.start()
    worker.join()
    assert len(seen) == 3 and "MainThread" not in seen and worker.name not in seen


@pytest.mark.parametrize("action", ["sleep", "spin", "catch-exception"])
def test_a_hung_call_ends_at_the_deadline_and_the_rest_of_its_batch_in_threads(action):
    host = host_of(call_timeout_s=0.5)
    play(host, range(4))  # quick: the next batch runs here
    assert all(r.ok for r in host.handle_batch([("reset", k, 0, None) for k in range(10, 14)]))
    started = time.monotonic()
    results = host.handle_batch([("step", 10, action), *[("step", k, "wait0.05") for k in range(11, 14)]])
    took = time.monotonic() - started
    assert 0.5 <= took < 1.0  # the others ran beside the hung one, handed to threads at 10 ms
    assert not results[0].ok and "timed out after 0.5s" in results[0].error
    assert [r.ok for r in results[1:]] == [True] * 3 and "MainThread" not in threads_of(results[1:])
    assert host.counts()["failed"] == 1 and 10 not in host.envs  # its instance is dropped, not reused
    resets = host.handle_batch([("reset", k, 0, None) for k in (20, 21)])
    assert "MainThread" not in [r.value[1]["thread"] for r in resets]  # after a slow batch: worker threads
    steps = host.handle_batch([("step", k, "x") for k in (20, 21)])
    assert threads_of(steps) == ["MainThread"] * 2  # quick again: back on this thread


def test_a_slow_batch_of_one_call_sends_the_env_back_to_worker_threads():
    host = host_of(call_timeout_s=5.0)
    play(host, [0])
    host.handle_batch([("reset", 1, 0, None)])
    (slow,) = host.handle_batch([("step", 1, "wait0.03")])  # nothing left to hand over, but slow
    assert slow.ok and threads_of([slow]) == ["MainThread"]
    (reset,) = host.handle_batch([("reset", 2, 0, None)])
    assert reset.value[1]["thread"] != "MainThread"


def test_a_timed_out_killable_env_is_killed():
    host = host_of(KillableEnv, call_timeout_s=0.3)
    play(host, [0])
    assert all(r.ok for r in host.handle_batch([("reset", 1, 0, None)]))
    before = KillableEnv.killed
    (result,) = host.handle_batch([("step", 1, "sleep")])
    assert not result.ok and KillableEnv.killed > before


def test_env_code_may_call_asyncio_run_inside_the_rollout_loop():
    host = host_of(call_timeout_s=5.0)
    client = LocalEnvClient(host)

    async def episode(key):
        await client.call("reset", key, 0, None)
        return await client.call("step", key, "asyncio")

    async def two_rounds():
        first = await asyncio.gather(*(episode(k) for k in range(3)))
        return first + list(await asyncio.gather(*(episode(k) for k in range(3, 6))))

    results = asyncio.run(two_rounds())
    assert all(r.ok and r.value[0] == "from asyncio.run" for r in results)
    assert "MainThread" in threads_of(results)  # some ran on the loop's own thread


def test_a_forked_child_makes_its_own_timer():
    parent = MainThreadTimer.get()
    child = os.fork()
    if child == 0:  # POSIX timers are not inherited: the child's deadline needs a timer of its own
        code = 1
        try:
            host = host_of(call_timeout_s=0.3)
            play(host, [0])
            host.handle_batch([("reset", 1, 0, None)])
            (result,) = host.handle_batch([("step", 1, "spin")])
            code = 0 if MainThreadTimer.get() is not parent and "timed out" in result.error else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


STUCK = textwrap.dedent(
    """
    import time
    import agentrl.env.host as host_module
    from agentrl.env.host import EnvHost

    class Stubborn:
        reusable = True
        def reset(self, *, seed=None, options=None):
            return "go", {}
        def step(self, action):
            while True:
                try:
                    time.sleep(60)
                except BaseException:
                    pass
        def close(self):
            pass

    host_module.STUCK_GRACE_S = 1.0
    host = EnvHost("stubborn", factory=lambda *a, **k: Stubborn(), call_timeout_s=0.5)
    host.handle_batch([("reset", 0, 0, None)])
    host.handle_batch([("step", 0, "x")])
    print("not reached")
    """
)


def test_a_call_that_will_not_stop_ends_the_process_with_its_stack():
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "not reached" not in done.stdout
    assert "did not stop when interrupted" in done.stderr and "env_quick_calls_inline=false" in done.stderr
    assert "in step" in done.stderr  # the stuck call's stack
    assert time.monotonic() - started < 30
