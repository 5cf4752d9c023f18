"""Gymnasium's toy-text games (FrozenLake, Taxi, CliffWalking, Blackjack, ...) as text games.

The observation draws or describes the state and lists the legal actions; the model answers
with an action name or its number. An answer that names no action costs a turn, changes
nothing, and is answered with the legal actions (`max_invalid` of them end the episode).

`info["state_key"]` (reset and step) is the Gymnasium state (an int, or a tuple for Blackjack):
turn-level algorithms (GiGPO) group the turns of a task's episodes that acted in the same state,
which the observation text cannot tell them (`brief` lists the actions only at first, and an
invalid answer changes the text but not the state).
"""

from __future__ import annotations

import gymnasium as gym
from gymnasium import spaces
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from agentrl.env.api import TextEnv
from envs.toy_text.actions import describe_actions, parse_action
from envs.toy_text.renderers import view_for

SEED_RANGE = 2**31
MAX_ECHO = 40  # characters of an invalid answer quoted back


class ToyTextEnv(TextEnv):
    """Any gymnasium env with a Discrete action space, played in text.

    Args:
        game: a gymnasium id, for example "FrozenLake-v1", "Taxi-v4", "CliffWalking-v1", "Blackjack-v1"
        game_kwargs: keyword arguments for `gymnasium.make(game, ...)`
        max_steps: turns (valid or not) before the episode is truncated
        max_invalid: invalid answers that end the episode (truncated); None never ends it for that
        step_reward: shaping added to the game's reward on every valid move (0 keeps the game's reward)
        invalid_reward: the reward for an answer that names no action
        brief: list the actions only in the first observation and after an invalid answer (fewer tokens per turn)
    """

    def __init__(
        self,
        game: str = "FrozenLake-v1",
        game_kwargs: dict | None = None,
        max_steps: int = 50,
        max_invalid: int | None = None,
        step_reward: float = 0.0,
        invalid_reward: float = 0.0,
        brief: bool = False,
    ):
        super().__init__()
        if max_steps < 1:
            raise ValueError(f"toy_text needs max_steps >= 1, got {max_steps}")
        if max_invalid is not None and max_invalid < 1:
            raise ValueError(
                f"toy_text needs max_invalid >= 1 or None (never end for invalid answers), got {max_invalid}"
            )
        self.game_id, self.game_kwargs = game, dict(game_kwargs or {})
        self.max_steps, self.max_invalid = max_steps, max_invalid
        self.step_reward, self.invalid_reward = step_reward, invalid_reward
        self.brief = brief
        self.game = self._make_game(self.game_kwargs)
        self.view = view_for(self.game)
        self.actions = self.game.action_space
        self.actions_text = describe_actions(self.view.action_names, int(self.actions.n))
        self.state = None
        self.steps = self.invalid_answers = 0
        self.over = False

    def _make_game(self, kwargs: dict) -> gym.Env:
        try:
            game = gym.make(self.game_id, **kwargs)
        except (gym.error.Error, TypeError) as error:  # TypeError: a keyword the game does not take
            raise ValueError(
                f"cannot make gymnasium game {self.game_id!r} with {kwargs}: {error}. "
                "Pass a registered gymnasium id (FrozenLake-v1, Taxi-v4, CliffWalking-v1, Blackjack-v1) as game= "
                "and only keywords its constructor takes as game_kwargs="
            ) from error
        if not isinstance(game.action_space, spaces.Discrete):
            raise ValueError(f"toy_text needs a Discrete action space; {self.game_id} has {game.action_space}")
        return game

    def episode_game_kwargs(self) -> dict | None:
        """Game kwargs that change per episode (drawn from self.np_random), or None to keep the game."""
        return None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        kwargs = self.episode_game_kwargs()
        if kwargs is not None:
            self.game.close()
            self.game = self._make_game({**self.game_kwargs, **kwargs})
        self.state, _ = self.game.reset(seed=int(self.np_random.integers(SEED_RANGE)))
        self.steps = self.invalid_answers = 0
        self.over = False
        lines = [
            self.view.legend(self.game),
            self.view.describe(self.game, self.state),
            f"Actions: {self.actions_text}.",
        ]
        observation = "\n".join(lines)
        return observation, {"state": plain(self.state), "state_key": plain(self.state)}

    def step(self, action):
        if self.state is None:
            raise RuntimeError("step() called before reset(): call reset() to start an episode")
        if self.over:
            raise RuntimeError("step() called after the episode ended: call reset() to start a new episode")
        self.steps += 1
        out_of_steps = self.steps >= self.max_steps
        index = parse_action(action, self.view.action_names, int(self.actions.n))
        if index is None:
            return self._invalid(action, out_of_steps)
        previous = self.state
        self.state, reward, terminated, truncated, _ = self.game.step(int(self.actions.start) + index)
        reward = float(reward)
        truncated = bool(truncated or out_of_steps) and not terminated
        self.over = bool(terminated or truncated)
        success = bool(terminated) and self.view.succeeded(self.game, self.state, reward)
        lines = [self.view.event(self.game, self.state, reward), self.view.describe(self.game, self.state)]
        if terminated:
            lines.append(self.view.ending(self.game, self.state, reward))
        elif truncated:
            lines.append("Out of steps.")
        elif not self.brief:
            lines.append(f"Actions: {self.actions_text}.")
        info = {
            "success": success,
            "invalid_action": False,
            "state": plain(self.state),
            "state_key": plain(self.state),
            "game_reward": reward,
        }
        observation = "\n".join(line for line in lines if line)
        return observation, reward + self.shaping(previous, self.state), bool(terminated), truncated, info

    def shaping(self, previous, state) -> float:
        """Reward added to the game's for a valid move from `previous` to `state`."""
        return self.step_reward

    def _invalid(self, action: str, out_of_steps: bool):
        self.invalid_answers += 1
        too_many = self.max_invalid is not None and self.invalid_answers >= self.max_invalid
        self.over = out_of_steps or too_many
        quoted = action.strip()[:MAX_ECHO]
        lines = [
            f"Invalid action {quoted!r}: answer with one of {self.actions_text}.",
            self.view.describe(self.game, self.state),
        ]
        if self.over:
            lines.append("Too many invalid actions." if too_many else "Out of steps.")
        info = {
            "success": False,
            "invalid_action": True,
            "invalid_actions": self.invalid_answers,
            "state_key": plain(self.state),
        }
        return "\n".join(lines), self.invalid_reward, False, self.over, info

    def close(self):
        self.game.close()


