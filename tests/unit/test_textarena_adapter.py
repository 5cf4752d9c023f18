"""`env.id: textarena:GAME`: TextArena's own games through the adapter (the real package), and games that misbehave."""

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

ta = pytest.importorskip("textarena", reason="pip install 'agentrl[textarena]' (in the dev extra)")

from agentrl.env import make  # noqa: E402
from agentrl.env.check import check_env  # noqa: E402
from agentrl.env.host import EnvHost  # noqa: E402
from tests.unit.ecosystem_runs import (  # noqa: E402
    EVAL_AT_THE_END,
    assert_clean_steps,
    assert_evaluated,
    train,
    write_config,
)

REPO = Path(__file__).resolve().parents[2]


def always_rock(observation: str) -> str:
    """An opponent for the other seat of a two-player game."""
    assert isinstance(observation, str)
    return "[rock]"


@pytest.mark.parametrize(
    ("game", "kwargs"),
    [
        ("GuessTheNumber-v0", {}),
        ("Mastermind-v0", {}),
        ("TowerOfHanoi-v0", {}),
        ("IteratedRockPaperScissors-v0", {"players": 2, "opponent": f"{__name__}:always_rock", "num_rounds": 3}),
    ],
)
def test_check_env_passes_on_the_packages_games(game, kwargs):
    assert check_env(f"textarena:{game}", kwargs) == []


def play_guess_the_number(env) -> tuple[float, dict, int]:
    """Binary search on the game's own "higher"/"lower" messages: (reward, last info, guesses)."""
    low, high, guesses = 1, 20, 0
    while True:
        guess = (low + high) // 2
        observation, reward, terminated, truncated, info = env.step(f"I guess [{guess}]")
        guesses += 1
        if terminated or truncated:
            return reward, info, guesses
        if "higher" in observation:
            low = guess + 1
        else:
            assert "lower" in observation, observation
            high = guess - 1


def test_the_games_reward_ends_the_episode_and_a_win_is_success():
    env = make("textarena:GuessTheNumber-v0")
    observation, info = env.reset(seed=7)
    assert "Guess The Number" in observation and info["player_id"] == 0
    reward, info, guesses = play_guess_the_number(env)
    assert (reward, info["success"]) == (1.0, True) and guesses <= 5
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("[3]")


def test_a_lost_game_keeps_textarenas_partial_reward_and_is_no_success():
    env = make("textarena:GuessTheNumber-v0", max_turns=1)  # TextArena's limit lets max_turns + 1 guesses through
    env.reset(seed=7)
    secret = env.game.game_number
    wrong = [guess for guess in (1, 20, 2) if guess != secret][:2]
    _, reward, terminated, _, _ = env.step(f"[{wrong[0]}]")
    assert not terminated and reward == 0.0
    observation, reward, terminated, _, info = env.step(f"[{wrong[1]}]")
    assert terminated and info["success"] is False
    assert reward == pytest.approx(1 - abs(wrong[1] - secret) / 19)
    assert "turn limit" in observation  # the game's reason ends the last observation


def test_bracket_actions_sends_a_bare_move_in_brackets():
    env = make("textarena:GuessTheNumber-v0", bracket_actions=True)
    env.reset(seed=1)
    observation, *_ = env.step("10")
    assert "higher" in observation or "lower" in observation or env.done
    plain = make("textarena:GuessTheNumber-v0")
    plain.reset(seed=1)
    observation, *_ = plain.step("10")
    assert "invalid move" in observation.lower()


def test_one_seed_plays_one_game_even_when_calls_of_other_games_interleave():
    first, other, second = (make("textarena:ThreeCardMonte-v0") for _ in range(3))
    outside = random.getstate()
    first.reset(seed=5)
    other.reset(seed=6)
    second.reset(seed=5)
    assert first.game.ball_pos == second.game.ball_pos
    mastermind = [make("textarena:Mastermind-v0") for _ in range(2)]
    mastermind[0].reset(seed=3)
    make("textarena:Mastermind-v0").reset(seed=4)
    mastermind[1].reset(seed=3)
    assert mastermind[0].game.state.game_state["secret_code"] == mastermind[1].game.state.game_state["secret_code"]
    assert random.getstate() == outside  # the adapter leaves the process's own random state alone


def test_a_two_player_game_maps_the_policy_to_player_id_and_the_opponent_to_the_other_seat():
    env = make("textarena:IteratedRockPaperScissors-v0", players=2, opponent=f"{__name__}:always_rock", num_rounds=3)
    observation, info = env.reset(seed=0)
    assert "Player 0" in observation and info["player_id"] == 0
    for _ in range(2):
        observation, reward, terminated, _, info = env.step("[paper]")
        assert not terminated and reward == 0.0
    observation, reward, terminated, _, info = env.step("[paper]")
    assert terminated and reward == 1.0 and info["success"] is True
    second_seat = make(
        "textarena:IteratedRockPaperScissors-v0", players=2, player_id=1, opponent=f"{__name__}:always_rock"
    )
    observation, info = second_seat.reset(seed=0)
    assert "Player 1" in observation and info["player_id"] == 1
    with pytest.raises(ValueError, match=r"set env\.kwargs\.opponent"):
        make("textarena:IteratedRockPaperScissors-v0", players=2)
    with pytest.raises(ValueError, match="does not play with players=1"):
        make("textarena:IteratedRockPaperScissors-v0").reset(seed=0)


