"""One multi-agent game: the env names whose turn it is (info["player"], as PettingZoo's AEC API and TextArena do);
that player's seat acts, and a seat played by a policy records its turns in an episode of its own.

A seat's episode is what its policy saw and said, laid out as a single-agent episode is (agentrl/rollout/agent_loop.py):
its first observation as the prompt (loss mask 0), each of its turns as generated (mask 1, with log-probs and the
weight version), and before each later turn the observation that came back to it (mask 0). Rewards are per player:
`info["rewards"]` ({player: reward}) when the env gives them, else the step's reward goes to the player that moved.
A seat's success is its win (`info["winner"]`), else its own (`info["successes"]`, {player: bool}), else the game's
(`info["success"]`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from agentrl.engine.base import Engine, SamplingParams
from agentrl.errors import UserError
from agentrl.models.chat_format import ChatFormat
from agentrl.models.content_tokens import ContentError
from agentrl.rollout.agent_loop import EpisodeLimits, LoopTimers
from agentrl.rollout.messages import assistant_message, observation_messages
from agentrl.trajectory import Episode, RewardError, finite_reward, state_key


class UnknownPlayer(UserError):
    """The env named a player that game.players does not seat."""


class OutOfRoom(Exception):
    """A seat's episode reached rollout.max_episode_tokens: the game ends there."""


@dataclass
class Seat:
    """Who plays one player id: a policy's engine (with its chat format), or a program (function(observation, rng));
    `trains`: its episode goes to `policy`'s batch. `label` names it in logs (the policy, "pool", a program)."""

    player: str
    label: str
    policy: str | None = None
    trains: bool = False
    engine: Engine | None = None
    chat: ChatFormat | None = None
    sampling: SamplingParams | None = None
    program: Callable[[str, random.Random], str] | None = None
    rng: random.Random | None = None
    episode: Episode | None = None
    versions: set = field(default_factory=set)

    async def act(self, observation: str, info: dict, tools, limits: EpisodeLimits, timers: LoopTimers) -> str:
        """This seat's action on `observation`; a policy's turn is recorded in its episode."""
        if self.program is not None:
            return str(self.program(observation, self.rng))
        episode, chat = self.episode, self.chat
        if not episode.tokens:
            episode.extend(chat.prompt_ids(observation, tools), mask=0)
            episode.prompt_len = len(episode.tokens)
            episode.text, episode.messages, episode.tools = observation, chat.prompt_messages(observation), tools
        else:
            ids = chat.observation_ids(observation)
            if len(episode.tokens) + len(ids) >= limits.max_episode_tokens:
                raise OutOfRoom
            episode.extend(ids, mask=0)
            episode.text += f"\n{observation}"
            episode.messages += observation_messages(observation, episode.messages[-1])
        budget = limits.max_episode_tokens - len(episode.tokens) - 1  # room to close the turn
        if budget <= 0:
            raise OutOfRoom
        started = time.perf_counter()
        sampling = replace(self.sampling, max_new_tokens=min(limits.max_new_tokens, budget))
        output = await self.engine.generate(episode.tokens, sampling)
        timers.generate += time.perf_counter() - started
        self.versions.add(output.weight_version)
        episode.turn_states.append(state_key(info.get("state_key", observation)))
        start = len(episode.tokens)
        episode.extend(output.output_ids, mask=1, logprobs=output.logprobs, version=output.weight_version)
        episode.turn_spans.append((start, len(episode.tokens)))
        episode.turn_rewards.append(0.0)
        if output.finish_reason != "stop":
            episode.extend([chat.eos_id], mask=0)  # close the turn the model did not close
        action = chat.decode(output.output_ids)
        episode.turns += 1
        episode.messages.append(assistant_message(action))
        episode.text += f"\n>>> {action}"
        return action


@dataclass
class GameResult:
    """How a game ended: each player's summed reward, the winner (None: none named), the env's success flag, and an
    error when the env failed (no seat trains then)."""

    rewards: dict[str, float]
    winner: str | None = None
    success: bool = False
    successes: dict[str, bool] = field(default_factory=dict)  # per player, where the env names them
    finish: str = "max_turns"
    error: str | None = None

    def outcome(self, player: str) -> float:
        """1 for a win, 0 for a loss, 0.5 for a draw (the game named no winner), from `player`'s side."""
        if self.winner is None:
            return 0.5
        return 1.0 if self.winner == player else 0.0


