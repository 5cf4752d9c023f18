"""The rollout side of a multi-policy job: one engine per policy (and one per pool snapshot in play), the env client,
and `collect(step)`: this rank's share of the step's games, each seat's episode sorted into its policy's batch. With
agent programs (agent:) the rank's gateway serves every policy by name instead, and each session's calls of a policy
are that policy's episode (agentrl/gateway/policy_episode.py).

Groups: a policy's episodes of one task and one seat share a group (task index x players + seat), so a seat that
moves first is compared with games where the same policy also moved first. Self-play with `game.opponents` seats
the learner once per game (the seat alternates within a task's games) and draws the other seats' opponent; games
against itself train every seat, games against a snapshot or a program only the learner's.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import replace

from agentrl.config import Config
from agentrl.config.policies import learner_of, policy_dir, policy_view, shared_bases
from agentrl.config.schema import GameConfig
from agentrl.data.tasks import SeededTasks, Task
from agentrl.engine import loop_has_work, make_engine, make_shared_base_engine
from agentrl.engine.base import SamplingParams
from agentrl.gateway.policy_episode import run_policy_session
from agentrl.models.chat_format import ChatFormat
from agentrl.models.loading import load_tokenizer
from agentrl.policies.game import GameResult, Seat, run_game
from agentrl.policies.opponents import OpponentPool, draw_opponent, game_rng, load_program
from agentrl.policies.ratings import snapshot_name
from agentrl.rollout.agent_loop import EpisodeLimits, LoopTimers
from agentrl.rollout.worker import engine_seed, task_index
from agentrl.trajectory import Episode

EVAL_SEED = 1_000_000  # held-out matches play env seeds from here: never a training task's
DRAW_OPPONENT, DRAW_SNAPSHOT, PROGRAM_RNG = 0, 1, 2  # what a game's generators are for


class MultiPolicyWorker:
    """Rollout rank `index` of `count`: engines for every policy on `device`, games against `env_client`."""

    def __init__(self, config: Config, env_client, index: int, count: int, device: str):
        rollout = config.rollout
        # agent programs (agent:) name no game: each policy is one seat of its own, with no opponents
        game = config.game or GameConfig(players={name: name for name in config.policies})
        self.config, self.game, self.env, self.index, self.count = config, game, env_client, index, count
        self.device = device
        self.players = list(game.players)
        self.views = {name: policy_view(config, name) for name in config.policies}
        self.engines, self.chats = {}, {}
        self.bases = {}  # a shared base's engine (engine/shared_lora.py) by the policies on it
        sharing = {name: tuple(names) for names in shared_bases(config) for name in names}
        self.loop_busy = loop_has_work(rollout, config.agent.enabled, count)  # engines keep their steps off it
        for number, (name, view) in enumerate(self.views.items()):
            seed = engine_seed(config.seed + 7919 * number, index)
            if name in sharing:
                if sharing[name] not in self.bases:
                    self.bases[sharing[name]] = make_shared_base_engine(
                        rollout.engine, view.model, device, seed, keep_loop_free=self.loop_busy
                    )
                self.engines[name] = self.bases[sharing[name]].adapter(name, view.model.lora.scaling)
            else:
                self.engines[name] = make_engine(
                    rollout.engine, view.model, device, seed, colocate=False, keep_loop_free=self.loop_busy
                )
            self.chats[name] = ChatFormat(load_tokenizer(view.model.path), config.env.system_prompt)
        self.sampling = {
            name: SamplingParams(
                max_new_tokens=rollout.max_new_tokens,
                temperature=rollout.temperature,
                top_p=rollout.top_p,
                top_k=rollout.top_k,
                stop_token_ids=chat.stop_ids,
            )
            for name, chat in self.chats.items()
        }
        self.limits = EpisodeLimits(rollout.max_turns, rollout.max_new_tokens, rollout.max_episode_tokens)
        self.tasks = SeededTasks(config.seed)
        self.share = rollout.tasks_per_step // count
        self.first_task = index * self.share
        self.learner = learner_of(config)
        self.pool = None
        if any(opponent.kind == "pool" for opponent in game.opponents):
            p = game.pool
            folder = policy_dir(config.run_dir, self.learner) / "pool"
            self.pool = OpponentPool(p.size, p.every, p.sampling, p.decay, folder, saves=index == 0)
        self.snapshot_engines: dict[int, object] = {}
        programs = [*game.opponents, *(game.evaluate.opponents if game.evaluate else [])]
        self.programs = {o.program: load_program(o.program) for o in programs if o.kind == "program"}
        self.loop = asyncio.new_event_loop()
        self._reported: dict[str, int] = {}  # adapter bytes reported by policy (_adapter_bytes)
        self.gateway = None  # agent programs (agent:): every policy served by name over HTTP on this rank
        if config.agent.enabled:
            self.gateway = policy_gateway(config, self.engines, self.chats, index, self.loop)

    # weights
    def weights_taken(self, name: str, version: int) -> None:
        """After policy `name`'s engine took `version`: a snapshot for the pool when one is due."""
        if self.pool is not None and name == self.learner and self.pool.due(version):
            self.pool.take(version, self.engines[name].model.named_parameters())
            for gone in set(self.snapshot_engines) - set(self.pool.snapshots):
                self.snapshot_engines.pop(gone).shutdown()

    def restore_pool(self, start_step: int) -> list[int]:
        """A resumed run: the pool's snapshots back from run_dir (none at step 0)."""
        return self.pool.restore(start_step) if self.pool is not None and start_step else []

    def _snapshot_engine(self, version: int):
        if version not in self.snapshot_engines:
            view = self.views[self.learner]
            seed = engine_seed(self.config.seed + 104729 + version, self.index)
            engine = make_engine(
                self.config.rollout.engine,
                view.model,
                self.device,
                seed,
                colocate=False,
                keep_loop_free=self.loop_busy,
            )
            engine.load_weights(self.pool.snapshots[version], version)
            self.snapshot_engines[version] = engine
        return self.snapshot_engines[version]

    # seats
    def _policy_seat(self, player: str, name: str, trains: bool, group: int, task, label: str | None = None):
        episode = Episode(group=group, task_seed=task.seed, task_id=task.id)
        engine, sampling = self.engines[name], self.sampling[name]
        return Seat(player, label or name, name, trains, engine, self.chats[name], sampling, episode=episode)

    def _seats(self, step: int, game_number: int, position: int, task_number: int, task):
        """The seats of one training game, the label of the learner's opponent and the learner's player id (both
        None without opponents)."""
        n = len(self.players)
        if self.learner is None or not self.game.opponents:
            seats = {}
            for seat, (player, name) in enumerate(self.game.players.items()):
                trains = self.config.policies[name].train
                seats[player] = self._policy_seat(player, name, trains, task_number * n + seat, task)
            return seats, None, None
        learner_seat = position % n
        opponent = draw_opponent(self.game.opponents, game_rng(self.config.seed, step, game_number, DRAW_OPPONENT))
        seats = {}
        for seat, player in enumerate(self.players):
            group = task_number * n + seat
            if seat == learner_seat or opponent.kind == "self":
                seats[player] = self._policy_seat(player, self.learner, True, group, task)
            elif opponent.kind == "pool":
                version = self.pool.draw(game_rng(self.config.seed, step, game_number, DRAW_SNAPSHOT))
                episode = Episode(group=group, task_seed=task.seed)
                chat = self.chats[self.learner]
                seats[player] = Seat(
                    player, snapshot_name(version), None, False, self._snapshot_engine(version), chat,
                    self.sampling[self.learner], episode=episode,
                )  # fmt: skip
            else:
                seats[player] = self._program_seat(player, opponent, step, game_number)
        label = "self" if opponent.kind == "self" else seats[self.players[(learner_seat + 1) % n]].label
        return seats, label, self.players[learner_seat]

    def _program_seat(self, player: str, opponent, step: int, game_number: int) -> Seat:
        seed = int(game_rng(self.config.seed, step, game_number, PROGRAM_RNG).integers(2**62))
        return Seat(player, opponent.label, program=self.programs[opponent.program], rng=random.Random(seed))

    # steps
    def collect(self, step: int) -> tuple[dict[str, list[Episode]], dict[str, float], list[tuple[str, float]]]:
        """This rank's games of `step`: the trained episodes by policy, the step's counts (summed over ranks; the
        trainer makes rates of them, `game_metrics`) and the learner's (opponent, outcome) per game for Elo."""
        rc = self.config.rollout
        indices = [task_index(rc.tasks_per_step, 0, self.first_task, j) for j in range(self.share)]
        tasks = self.tasks.take(step, indices)
        if self.gateway is not None:
            return self._collect_sessions(indices, tasks)
        games = []
        for task_number, task in zip(indices, tasks, strict=True):
            for position in range(rc.group_size):
                game_number = task_number * rc.group_size + position
                games.append((*self._seats(step, game_number, position, task_number, task), task))
        timers = LoopTimers()
        busy = self._busy()
        started = time.perf_counter()
        results = self._play(games, step, timers)
        wall = time.perf_counter() - started
        by_policy: dict[str, list[Episode]] = {name: [] for name in self.views if self.config.policies[name].train}
        stats: dict[str, float] = {"game/games": float(len(games))}
        outcomes: list[tuple[str, float]] = []
        for (seats, label, learner, _), result in zip(games, results, strict=True):
            for seat in seats.values():
                if seat.trains and (seat.episode.turns or seat.episode.error):  # a seat that never moved: no signal
                    by_policy[seat.policy].append(seat.episode)
            _count_game(stats, "game", seats, result, label, learner)
            if label not in (None, "self"):
                outcomes.append((label, result.outcome(learner)))
        generate = self._busy() - busy
        stats.update({"time/rollout": wall, "time/generate": generate, "time/env": max(0.0, wall - generate)})
        stats.update(self._adapter_bytes())
        return by_policy, stats, outcomes

    def _collect_sessions(self, indices: list[int], tasks) -> tuple[dict, dict, list]:
        """`collect` with agent programs: one session per game, the agent calling policies by name; each policy's
        calls are its episode (group: task x policies + the policy's number), its samples after the first too."""
        names = list(self.views)
        timers = LoopTimers()
        runs = []
        for task_number, task in zip(indices, tasks, strict=True):
            for _ in range(self.config.rollout.group_size):
                episodes = {
                    name: Episode(task_number * len(names) + number, task.seed, task.id, task_options=task.options)
                    for number, name in enumerate(names)
                }
                runs.append(run_policy_session(self.gateway, self.config.agent, episodes, self.sampling, timers))
        busy = self._busy()
        started = time.perf_counter()

        async def everything():
            return await asyncio.gather(*runs)

        results = self.loop.run_until_complete(everything())
        wall = time.perf_counter() - started
        by_policy: dict[str, list[Episode]] = {name: [] for name in names if self.config.policies[name].train}
        stats: dict[str, float] = {"game/games": float(len(results)), "gateway/unknown_model_calls": 0.0}
        seats = dict.fromkeys(names)
        for result in results:
            for name, episode in result.episodes.items():
                if name in by_policy:
                    by_policy[name] += [episode, *episode.more_samples]
            rewards = {name: result.rewards.get(name, 0.0) for name in names}
            _count_game(stats, "game", seats, GameResult(rewards, success=result.success, error=result.error), None,
                        None)  # fmt: skip
            stats["gateway/unknown_model_calls"] += len(result.unknown_models)
        generate = self._busy() - busy
        stats.update({"time/rollout": wall, "time/generate": generate, "time/env": max(0.0, wall - generate)})
        stats.update(self._adapter_bytes())
        return by_policy, stats, []

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out matches (game.evaluate): this rank's share of `games` per program, the learner alternating seats,
        at the evaluation temperature; counts under game_eval/."""
        spec, n = self.game.evaluate, len(self.players)
        sampling = {**self.sampling}
        sampling[self.learner] = replace(sampling[self.learner], temperature=spec.temperature)
        games = []
        for number, opponent in enumerate(spec.opponents):
            for game in range(self.index, spec.games, self.count):
                task = Task(str(EVAL_SEED + game), EVAL_SEED + game)
                learner = self.players[game % n]
                seats = {}
                for player in self.players:
                    if player == learner:
                        seat = self._policy_seat(player, self.learner, False, 0, task)
                        seat.sampling = sampling[self.learner]
                    else:
                        seat = self._program_seat(player, opponent, EVAL_SEED + number, game)
                    seats[player] = seat
                games.append((seats, opponent.label, learner, task))
        results = self._play(games, -1 - step, LoopTimers())
        stats: dict[str, float] = {}
        for (seats, label, learner, _), result in zip(games, results, strict=True):
            _count_game(stats, "game_eval", seats, result, label, learner)
        return stats

    def _play(self, games, step: int, timers: LoopTimers) -> list[GameResult]:
        """Every game of `games` ((seats, opponent label, learner player, task) each) at once, on this rank's loop."""
        env_id = self.config.env.id
        runs = [
            run_game(self.env, seats, self.limits, (step, number), task.seed, env_id, timers)
            for number, (seats, _, _, task) in enumerate(games)
        ]

        async def everything():
            return await asyncio.gather(*runs)

        return self.loop.run_until_complete(everything())

    def _busy(self) -> float:
        engines = [*self.engines.values(), *self.snapshot_engines.values(), *self.bases.values()]
        return float(sum(getattr(engine, "busy_seconds", 0.0) for engine in engines))

    def _adapter_bytes(self) -> dict[str, float]:
        """weights/adapter_bytes_in/NAME: the adapter bytes each policy on a shared base took since the last step's
        report (summed over rollout ranks); a policy that does not train takes none."""
        out = {}
        for names in self.bases:
            for name in names:
                engine = self.engines[name]
                out[f"weights/adapter_bytes_in/{name}"] = float(engine.bytes_received - self._reported.get(name, 0))
                self._reported[name] = engine.bytes_received
        return out

    def memory(self) -> dict[str, int]:
        """Bytes of the engines' weights on this rank: every parameter and buffer storage counted once (a shared
        base once for all its policies), and the adapters on shared bases."""
        seen, weights = set(), 0
        models = [
            getattr(engine, "model", None) for engine in [*self.engines.values(), *self.snapshot_engines.values()]
        ]
        for model in models:
            for tensor in [*model.parameters(), *model.buffers()] if model is not None else []:
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    weights += storage.nbytes()
        for engine in [*self.engines.values(), *self.snapshot_engines.values()]:
            lora = getattr(engine, "lora", None)  # a merging engine keeps its adapted base weights aside
            if lora is not None:
                weights += sum(t.numel() * t.element_size() for t in lora.base.values())
        adapters = sum(base.adapter_bytes() for base in self.bases.values())
        return {"weights": weights, "adapters": adapters}

    def close(self) -> None:
        if self.gateway is not None:
            self.gateway.stop(self.loop)
        if self.env is not None:
            self.env.shutdown()