def test_unknown_games_and_kwargs_are_named():
    with pytest.raises(ValueError, match=r"no game 'GuessTheNumbr-v0'.*did you mean 'GuessTheNumber-v0'"):
        make("textarena:GuessTheNumbr-v0")
    with pytest.raises(ValueError, match=r"rejects env.kwargs .*max_number_of_turns"):
        make("textarena:GuessTheNumber-v0", max_number_of_turns=3)


def test_without_the_package_the_error_names_the_extra():
    code = "import sys; sys.modules['textarena'] = None\nfrom agentrl.env import make\nmake('textarena:Wordle-v0')\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 1
    assert "ImportError: env ids 'textarena:GAME' need the textarena package: pip install 'agentrl[textarena]'" in (
        result.stderr
    )


class FaultyGuess(ta.Env):
    """A single-player TextArena game that misbehaves on purpose: `fault` on the first move."""

    def __init__(self, fault: str = "raise"):
        self.fault = fault

    def reset(self, num_players: int, seed=None):
        state_class = ta.SinglePlayerState if num_players == 1 else ta.TwoPlayerState
        self.state = state_class(num_players=num_players, seed=seed)
        self.state.reset(game_state={}, player_prompt_function=lambda player_id, game_state: "Say a number.")

    def step(self, action: str):
        if self.fault == "raise":
            raise ValueError("injected game fault")
        if self.fault == "malformed":
            self.state.observations[0].append((-1, {"not": "text"}, ta.ObservationType.GAME_MESSAGE))
            return self.state.step()
        if self.fault == "seat":  # hands the turn to a seat that is not there and never back
            self.state.current_player_id = 1
            return False, {}
        raise AssertionError(self.fault)


if "AgentrlFaultyGuess-v0" not in ta.envs.registration.ENV_REGISTRY:
    ta.register("AgentrlFaultyGuess-v0", entry_point=FaultyGuess)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("raise", "ValueError: injected game fault"),
        ("malformed", "a message to seat 0 is not \\(sender, text: str, type\\)"),
        ("seat", "the opponents made 5 moves in a row without the game returning to seat 0"),
    ],
)
def test_a_game_that_raises_sends_malformed_messages_or_never_hands_back_fails_its_episode_with_the_reason(
    fault, reason
):
    kwargs = {"fault": fault, "players": 2, "opponent": f"{__name__}:always_rock", "opponent_moves": 5}
    host = EnvHost("textarena:AgentrlFaultyGuess-v0", kwargs, call_timeout_s=30)
    assert all(result.ok for result in host.handle_batch([("reset", key, key, None) for key in (1, 2)]))
    failed = host.handle("step", 1, "[3]")
    assert not failed.ok
    assert "textarena:AgentrlFaultyGuess-v0 step failed" in failed.error
    assert re.search(reason, failed.error), failed.error
    assert host.counts() == {"started": 2, "finished": 0, "failed": 1, "open": 1}  # counted; the other goes on
    assert host.handle("reset", 3, 3, None).ok


@pytest.mark.parametrize(
    ("game", "move", "reason"),
    [
        (
            "ThreeCardMonte-v0",
            "cup 1",
            "ended with a reward for seat 0 that is no number: 'Bad action. Use `\\[k\\]`.'",
        ),
        ("Countdown-v0", "[1 + 2]", "a message to seat 0 is not \\(sender, text: str, type\\)"),
    ],
)
def test_textarenas_own_games_that_break_their_api_fail_the_episode_with_the_reason(game, move, reason):
    host = EnvHost(f"textarena:{game}", {}, call_timeout_s=30)
    assert host.handle("reset", 1, 1, None).ok
    failed = host.handle("step", 1, move)
    if failed.ok:  # ThreeCardMonte: only the second bad move ends the game
        failed = host.handle("step", 1, move)
    assert not failed.ok
    assert re.search(reason, failed.error), failed.error
    assert host.counts()["failed"] == 1


@pytest.mark.timeout(600)  # a real run: the package's import and a model's build
def test_agentrl_train_runs_two_steps_on_a_game_and_evaluates_the_trained_model(tmp_path):
    """Mastermind in one process (GuessTheNumber trains on an env rank: tests/mpi/test_ecosystem_envs_mpi.py); the
    run's evaluation at its end plays 4 games of the evaluation seeds."""
    kwargs = {"code_length": 2, "num_numbers": 4, "max_turns": 4}
    logged = train(
        write_config(tmp_path, "textarena:Mastermind-v0", kwargs, **{"rollout.max_turns": 4}, **EVAL_AT_THE_END)
    )
    assert_clean_steps(logged, steps=2, episodes=8)
    assert all(0.0 <= value <= 1.0 for _, value in logged["episode/reward_mean"])
    assert_evaluated(logged, step=2, episodes=4)


@pytest.mark.parametrize("invalid_move_reward", [None, 0.0])
def test_invalid_move_reward_replaces_the_partial_credit_of_a_game_lost_on_invalid_moves(invalid_move_reward):
    env = make("textarena:GuessTheNumber-v0", invalid_move_reward=invalid_move_reward)
    env.reset(seed=7)
    guess = 3 if env.game.game_number != 3 else 4
    outcomes = [env.step(f"[{guess}]") for _ in range(3)]  # a guess, then the same guess twice: invalid moves
    assert [terminated for _, _, terminated, _, _ in outcomes] == [False, False, True]
    _, reward, _, _, info = outcomes[-1]
    partial = 1 - abs(guess - env.game.game_number) / 19
    assert reward == pytest.approx(partial if invalid_move_reward is None else 0.0)
    assert info["metrics"]["invalid_move"] == 1.0 and info["success"] is False
