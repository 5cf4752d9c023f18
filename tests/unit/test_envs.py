import math

import pytest

from agentrl.cli import main
from agentrl.env import TextEnv, make, register, registered_ids
from agentrl.env.check import check_env, inspect_env
from agentrl.env.host import EnvHost
from envs.guess_number.env import GuessNumberEnv, parse_guess


def test_parse_guess_takes_the_first_integer():
    assert parse_guess("I say 7, maybe 8") == 7
    assert parse_guess("10") == 10
    assert parse_guess("no idea") is None


def test_binary_search_always_wins_and_feedback_narrows_the_range():
    for seed in range(30):
        env = GuessNumberEnv(low=1, high=10, max_guesses=4)
        obs, info = env.reset(seed=seed)
        lo, hi = 1, 10
        for _ in range(4):
            guess = (lo + hi) // 2
            obs, reward, terminated, _truncated, info = env.step(f"{guess}")
            if info["success"]:
                break
            lo, hi = env.possible
            assert f"between {lo} and {hi}" in obs
        assert info["success"] and reward == 1.0 and terminated


def test_out_of_guesses_terminates_without_reward():
    env = GuessNumberEnv(low=1, high=10, max_guesses=2, valid_reward=0.1)
    _, info = env.reset(seed=0)
    wrong = 1 if info["secret"] != 1 else 2
    _, reward, terminated, _, _ = env.step(str(wrong))
    assert reward == pytest.approx(0.1) and not terminated
    _, reward, terminated, _, info = env.step("no number")
    assert reward == 0.0 and terminated and not info["success"]


def test_progress_reward_pays_the_share_of_the_range_a_guess_rules_out():
    env = GuessNumberEnv(low=1, high=7, max_guesses=3, progress_reward=0.2)
    env.reset(seed=0)
    env.secret = 7
    assert env.step("4")[1] == pytest.approx(0.2 * 4 / 7)  # 1..4 ruled out of 1..7
    assert env.step("5")[1] == pytest.approx(0.2 * 1 / 3)  # an end of 5..7 rules out one of three
    assert env.step("7")[1] == 1.0
    env.reset(seed=0)
    env.secret = 7
    env.step("4")
    assert env.step("6")[1] == pytest.approx(0.2 * 2 / 3)  # the middle rules out two of three


def play(env, secret: int, guesses: list[str]) -> tuple[list[float], bool]:
    env.reset(seed=0)
    env.secret = secret
    rewards = []
    for guess in guesses:
        _, reward, terminated, _, info = env.step(guess)
        rewards.append(reward)
        if terminated:
            return rewards, info["success"]
    return rewards, False


def test_information_reward_pays_each_guess_its_bits_and_every_win_the_same():
    env = GuessNumberEnv(low=1, high=7, max_guesses=3, information_reward=0.5)
    rewards, won = play(env, 7, ["4", "6", "7"])  # 7 -> 3 -> 1 possible numbers, then found
    assert won
    assert rewards == pytest.approx([0.5 * math.log(7 / 3) / math.log(7), 0.5 * math.log(3) / math.log(7), 1.0])
    for secret, guesses in [(4, ["4"]), (6, ["4", "6"]), (1, ["3", "1"]), (5, ["1", "2", "5"]), (7, ["5", "6", "7"])]:
        rewards, won = play(env, secret, guesses)
        assert won and sum(rewards) == pytest.approx(1.5), (secret, guesses)  # a win in 1, 2 or 3 guesses alike
    rewards, won = play(env, 7, ["3", "5", "6"])  # 7 -> 4 -> 2 -> 1 possible: all the bits, but no win
    assert not won and sum(rewards) == pytest.approx(0.5)
    rewards, won = play(env, 7, ["1", "2", "3"])  # 7 -> 6 -> 5 -> 4: a blind loss learns less
    assert not won and sum(rewards) == pytest.approx(0.5 * math.log(7 / 4) / math.log(7))
    assert play(env, 7, ["x", "4", "6"])[0][0] == 0.0  # no number, no bits


def test_the_range_is_the_last_thing_before_every_guess():
    env = GuessNumberEnv(low=1, high=7, max_guesses=3)
    prompt, _ = env.reset(seed=0)
    env.secret = 6
    assert prompt.endswith("between 1 and 7")
    assert env.step("4")[0] == "higher, between 5 and 7"
    assert env.step("7")[0] == "lower, between 5 and 6"