def policy_gateway(config: Config, engines: dict, chats: dict, index: int, loop):
    """Rollout rank `index`'s gateway serving every policy by name, started on `loop` and announced in run_dir."""
    from pathlib import Path

    from agentrl.gateway.server import Gateway

    agent = config.agent
    port = agent.port + index if agent.port else 0
    served = {name: (engine, chats[name].tokenizer) for name, engine in engines.items()}
    max_len = config.rollout.max_episode_tokens
    gateway = Gateway(
        None, None, max_len, agent, port, config.chat.format, rewritten=config.chat.rewritten, policies=served
    )
    gateway.start(loop)
    gateway.announce(Path(config.run_dir), index)
    return gateway


def _count_game(stats: dict, prefix: str, seats: dict, result: GameResult, label, learner) -> None:
    """Counters of one game (summed over ranks): per player its reward, the env's success, failures, and the
    learner's wins against its opponent."""
    add = lambda name, value: stats.__setitem__(name, stats.get(name, 0.0) + float(value))  # noqa: E731
    add(f"{prefix}/count", 1)
    add(f"{prefix}/failed", result.error is not None)
    add(f"{prefix}/succeeded", result.success)
    for player, reward in result.rewards.items():
        add(f"{prefix}/reward_sum/{player}", reward)
    if result.winner is not None:  # a game that names winners (a cooperative one names none)
        for player in seats:
            add(f"{prefix}/wins/{player}", result.winner == player)
    if label is not None:
        add(f"{prefix}/games_vs/{label}", 1)
        add(f"{prefix}/wins_vs/{label}", result.outcome(learner))


