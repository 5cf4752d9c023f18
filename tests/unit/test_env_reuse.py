"""The env host keeps closed instances of reusable env classes for later episodes, and runs a batch in one thread."""

import threading
import time

import gymnasium as gym
import pytest

from agentrl.env.check import check_env
from agentrl.env.host import EnvHost, reusable
from envs.guess_number.env import GuessNumberEnv
from envs.qa.env import QAEnv
from tests.fault_envs import FaultyEnv


class CountingGuess(GuessNumberEnv):
    """guess_number that counts its instances, closes and the threads its calls ran on."""

    reusable = True
    made = 0
    closed = 0
    threads: set[int] = set()  # noqa: RUF012 (one test's record, reset by it)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        type(self).made += 1

    def reset(self, *, seed=None, options=None):
        type(self).threads.add(threading.get_ident())
        return super().reset(seed=seed, options=options)

    def step(self, action):
        type(self).threads.add(threading.get_ident())
        if action == "boom":
            raise RuntimeError("boom")
        return super().step(action)

    def close(self):
        type(self).closed += 1


class NotSaidAgain(CountingGuess):
    """A subclass that does not say reusable itself: its instances are never kept."""


class LeakyGuess(GuessNumberEnv):
    """Says reusable, but its reset keeps the last game's guesses (so the prompt shows how many were used)."""

    reusable = True

    def reset(self, *, seed=None, options=None):
        used = self.guesses
        prompt, info = super().reset(seed=seed, options=options)
        self.guesses = used
        return f"{prompt} ({used} used)", info


def play(host: EnvHost, keys: list, seeds: list[int]) -> list[tuple]:
    resets = host.handle_batch([("reset", k, s, None) for k, s in zip(keys, seeds, strict=True)])
    steps = host.handle_batch([("step", k, "4") for k in keys])
    host.handle_batch([("close", k) for k in keys])
    return [(r.value[0], r.value[1]["secret"], s.value[:4]) for r, s in zip(resets, steps, strict=True)]


def fresh_counts(cls) -> None:
    cls.made = cls.closed = 0
    cls.threads = set()


def test_reusable_instances_play_later_episodes_as_new_ones_would():
    fresh_counts(CountingGuess)
    host = EnvHost("counting", factory=lambda _id: CountingGuess())
    first = play(host, ["a", "b", "c"], [0, 1, 2])
    assert CountingGuess.made == 3 and CountingGuess.closed == 0 and len(host.idle) == 3
    kept = {id(env) for env in host.idle}
    later = play(host, ["d", "e", "f", "g"], [2, 1, 0, 5])  # three kept instances and one new
    assert CountingGuess.made == 4 and len(host.idle) == 4 and kept < {id(env) for env in host.idle}
    new = EnvHost("counting", factory=lambda _id: CountingGuess(), reuse=False)
    assert later == play(new, ["d", "e", "f", "g"], [2, 1, 0, 5])  # what new instances give, seed for seed
    assert later[:3] == first[::-1]
    assert new.idle == [] and CountingGuess.closed == 4  # reuse off: closed as before
    assert host.counts() == {"started": 7, "finished": 7, "failed": 0, "open": 0}
    host.close_idle()
    assert CountingGuess.closed == 8 and host.idle == []


def test_an_instance_whose_call_failed_is_not_kept_and_subclasses_must_say_reusable_themselves():
    fresh_counts(CountingGuess)
    host = EnvHost("counting", factory=lambda _id: CountingGuess())
    host.handle_batch([("reset", k, k, None) for k in range(3)])
    results = host.handle_batch([("step", 0, "boom"), ("step", 1, "4"), ("step", 2, "4")])
    assert [r.ok for r in results] == [False, True, True] and "boom" in results[0].error
    host.handle_batch([("close", k) for k in range(3)])
    assert len(host.idle) == 2 and host.counts() == {"started": 3, "finished": 2, "failed": 1, "open": 0}
    assert reusable(CountingGuess()) and not reusable(NotSaidAgain()) and not reusable(FaultyEnv())
    other = EnvHost("not-said", factory=lambda _id: NotSaidAgain())
    play(other, [0, 1], [0, 1])
    assert other.idle == []