def player_of(info, seats: dict[str, Seat], env_id: str, when: str) -> str:
    """The player whose turn it is, as the env named it; UnknownPlayer naming the fix when no seat plays it."""
    player = info.get("player") if isinstance(info, dict) else None
    if player is None:
        raise UnknownPlayer(
            f"env {env_id} named no player after {when} (info['player'] is missing) while the game went on; a "
            "multi-agent env puts whose turn it is in info['player'] (docs/multi-agent.md)"
        )
    player = str(player)
    if player not in seats:
        raise UnknownPlayer(
            f"env {env_id} named player {player!r}, which game.players does not seat (it seats "
            f"{', '.join(seats)}); add game.players.{player}: POLICY"
        )
    return player


async def run_game(env, seats: dict[str, Seat], limits: EpisodeLimits, key, task_seed: int, env_id: str,
                   timers: LoopTimers | None = None) -> GameResult:  # fmt: skip
    """One game of the env behind `env` (a client, its env key `key`) between `seats`, by player id. Each seat's
    episode (when it has one) is filled in; the result says who won."""
    timers = timers or LoopTimers()
    rewards = dict.fromkeys(seats, 0.0)
    started = time.perf_counter()
    reply = await env.call("reset", key, task_seed, None)
    timers.env += time.perf_counter() - started
    if not reply.ok:
        return _failed_game(seats, rewards, reply.error)
    observation, info, tools = reply.value
    info = info if isinstance(info, dict) else {}
    player = player_of(info, seats, env_id, "reset")
    result = GameResult(rewards)
    for _ in range(limits.max_turns * len(seats)):
        seat = seats[player]
        try:
            action = await seat.act(observation, info, tools, limits, timers)
        except OutOfRoom:
            result.finish = "max_tokens"
            break
        except ContentError as error:
            await env.call("close", key)
            return _failed_game(seats, rewards, str(error))
        started = time.perf_counter()
        reply = await env.call("step", key, action)
        timers.env += time.perf_counter() - started
        if not reply.ok:
            return _failed_game(seats, rewards, reply.error)
        observation, reward, terminated, truncated, info = reply.value
        info = info if isinstance(info, dict) else {}
        try:
            _add_rewards(seats, rewards, player, reward, info, env_id)
        except RewardError as refused:
            await env.call("close", key)
            return _failed_game(seats, rewards, f"{refused}; fix the env's step() (the game failed and does not train)")
        if terminated or truncated:
            result.finish = "terminated" if terminated else "truncated"
            result.winner = None if info.get("winner") is None else str(info["winner"])
            result.success = bool(info.get("success", False))
            successes = info.get("successes")
            if isinstance(successes, dict):
                result.successes = {str(player): bool(value) for player, value in successes.items()}
            break
        player = player_of(info, seats, env_id, "step")
    await env.call("close", key)
    _close_episodes(seats, result)
    return result


def _add_rewards(seats: dict[str, Seat], rewards: dict[str, float], mover: str, reward, info: dict, env_id: str):
    """The step's rewards by player (info["rewards"], else `reward` to the mover), into the sums and the last turns."""
    given = info.get("rewards")
    if given is None:
        given = {mover: reward}
    for player, value in given.items():
        player = str(player)
        if player not in seats:
            raise UnknownPlayer(
                f"env {env_id} gave a reward to player {player!r}, which game.players does not seat (it seats "
                f"{', '.join(seats)}); add game.players.{player}: POLICY"
            )
        value = finite_reward(value, f"the env's reward for player {player}")
        rewards[player] = finite_reward(rewards[player] + value, f"player {player}'s rewards summed over the game")
        episode = seats[player].episode
        if episode is not None and episode.turn_rewards:
            episode.turn_rewards[-1] += value


def _close_episodes(seats: dict[str, Seat], result: GameResult) -> None:
    for player, seat in seats.items():
        episode = seat.episode
        if episode is None:
            continue
        episode.finish = result.finish
        episode.reward = result.rewards[player]
        if result.winner is not None:
            episode.success = result.winner == player
        else:
            episode.success = result.successes.get(player, result.success)
        episode.weight_version = min(seat.versions) if seat.versions else -1
        if not episode.tokens:  # the game ended before this seat's first turn: nothing to train
            episode.extend([seat.chat.eos_id, seat.chat.eos_id], mask=0)


def _failed_game(seats: dict[str, Seat], rewards: dict[str, float], error: str) -> GameResult:
    """An env failure: every seat's episode is kept for accounting, with no training signal."""
    for seat in seats.values():
        episode = seat.episode
        if episode is None:
            continue
        episode.finish, episode.error, episode.reward = "error", error, 0.0
        episode.loss_mask = [0] * len(episode.tokens)
        episode.turn_spans, episode.turn_rewards, episode.turn_states = [], [], []
        if not episode.tokens:
            episode.extend([0], mask=0)
    return GameResult(dict.fromkeys(rewards, 0.0), finish="error", error=error)