def game_metrics(stats: dict[str, float]) -> dict[str, float]:
    """The counters of `_count_game`, merged over ranks, as rates: game/reward_mean/PLAYER, game/win_rate/PLAYER,
    game/success_rate, game/win_rate_vs/OPPONENT (and the same under game_eval/); other stats pass through."""
    out = {}
    for prefix in ("game", "game_eval"):
        count = stats.get(f"{prefix}/count", 0.0)
        if not count:
            continue
        out[f"{prefix}/games"] = count
        out[f"{prefix}/failed"] = stats[f"{prefix}/failed"]
        out[f"{prefix}/success_rate"] = stats[f"{prefix}/succeeded"] / count
        for name, value in stats.items():
            kind, _, rest = name.partition("/")
            if kind != prefix:
                continue
            if rest.startswith("reward_sum/"):
                out[f"{prefix}/reward_mean/{rest.removeprefix('reward_sum/')}"] = value / count
            elif rest.startswith("wins/"):
                out[f"{prefix}/win_rate/{rest.removeprefix('wins/')}"] = value / count
            elif rest.startswith("wins_vs/"):
                label = rest.removeprefix("wins_vs/")
                games = stats[f"{prefix}/games_vs/{label}"]
                out[f"{prefix}/win_rate_vs/{label}"] = value / games
                out[f"{prefix}/games_vs/{label}"] = games
    passed = {k: v for k, v in stats.items() if not k.startswith(("game/", "game_eval/"))}
    return {**passed, **out}