def test_shift_moves_each_games_range_and_binary_search_still_wins():
    ranges = set()
    for seed in range(40):
        env = GuessNumberEnv(low=1, high=7, max_guesses=3, shift=2)
        prompt, info = env.reset(seed=seed)
        lo, hi = env.possible
        ranges.add((lo, hi))
        assert prompt.endswith(f"between {lo} and {hi}") and lo <= info["secret"] <= hi and hi - lo == 6
        for _ in range(3):
            info = env.step(str((lo + hi) // 2))[4]
            if info["success"]:
                break
            lo, hi = env.possible
        assert info["success"]
    assert ranges == {(1, 7), (2, 8), (3, 9)}
    with pytest.raises(ValueError, match="shift >= 0"):
        GuessNumberEnv(shift=-1)


def test_name_the_last_says_the_one_number_left_and_nothing_else_changes():
    named, plain = GuessNumberEnv(1, 7, 3, name_the_last=True), GuessNumberEnv(1, 7, 3)
    for env in (named, plain):
        env.reset(seed=0)
        env.secret = 5
    assert named.step("4")[0] == plain.step("4")[0] == "higher, between 5 and 7"
    assert named.step("6")[0] == "lower, it is 5"
    assert plain.step("6")[0] == "lower, between 5 and 5"


def test_seeding_is_reproducible():
    assert GuessNumberEnv().reset(seed=5) == GuessNumberEnv().reset(seed=5)


def test_registry_by_id_path_and_registration():
    assert "guess_number" in registered_ids()
    assert isinstance(make("guess_number", high=20), GuessNumberEnv)
    assert isinstance(make("envs.guess_number:GuessNumberEnv"), GuessNumberEnv)
    register("my-guess", GuessNumberEnv)
    assert isinstance(make("my-guess"), GuessNumberEnv)


def test_unknown_id_lists_known_ids():
    with pytest.raises(KeyError, match=r"unknown env id 'nope'; known: .*guess_number"):
        make("nope")


def test_unknown_names_suggest_the_closest_known_one():
    with pytest.raises(KeyError, match=r"unknown env id 'gues_number' \(did you mean 'guess_number'\?\)"):
        make("gues_number")
    with pytest.raises(AttributeError, match=r"no attribute 'GuessNumberEnvv' \(did you mean 'GuessNumberEnv'\?\)"):
        make("envs.guess_number:GuessNumberEnvv")


def test_a_gymnasium_id_points_to_the_toy_text_adapter():
    with pytest.raises(KeyError, match=r"Gymnasium id.*env.id=toy_text env.kwargs.game=FrozenLake-v1"):
        make("FrozenLake-v1")
    with pytest.raises(KeyError, match=r"Gymnasium id.*toy_text adapter cannot draw its state"):
        make("CartPole-v1")


def test_check_env_passes_guess_number_and_flags_a_broken_env():
    assert check_env("guess_number", {}) == []

    class Broken(GuessNumberEnv):
        def step(self, action):
            return 42, 0.0, False, False, {}

    register("broken-test", Broken)
    problems = check_env("broken-test", {})
    assert any("observation must be str" in p for p in problems)


def test_host_contains_exceptions_and_counts_them():
    host = EnvHost("guess_number", {})
    assert host.handle("step", "never-reset", "5").ok is False
    assert host.failures == 1
    assert host.handle("reset", "a", 0, None).ok
    assert host.handle("step", "a", "5").ok


class CharsetSpace(GuessNumberEnv):
    """Declares gymnasium's default Text space, which holds letters and digits only."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        import gymnasium as gym

        self.observation_space = gym.spaces.Text(max_length=100)


class NoSpaces(GuessNumberEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.action_space = None


def test_check_env_checks_spaces_and_that_observations_fit_them():
    problems = check_env("tests.unit.test_envs:CharsetSpace", {})
    assert any("is not in env.observation_space" in p and "FreeText" in p for p in problems)
    problems = check_env("tests.unit.test_envs:NoSpaces", {})
    assert any("env.action_space must be a gymnasium space" in p for p in problems)
    env = GuessNumberEnv()
    assert env.observation_space.contains(env.reset(seed=0)[0]) and isinstance(env.action_space.sample(), str)


class NoSuccess(TextEnv):
    """Follows the API but never puts 'success' in info."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.over = False
        return "Say cat.", {}

    def step(self, action):
        if self.over:
            raise RuntimeError("episode is over; call reset()")
        self.over = True
        return "done", float("cat" in action), True, False, {}


def test_check_env_warns_when_success_is_never_reported(capsys):
    report = inspect_env("tests.unit.test_envs:NoSuccess", {})
    assert report.problems == []
    assert len(report.warnings) == 1 and "success_rate will read 0" in report.warnings[0]
    assert inspect_env("guess_number", {}).warnings == []
    assert main(["check-env", "tests.unit.test_envs:NoSuccess"]) == 0  # a warning, not a failure
    out = capsys.readouterr().out
    assert "WARN no step() info" in out and out.rstrip().endswith("ok")


def test_check_env_points_a_plain_gymnasium_env_to_toy_text(capsys):
    report = inspect_env("gymnasium.envs.toy_text.frozen_lake:FrozenLakeEnv", {})
    assert any("must be a text space" in problem for problem in report.problems)
    assert [w for w in report.warnings if "env.id=toy_text env.kwargs.game=FrozenLake-v1" in w]
    report = inspect_env("gymnasium.envs.classic_control.cartpole:CartPoleEnv", {})
    assert [w for w in report.warnings if "wrap the game in an agentrl.env.TextEnv" in w]
    assert main(["check-env", "gymnasium.envs.toy_text.blackjack:BlackjackEnv"]) == 1
    out = capsys.readouterr().out
    assert "WARN" in out and "env.kwargs.game=Blackjack-v1" in out


def test_check_env_closes_every_env_it_opens():
    from agentrl.env.check import check_env
    from tests.fault_envs import SessionCountingEnv

    assert check_env("tests.fault_envs:SessionCountingEnv", {}) == []
    assert SessionCountingEnv.open_sessions == 0  # an openenv:http server would otherwise keep two sessions a check
