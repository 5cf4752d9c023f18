"""`env.id: textarena:GAME`: a TextArena game (GuessTheNumber-v0, Wordle-v0, TicTacToe-v0, ...) as an agentrl env.

The policy plays seat `player_id` of a `players`-seat game; every other seat is played by `opponent`, a
`module:function` (or a TextArena `Agent` class) called with that seat's observation text and returning its move.
Observations are the game's new messages to the policy's seat since its last turn (its prompt first); the game's
reward for the seat comes at the end, with `success` when it reaches `success_reward` (a win is 1 in TextArena);
`invalid_move_reward` replaces it for a game the policy lost on an invalid move (TextArena's single-player games pay
partial credit then, which a policy can earn by ending games early).

The game runs without TextArena's observation wrappers (they repeat the whole history in every observation, which a
multi-turn chat already holds); `bracket_actions` applies its ActionFormattingWrapper rule (a move without brackets
is sent as `[move]`). TextArena games draw from the global `random` and `numpy.random` states, seeded by each reset:
calls of all games in a process take turns under one lock, each with its own saved states, so two episodes with one
seed play the same game even when their calls interleave.
"""

from __future__ import annotations

import contextlib
import importlib
import random
import re
import threading

import numpy as np

from agentrl.env.api import TextEnv
from agentrl.plugins import did_you_mean, load_callable

INSTALL = "pip install 'agentrl[textarena]'"
ADAPTER_KEYS = (
    "players",
    "player_id",
    "opponent",
    "bracket_actions",
    "success_reward",
    "invalid_move_reward",
    "opponent_moves",
)
LOCK_WAIT_S = 60.0
_random_lock = threading.Lock()


def textarena_module():
    """The `textarena` package, or an ImportError that says how to install it."""
    try:
        import textarena
    except ImportError as error:
        raise ImportError(f"env ids 'textarena:GAME' need the textarena package: {INSTALL}") from error
    return textarena


def game_ids() -> list[str]:
    from textarena.envs.registration import ENV_REGISTRY

    return sorted(ENV_REGISTRY)


def build_game(name: str, kwargs: dict):
    """TextArena's game `name`, built from its registry entry with `kwargs` over the entry's, without wrappers."""
    textarena_module()
    from textarena.envs.registration import ENV_REGISTRY

    spec = ENV_REGISTRY.get(name)
    if spec is None:
        raise ValueError(
            f"TextArena has no game {name!r}{did_you_mean(name, ENV_REGISTRY)}; env.id must be textarena:GAME with "
            f"GAME a TextArena id such as GuessTheNumber-v0 ({len(ENV_REGISTRY)} ids: textarena.envs.registration)"
        )
    game_class = spec.entry_point
    if isinstance(game_class, str):
        module_name, _, class_name = game_class.partition(":")
        game_class = getattr(importlib.import_module(module_name), class_name)
    try:
        return game_class(**{**spec.kwargs, **kwargs})
    except TypeError as error:
        raise ValueError(f"TextArena's {name!r} rejects env.kwargs {kwargs}: {error}") from None
    except LookupError as error:  # NLTK's: a corpus the game reads is not downloaded
        resource = re.search(r"Resource '?(\w+)'? not found", str(error))
        missing = resource.group(1) if resource else "its corpora"
        raise RuntimeError(
            f"TextArena's {name!r} needs the NLTK data {missing!r}, which is not installed here; download it once "
            f"on every node: python -m nltk.downloader {missing}"
        ) from None


def load_opponent(path: str):
    """The callable behind `path`; a class (a TextArena Agent) is instantiated without arguments."""
    target = load_callable(path, "env.kwargs.opponent")
    return target() if isinstance(target, type) else target


class OwnRandomState:
    """The global `random` and `numpy.random` states of one game, swapped in around each of its calls."""

    def __init__(self, seed: int):
        self.python = random.Random(seed).getstate()
        self.numpy = np.random.RandomState(seed % 2**32).get_state()

    @contextlib.contextmanager
    def installed(self, game: str):
        if not _random_lock.acquire(timeout=LOCK_WAIT_S):
            raise TimeoutError(
                f"textarena:{game}: another TextArena call in this process has held the random state for over "
                f"{LOCK_WAIT_S:.0f} s (a game that hangs); that game's episode times out on its own"
            )
        saved = random.getstate(), np.random.get_state()
        try:
            random.setstate(self.python)
            np.random.set_state(self.numpy)
            yield
            self.python, self.numpy = random.getstate(), np.random.get_state()
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            _random_lock.release()