def plain(state):
    """A gymnasium observation as plain ints (numpy ints and tuples of them do not travel well as JSON)."""
    return tuple(int(value) for value in state) if isinstance(state, tuple) else int(state)


class FrozenLakeEnv(ToyTextEnv):
    """FrozenLake: walk from S to G over ice F without falling into a hole H.

    Args:
        map_name: "4x4" or "8x8" (ignored with random_map_size)
        is_slippery: moves slide sideways 2 times in 3 (gymnasium's default is True; False is learnable quickly)
        random_map_size: draw a new size x size map per episode from the seed (gymnasium's generate_random_map)
        frozen_probability: the chance a random-map cell is ice rather than a hole
        progress_reward: shaping per step closer to G (minus per step away; it sums to progress x steps gained)
        options: ToyTextEnv's max_steps (default 2 x cells), max_invalid, step_reward, invalid_reward, brief
    """

    def __init__(
        self,
        map_name: str = "4x4",
        is_slippery: bool = False,
        random_map_size: int | None = None,
        frozen_probability: float = 0.8,
        progress_reward: float = 0.0,
        **options,
    ):
        if random_map_size is not None and random_map_size < 2:
            raise ValueError(f"frozen_lake needs random_map_size >= 2 or None, got {random_map_size}")
        self.random_map_size, self.frozen_probability = random_map_size, frozen_probability
        self.progress_reward = progress_reward
        side = random_map_size or int(map_name.split("x")[0])
        options.setdefault("max_steps", 2 * side * side)
        super().__init__("FrozenLake-v1", {"map_name": map_name, "is_slippery": is_slippery}, **options)

    def episode_game_kwargs(self) -> dict | None:
        if self.random_map_size is None:
            return None
        seed = int(self.np_random.integers(SEED_RANGE))
        return {"desc": generate_random_map(self.random_map_size, self.frozen_probability, seed=seed)}

    def shaping(self, previous, state) -> float:
        return super().shaping(previous, state) + self.progress_reward * (
            self._to_goal(previous) - self._to_goal(state)
        )

    def _to_goal(self, state) -> int:
        """Manhattan distance from `state` to the goal."""
        desc = self.game.unwrapped.desc
        (goal_row,), (goal_col,) = (desc == b"G").nonzero()
        row, col = divmod(int(state), desc.shape[1])
        return int(abs(goal_row - row) + abs(goal_col - col))


class TaxiEnv(ToyTextEnv):
    """Taxi: drive to the passenger, pick them up, and drop them off at the destination (R, G, Y or B).

    Args:
        is_rainy: moves go sideways 1 time in 5
        fickle_passenger: the passenger may change destination after pickup
        options: ToyTextEnv's max_steps, max_invalid, step_reward, invalid_reward, brief
    """

    def __init__(self, is_rainy: bool = False, fickle_passenger: bool = False, **options):
        super().__init__("Taxi-v4", {"is_rainy": is_rainy, "fickle_passenger": fickle_passenger}, **options)


class CliffWalkingEnv(ToyTextEnv):
    """CliffWalking: walk along a 4x12 grid from S to G; the cliff C sends you back to S (reward -100).

    Args:
        is_slippery: moves slide sideways 2 times in 3
        options: ToyTextEnv's max_steps, max_invalid, step_reward, invalid_reward, brief
    """

    def __init__(self, is_slippery: bool = False, **options):
        super().__init__("CliffWalking-v1", {"is_slippery": is_slippery}, **options)


class BlackjackEnv(ToyTextEnv):
    """Blackjack against a dealer who draws to 17; success is a win (reward > 0).

    Args:
        natural: a natural blackjack pays 1.5
        sab: Sutton and Barto's rules
        options: ToyTextEnv's max_steps, max_invalid, step_reward, invalid_reward, brief
    """

    def __init__(self, natural: bool = False, sab: bool = False, **options):
        super().__init__("Blackjack-v1", {"natural": natural, "sab": sab}, **options)