def test_a_batch_of_quick_calls_runs_in_one_thread_and_a_slow_call_spills_the_rest():
    fresh_counts(CountingGuess)
    # in worker threads only (quick batches otherwise move to this thread: test_env_inline_calls.py)
    host = EnvHost("counting", factory=lambda _id: CountingGuess(), call_timeout_s=5.0, inline_quick_calls=False)
    play(host, list(range(16)), list(range(16)))
    assert len(CountingGuess.threads) == 1 and threading.get_ident() not in CountingGuess.threads
    # a hanging first call: the other calls start on threads of their own and the batch ends at the deadline
    hung = EnvHost("tests.fault_envs:FaultyEnv", {"fault": "hang", "every": 100}, call_timeout_s=1.0)
    assert all(r.ok for r in hung.handle_batch([("reset", s, s, None) for s in range(5)]))
    started = time.monotonic()
    results = hung.handle_batch([("step", s, "5") for s in range(5)])
    assert time.monotonic() - started < 1.8
    assert [r.ok for r in results] == [False, True, True, True, True] and "timed out" in results[0].error


class SleepyStep:
    """An I/O-bound env: each step waits 4 ms without holding the interpreter."""

    def reset(self, seed=None, options=None):
        return "obs", {}

    def step(self, action):
        time.sleep(0.004)
        return "obs", 0.0, False, False, {}

    def close(self):
        pass


def test_many_quick_io_bound_calls_spill_to_threads_instead_of_adding_up_to_the_deadline():
    host = EnvHost("sleepy", factory=lambda _id: SleepyStep(), call_timeout_s=0.3)
    keys = list(range(100))
    assert all(r.ok for r in host.handle_batch([("reset", k, k, None) for k in keys]))
    started = time.monotonic()
    results = host.handle_batch([("step", k, "a") for k in keys])  # 100 x 4 ms in order would pass 0.3 s
    assert [r.error for r in results if not r.ok] == []
    assert time.monotonic() - started < 0.3


def test_check_env_passes_the_reusable_envs_and_flags_a_reset_that_leaves_state():
    assert check_env("guess_number", {}) == []
    assert check_env("nim", {}) == []
    assert check_env("calculator", {}) == []
    problems = check_env("tests.unit.test_env_reuse:LeakyGuess", {})
    assert len(problems) == 1 and "says reusable = True" in problems[0] and "reset" in problems[0]


class EagerGymnasium(gym.Env):
    """Gymnasium's own seeding, for comparison."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "", {}


def test_a_seeded_reset_builds_gymnasiums_generator_when_first_used():
    lazy, eager = GuessNumberEnv(low=1, high=10**6), EagerGymnasium()
    for seed in (0, 5, 2**40):
        _, info = lazy.reset(seed=seed)
        eager.reset(seed=seed)
        assert info["secret"] == int(eager.np_random.integers(1, 10**6 + 1))  # the draw gymnasium gives
        assert lazy.np_random.random() == eager.np_random.random() and lazy.np_random_seed == seed
    qa = QAEnv()
    qa.reset(seed=3, options={"prompt": "2 + 2?", "answer": "4"})
    assert qa._np_random is None and qa.np_random_seed == 3  # built only when asked for
    with pytest.raises(gym.error.Error, match="greater or equal to zero"):
        qa.reset(seed=-1, options={"prompt": "2 + 2?", "answer": "4"})


def test_no_env_timeout_runs_env_code_on_the_calling_thread():
    from agentrl.config.load import from_dict
    from agentrl.roles.env import env_host

    model = {"path": "unused-here"}
    config = from_dict({"model": model, "runtime": {"env_step_timeout_s": None}})
    assert env_host(config, check=False).call_timeout_s is None
    fresh_counts(CountingGuess)
    host = EnvHost("counting", factory=lambda _id: CountingGuess(), call_timeout_s=None)
    play(host, [0, 1, 2], [0, 1, 2])
    assert CountingGuess.threads == {threading.get_ident()} and len(host.idle) == 3
    with pytest.raises(ValueError, match="env_step_timeout_s"):
        from_dict({"model": model, "runtime": {"env_step_timeout_s": 0}})


def test_kept_instances_are_closed_at_shutdown_and_check_env_closes_the_one_it_replays_on():
    from agentrl.env.client import LocalEnvClient
    from tests.fault_envs import ReusableSessionEnv

    fresh_counts(CountingGuess)
    client = LocalEnvClient(EnvHost("counting", factory=lambda _id: CountingGuess()))
    play(client.host, [0, 1], [0, 1])
    client.host.handle("reset", 2, 2, None)  # an episode still open at the end
    client.shutdown()
    assert CountingGuess.closed == CountingGuess.made == 2  # every instance closed once, the open one too
    assert client.host.idle == [] and client.host.counts()["open"] == 0
    assert check_env("tests.fault_envs:ReusableSessionEnv", {}) == []
    assert ReusableSessionEnv.open_sessions == 0