class TextArenaEnv(TextEnv):
    """One TextArena game per episode; the policy plays seat `player_id`, `opponent` the others."""

    def __init__(
        self,
        name: str,
        players: int = 1,
        player_id: int = 0,
        opponent: str | None = None,
        bracket_actions: bool = False,
        success_reward: float = 1.0,
        invalid_move_reward: float | None = None,
        opponent_moves: int = 1000,
        **game_kwargs,
    ):
        super().__init__()
        if not isinstance(players, int) or players < 1:
            raise ValueError(f"env.kwargs.players must be the game's number of players (an int >= 1), got {players!r}")
        if not isinstance(player_id, int) or not 0 <= player_id < players:
            raise ValueError(f"env.kwargs.player_id must be the policy's seat, 0 to {players - 1}, got {player_id!r}")
        if players > 1 and opponent is None:
            raise ValueError(
                f"textarena:{name} with players={players}: set env.kwargs.opponent to a 'module:function' that plays "
                "the other seats (called with a seat's observation text, returns its move)"
            )
        if not isinstance(opponent_moves, int) or opponent_moves < 1:
            raise ValueError(f"env.kwargs.opponent_moves must be an int >= 1, got {opponent_moves!r}")
        self.name, self.players, self.player_id = name, players, player_id
        self.bracket_actions, self.success_reward, self.opponent_moves = bracket_actions, success_reward, opponent_moves
        self.invalid_move_reward = invalid_move_reward
        self.opponent = load_opponent(opponent) if opponent is not None else None
        self.game = build_game(name, game_kwargs)
        self.random: OwnRandomState | None = None
        self.done = True

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        game_seed = int(self.np_random.integers(2**31)) if seed is None else int(seed)
        self.random = OwnRandomState(game_seed)
        with self.random.installed(self.name):
            try:
                self.game.reset(num_players=self.players, seed=game_seed)
            except AssertionError as error:  # TextArena's states assert the number of players
                raise ValueError(
                    f"textarena:{self.name} does not play with players={self.players}: {error}. Set env.kwargs.players "
                    "(and env.kwargs.opponent for the other seats)"
                ) from None
            self.done = False
            done = self._play_opponents()
            observation = self._observation()
        if done:
            raise RuntimeError(f"textarena:{self.name} ended before seat {self.player_id} moved")
        return observation, {"player_id": self.player_id}

    def step(self, action: str):
        if self.done:
            raise RuntimeError(f"textarena:{self.name}: the episode is over; call reset() before step()")
        if self.bracket_actions and "[" not in action and "]" not in action:
            action = f"[{action.strip()}]"
        with self.random.installed(self.name):
            done = self._step_game(action)
            if not done:
                done = self._play_opponents()
            observation = self._observation()
            if not done:
                return observation, 0.0, False, False, {"player_id": self.player_id}
            rewards, game_info = self._outcome()
        self.done = True
        reward = rewards[self.player_id]
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise TypeError(
                f"textarena:{self.name} ended with a reward for seat {self.player_id} that is no number: "
                f"{reward!r:.120}"
            )
        seat_info = game_info.get(self.player_id, {}) if isinstance(game_info, dict) else {}
        seat_info = seat_info if isinstance(seat_info, dict) else {}
        lost_on_invalid_move = bool(seat_info.get("invalid_move", False))
        if lost_on_invalid_move and self.invalid_move_reward is not None:
            reward = self.invalid_move_reward
        reward = float(reward)
        reason = seat_info.get("reason")
        if reason:
            observation = f"{observation}\n{reason}".strip()
        info = {
            "success": reward >= self.success_reward,
            "player_id": self.player_id,
            "metrics": {"invalid_move": float(lost_on_invalid_move)},
        }
        return observation, reward, True, False, info

    def _step_game(self, action: str) -> bool:
        result = self.game.step(action)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], bool)):
            raise TypeError(f"textarena:{self.name}: step() must return (done: bool, info: dict), got {result!r:.120}")
        return result[0]

    def _play_opponents(self) -> bool:
        """Let `opponent` move for the other seats until it is the policy's turn or the game ends."""
        for _ in range(self.opponent_moves):
            seat = self.game.state.current_player_id
            if seat == self.player_id:
                return False
            if self.opponent is None:
                raise RuntimeError(f"textarena:{self.name} asks seat {seat} to move, and no env.kwargs.opponent is set")
            seat_observation = self._messages_text(seat)
            if self._step_game(str(self.opponent(seat_observation))):
                return True
        raise RuntimeError(
            f"textarena:{self.name}: the opponents made {self.opponent_moves} moves in a row without the game "
            f"returning to seat {self.player_id} or ending; raise env.kwargs.opponent_moves or fix the game"
        )

    def _observation(self) -> str:
        seat = self.game.state.current_player_id
        if not self.done and not self.game.state.done and seat != self.player_id:
            raise RuntimeError(f"textarena:{self.name}: expected seat {self.player_id} to move, the game asks {seat}")
        return self._messages_text(self.player_id)

    def _messages_text(self, seat: int) -> str:
        """The game's messages to `seat` since it last looked, as text (its own moves left out)."""
        messages = self.game.state.observations.get(seat)
        if not isinstance(messages, list):
            raise TypeError(f"textarena:{self.name}: the observations of seat {seat} are not a list: {messages!r:.120}")
        self.game.state.observations[seat] = []
        lines = []
        for message in messages:
            if not (isinstance(message, tuple) and len(message) == 3 and isinstance(message[1], str)):
                raise TypeError(
                    f"textarena:{self.name}: a message to seat {seat} is not (sender, text: str, type): "
                    f"{message!r:.120}"
                )
            sender, text, _ = message
            if sender == seat:
                continue
            lines.append(text if sender == -1 else f"[Player {sender}] {text}")
        return "\n".join(lines)

    def _outcome(self) -> tuple[dict, dict]:
        outcome = self.game.close()
        rewards, game_info = outcome if isinstance(outcome, tuple) and len(outcome) == 2 else (outcome, {})
        if not isinstance(rewards, dict) or self.player_id not in rewards:
            raise TypeError(
                f"textarena:{self.name} ended without a reward for seat {self.player_id}: close() gave {outcome!r:.120}"
            )
        return rewards, game_info


def make(name: str, **kwargs) -> TextArenaEnv:
    """The adapter registered for the `textarena` prefix."""
    return TextArenaEnv(name, **kwargs)
