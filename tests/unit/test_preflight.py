"""The env check before training: each way an env can be broken gives one message naming the field and the fix."""

import pytest

from agentrl.env import TextEnv
from agentrl.run.preflight import EnvUnusable, check_env_config


def refusal(env_id: str, kwargs: dict | None = None) -> str:
    with pytest.raises(EnvUnusable) as caught:
        check_env_config(env_id, kwargs or {})
    return str(caught.value)


def test_working_envs_pass():
    check_env_config("guess_number", {"high": 7})
    check_env_config("toy_text", {"game": "FrozenLake-v1"})
    check_env_config("tests.fault_envs:FaultyEnv", {"fault": "raise", "every": 1})  # fails on step, not on reset


def test_unknown_id_names_env_id_and_the_known_ids():
    message = refusal("nope")
    assert message.startswith("env.id='nope' names no environment: unknown env id 'nope'")
    assert "guess_number" in message and "Fix env.id" in message
    assert "did you mean 'guess_number'" in refusal("guess_numbr")


def test_a_module_path_that_does_not_import_or_has_no_such_class():
    assert "cannot import module 'some.module'" in refusal("some.module:Missing")
    message = refusal("envs.guess_number:GuessNumber")
    assert "has no attribute 'GuessNumber' (did you mean 'GuessNumberEnv'?)" in message
    assert message.startswith("env.id='envs.guess_number:GuessNumber'")


def test_a_keyword_the_constructor_does_not_take_names_env_kwargs():
    message = refusal("guess_number", {"high": 7, "nonsense": 1})
    assert message.startswith("env.kwargs={'high': 7, 'nonsense': 1} do not fit env.id='guess_number'")
    assert "unexpected keyword argument 'nonsense'" in message and "It takes: low, high," in message
    assert "(did you mean 'max_guesses'?)" in refusal("guess_number", {"max_guess": 3})


def test_a_constructor_that_raises_shows_where():
    message = refusal("tests.fault_envs:FaultyEnv", {"fault": "explode"})
    assert message.startswith("env.id='tests.fault_envs:FaultyEnv' with env.kwargs={'fault': 'explode'} cannot be")
    assert "ValueError: fault must be 'raise', 'hang' or 'exit'" in message
    assert "tests/fault_envs.py" in message and "preflight.py" not in message


def test_a_plain_gymnasium_env_is_pointed_to_toy_text():
    message = refusal("gymnasium.envs.toy_text.frozen_lake:FrozenLakeEnv")
    assert "is not a text env (observation_space Discrete(16), action_space Discrete(4))" in message
    assert "env.id=toy_text env.kwargs.game=FrozenLake-v1" in message


class ResetRaises(TextEnv):
    def reset(self, *, seed=None, options=None):
        raise OSError("tasks.jsonl not found")

    def step(self, action):
        raise AssertionError("never reached")


class ResetReturnsObservationOnly(TextEnv):
    def reset(self, *, seed=None, options=None):
        return "Guess."

    def step(self, action):
        raise AssertionError("never reached")


def test_reset_must_work_and_return_text_and_info():
    message = refusal("tests.unit.test_preflight:ResetRaises")
    assert "reset(seed=0) raised OSError: tasks.jsonl not found" in message
    assert "reset() must return (observation: str, info: dict), got 'Guess.'" in refusal(
        "tests.unit.test_preflight:ResetReturnsObservationOnly"
    )
