"""Several policies in one job: the config's checks, turn attribution, per-policy batches and advantages, the
opponent pool, Elo, and the bad inputs (an unknown player, a policy without ranks, an algorithm that cannot run)."""

import asyncio
import random

import numpy as np
import pytest

from agentrl.algorithms import algorithm_of
from agentrl.config import ConfigError, from_dict
from agentrl.config.policies import policy_trainer_ranks, policy_view
from agentrl.engine.base import Engine
from agentrl.env.api import TextEnv
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.models.chat_format import ChatFormat
from agentrl.models.loading import load_tokenizer
from agentrl.policies.game import Seat, UnknownPlayer, run_game
from agentrl.policies.opponents import OpponentPool, draw_opponent, game_rng, pool_weights
from agentrl.policies.ratings import LEARNER, EloRatings
from agentrl.policies.worker import MultiPolicyWorker, game_metrics
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.trajectory import Episode, pack


def relay_config(model_dir, **extra):
    raw = {
        "model": {"path": str(model_dir)},
        "env": {"id": "relay", "kwargs": {"numbers": 3}},
        "layout": {"trainer": 2, "rollout": 1},
        "policies": {"proposer": {}, "solver": {"optimizer": {"lr": 0.01}}},
        "game": {"players": {"proposer": "proposer", "solver": "solver"}},
        "rollout": {"tasks_per_step": 2, "group_size": 4, "max_turns": 1, "max_new_tokens": 2,
                    "max_episode_tokens": 96},
    }  # fmt: skip
    for key, value in extra.items():
        raw[key] = value
    return from_dict(raw)


def nim_config(model_dir, **extra):
    raw = {
        "model": {"path": str(model_dir)},
        "env": {"id": "nim", "kwargs": {"low": 5, "high": 9}},
        "policies": {"nim": {}},
        "game": {
            "players": {"0": "nim", "1": "nim"},
            "opponents": [{"kind": "self"}, {"kind": "pool"}, {"kind": "program", "program": "envs.nim:take_one"}],
            "pool": {"every": 1, "size": 2},
        },
        "rollout": {"tasks_per_step": 2, "group_size": 6, "max_turns": 5, "max_new_tokens": 1,
                    "max_episode_tokens": 200},
    }  # fmt: skip
    raw.update(extra)
    return from_dict(raw)


# --- the config -------------------------------------------------------------------------------------------------


def test_a_single_policy_config_has_no_policies(tiny_model_dir):
    config = from_dict({"model": {"path": str(tiny_model_dir)}})
    assert config.policies == {} and config.game is None


def test_each_policy_sees_its_own_sections(tiny_model_dir):
    config = relay_config(tiny_model_dir)
    solver, proposer = policy_view(config, "solver"), policy_view(config, "proposer")
    assert solver.optimizer.lr == 0.01 and proposer.optimizer.lr == config.optimizer.lr
    assert solver.run_dir.endswith("policies/solver") and proposer.run_dir.endswith("policies/proposer")
    assert solver.policies == {} and solver.game is None


def test_a_player_naming_an_unknown_policy_is_refused(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"game.players.solver='sovler' names no policy .*add policies.sovler"):
        relay_config(tiny_model_dir, game={"players": {"proposer": "proposer", "solver": "sovler"}})


def test_a_layout_leaving_a_policy_without_ranks_is_refused(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"layout.trainer=1, but the policies' trainer ranks add up to 2.*"):
        relay_config(tiny_model_dir, layout={"trainer": 1, "rollout": 1})
    with pytest.raises(ConfigError, match=r"policies.solver.trainers=0 leaves the trained policy solver without"):
        relay_config(tiny_model_dir, policies={"proposer": {}, "solver": {"trainers": 0}})
    config = relay_config(tiny_model_dir)
    with pytest.raises(ConfigError, match=r"the job has 1 trainer rank.*set layout.trainer=2"):
        policy_trainer_ranks(config, [0])
    assert policy_trainer_ranks(config, [0, 1]) == {"proposer": [0], "solver": [1]}


def test_an_algorithm_that_cannot_run_multi_policy_is_refused(tiny_model_dir):
    dapo = {"name": "dapo", "max_extra_rounds": 2}
    with pytest.raises(ConfigError, match=r"policies.solver: algorithm dapo draws more tasks .*max_extra_rounds=0"):
        relay_config(tiny_model_dir, policies={"proposer": {}, "solver": {"algorithm": dapo}})
    config = relay_config(tiny_model_dir, policies={"proposer": {}, "solver": {"algorithm": {"name": "grpo"}}})
    assert policy_view(config, "solver").algorithm.name == "grpo"
    assert policy_view(config, "proposer").algorithm.name == config.algorithm.name


def test_settings_a_multi_policy_job_cannot_run_are_refused(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"cannot run with rollout.max_staleness: set rollout.max_staleness=0"):
        relay_config(tiny_model_dir, rollout={"max_staleness": 1, "max_episode_tokens": 96})
    with pytest.raises(ConfigError, match=r"game.opponents and game.evaluate are for self-play"):
        relay_config(
            tiny_model_dir,
            game={"players": {"proposer": "proposer", "solver": "solver"}, "opponents": [{"kind": "self"}]},
        )


def test_agent_programs_call_policies_by_name_and_their_bad_settings_are_refused(tiny_model_dir):
    agent = {"agent": {"command": "python agent.py"}, "game": None}
    config = relay_config(tiny_model_dir, **agent)
    assert config.agent.enabled and config.game is None and list(config.policies) == ["proposer", "solver"]
    with pytest.raises(ConfigError, match=r"with agent: the agent program calls each policy by its name .*"):
        relay_config(tiny_model_dir, agent={"command": "python agent.py"})
    with pytest.raises(ConfigError, match=r"agent.model_name='learner': .*own name \(proposer, solver\); remove"):
        relay_config(tiny_model_dir, **{**agent, "agent": {"command": "python agent.py", "model_name": "learner"}})
    saved = config.model_dump(mode="json")  # run_dir/config.yaml, with agent.model_name's default written out
    assert from_dict({**saved, "agent": {**saved["agent"], "model_name": "policy"}}).agent.enabled
    gigpo = {"proposer": {}, "solver": {"algorithm": {"name": "gigpo"}}}
    with pytest.raises(ConfigError, match=r"policies.solver: algorithm gigpo needs env episodes turn by turn"):
        relay_config(tiny_model_dir, **agent, policies=gigpo)
    with pytest.raises(ConfigError, match=r"cannot run with env.reward_fn or reward: .*post each policy's reward"):
        relay_config(tiny_model_dir, **agent, env={"id": "relay", "reward_fn": "tests.unit.reward_fns:exact_answer"})
    with pytest.raises(ConfigError, match=r"layout.env=1: a multi-policy job's agent programs run on its rollout"):
        relay_config(tiny_model_dir, **agent, layout={"trainer": 2, "rollout": 1, "env": 1})


# --- one game ---------------------------------------------------------------------------------------------------


class ConstantEngine(Engine):
    """Always answers `token` (a unit-test stand-in that tells two policies' turns apart)."""

    def __init__(self, token: int, version: int):
        self.token, self.version, self.calls = token, version, 0

    async def generate(self, input_ids, sampling):
        from agentrl.engine.base import GenerateOutput

        self.calls += 1
        return GenerateOutput(np.array([self.token]), np.array([-0.25], np.float32), "length", self.version)

    def load_weights(self, named_tensors, version):
        raise NotImplementedError


def digit_token(tokenizer, digit: str) -> int:
    (token,) = tokenizer.encode(digit, add_special_tokens=False)
    return token


def test_each_turn_is_generated_by_its_players_policy_and_kept_in_its_episode(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    chat = ChatFormat(tokenizer)
    one, two = ConstantEngine(digit_token(tokenizer, "1"), 7), ConstantEngine(digit_token(tokenizer, "2"), 9)
    seats = {
        "0": Seat("0", "a", "a", True, one, chat, _sampling(chat), episode=Episode(group=0, task_seed=0)),
        "1": Seat("1", "b", "b", True, two, chat, _sampling(chat), episode=Episode(group=1, task_seed=0)),
    }
    env = LocalEnvClient(EnvHost("nim", {"low": 7, "high": 7}))
    result = asyncio.run(run_game(env, seats, EpisodeLimits(6, 1, 200), (0, 0), 0, "nim"))
    # 7 stones: 0 takes 1 (6), 1 takes 2 (4), 0 takes 1 (3), 1 takes 2 (1), 0 takes the last
    assert (one.calls, two.calls) == (3, 2)
    assert result.winner == "0" and result.rewards == {"0": 1.0, "1": -1.0}
    for seat, engine, turns in ((seats["0"], one, 3), (seats["1"], two, 2)):
        episode = seat.episode
        generated = [t for t, m in zip(episode.tokens, episode.loss_mask, strict=True) if m]
        assert generated == [engine.token] * turns  # every trained token came from this seat's own engine
        assert episode.turns == turns and len(episode.turn_spans) == turns
        assert {v for v, m in zip(episode.token_versions, episode.loss_mask, strict=True) if m} == {engine.version}
    assert seats["0"].episode.reward == 1.0 and seats["0"].episode.success
    assert seats["1"].episode.reward == -1.0 and not seats["1"].episode.success
    assert seats["1"].episode.text.startswith("other took 1, take 1-3, 6 left")  # what 1 saw first: 0's move
    observation = chat.observation_ids("other took 1, take 1-3, 3 left")  # and later, after its own turn
    tokens, mask = seats["1"].episode.tokens, seats["1"].episode.loss_mask
    at = next(i for i in range(len(tokens)) if tokens[i : i + len(observation)] == observation)
    assert not any(mask[at : at + len(observation)])


def _sampling(chat):
    from agentrl.engine.base import SamplingParams

    return SamplingParams(max_new_tokens=1, temperature=1.0, stop_token_ids=chat.stop_ids)


class ThirdPlayerEnv(TextEnv):
    """Names a player the game does not seat."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "go", {"player": "0"}

    def step(self, action):
        return "your turn", 0.0, False, False, {"player": "2"}


def test_an_env_naming_an_unknown_player_is_one_line_naming_the_fix(tiny_model_dir):
    chat = ChatFormat(load_tokenizer(tiny_model_dir))
    seat = Seat("0", "a", program=lambda observation, rng: "1", rng=random.Random(0))
    env = LocalEnvClient(EnvHost("tests.unit.test_policies:ThirdPlayerEnv", {}))
    with pytest.raises(UnknownPlayer) as raised:
        asyncio.run(run_game(env, {"0": seat, "1": seat}, EpisodeLimits(3, 1, 64), (0, 0), 0, "third"))
    message = str(raised.value)
    assert "\n" not in message and "named player '2'" in message and "add game.players.2: POLICY" in message
    del chat


# --- a rollout rank's games -------------------------------------------------------------------------------------


class RecordingEngine(Engine):
    def __init__(self, inner):
        self.inner, self.outputs = inner, []

    @property
    def weight_version(self):
        return self.inner.weight_version

    async def generate(self, input_ids, sampling):
        output = await self.inner.generate(input_ids, sampling)
        self.outputs.append((list(input_ids), list(output.output_ids)))
        return output

    def load_weights(self, named_tensors, version):
        self.inner.load_weights(named_tensors, version)


def test_each_policys_batch_holds_its_own_turns_rewards_and_advantages(tiny_model_dir):
    config = relay_config(tiny_model_dir)
    worker = MultiPolicyWorker(config, LocalEnvClient(EnvHost("relay", config.env.kwargs)), 0, 1, "cpu")
    recorders = {name: RecordingEngine(engine) for name, engine in worker.engines.items()}
    worker.engines.update(recorders)
    by_policy, stats, games = worker.collect(0)
    assert set(by_policy) == {"proposer", "solver"} and games == []
    assert len(by_policy["proposer"]) == len(by_policy["solver"]) == 8  # 2 tasks x 4 games, one seat each
    for name, episodes in by_policy.items():
        served = recorders[name].outputs
        for episode in episodes:
            start, end = episode.turn_spans[0]
            prompt, generated = episode.tokens[:start], episode.tokens[start:end]
            assert (prompt, generated) in served, f"{name}'s turn was not generated by {name}'s engine"
            other = recorders["solver" if name == "proposer" else "proposer"].outputs
            assert (prompt, generated) not in other
    metrics = game_metrics(stats)
    for name in ("proposer", "solver"):
        batch = pack(by_policy[name])
        assert float(np.mean(batch["reward"])) == pytest.approx(metrics[f"game/reward_mean/{name}"], abs=1e-6)
        algorithm = algorithm_of(policy_view(config, name))(lambda array: array)
        valid = np.ones(len(batch["reward"]), dtype=bool)
        advantages = algorithm.advantages(batch, valid)
        for index, episode in enumerate(by_policy[name]):
            group = [e.reward for e in by_policy[name] if e.group == episode.group]
            expected = episode.reward - (sum(group) - episode.reward) / (len(group) - 1)
            span = slice(batch["offsets"][index], batch["offsets"][index + 1])
            trained = batch["loss_mask"][span].astype(bool)
            assert np.allclose(advantages[span][trained], expected, atol=1e-5)
    for name in ("proposer", "solver"):  # a seat's success is its own (relay names each player's in info["successes"])
        assert all(e.success == (e.reward == 1.0) for e in by_policy[name])
    # the proposer's group ids and the solver's differ by seat: each policy's baseline is over its own seat
    assert {e.group % 2 for e in by_policy["proposer"]} == {0} and {e.group % 2 for e in by_policy["solver"]} == {1}


def test_self_play_games_against_the_pool_and_programs_train_only_the_learner(tiny_model_dir, tmp_path):
    config = nim_config(tiny_model_dir, run_dir=str(tmp_path / "run"))
    worker = MultiPolicyWorker(config, LocalEnvClient(EnvHost("nim", config.env.kwargs)), 0, 1, "cpu")
    weights = list(worker.engines["nim"].model.named_parameters())
    worker.weights_taken("nim", 0)
    assert sorted(worker.pool.snapshots) == [0]
    assert (tmp_path / "run" / "policies" / "nim" / "pool" / "step_000000.pt").is_file()
    by_policy, stats, games = worker.collect(0)
    metrics = game_metrics(stats)
    vs = {label: metrics[f"game/games_vs/{label}"] for label in ("self", "step_000000", "take_one")}
    assert sum(vs.values()) == 12 and all(count > 0 for count in vs.values())
    assert sorted(label for label, _ in games) == sorted(
        [label for label in vs for _ in range(int(vs[label])) if label != "self"]
    )
    # a game against itself gives two trained episodes (when both seats moved), any other game at most one
    assert len(by_policy["nim"]) <= 2 * vs["self"] + vs["step_000000"] + vs["take_one"]
    assert all(e.turns > 0 for e in by_policy["nim"])
    del weights


# --- the opponent pool and Elo ----------------------------------------------------------------------------------


def test_pool_sampling_follows_its_rule(tmp_path):
    assert np.allclose(pool_weights([0, 10, 20], "uniform", 0.5), [1 / 3] * 3)
    assert np.allclose(pool_weights([0, 10, 20], "recent", 0.5), np.array([0.25, 0.5, 1.0]) / 1.75)
    pool = OpponentPool(size=3, every=10, sampling="recent", decay=0.5, folder=tmp_path, saves=True)
    for version in (0, 10, 20, 30):
        assert pool.due(version)
        pool.take(version, [("w", np.full(2, version, dtype=np.float32) * 1.0)] and _tensors(version))
    assert sorted(pool.snapshots) == [10, 20, 30]  # the newest 3
    rng = np.random.default_rng(0)
    draws = np.array([pool.draw(rng) for _ in range(7000)])
    shares = [np.mean(draws == version) for version in (10, 20, 30)]
    assert np.allclose(shares, np.array([1, 2, 4]) / 7, atol=0.02)
    assert not pool.due(35) and not pool.due(30)


def _tensors(version):
    import torch

    return [("w", torch.full((2,), float(version)))]


def test_pool_restores_from_its_folder_and_names_a_missing_snapshot(tmp_path):
    from agentrl.errors import UserError

    first = OpponentPool(size=2, every=5, sampling="uniform", decay=0.5, folder=tmp_path, saves=True)
    for version in (0, 5, 10, 15):
        first.take(version, _tensors(version))
    resumed = OpponentPool(size=2, every=5, sampling="uniform", decay=0.5, folder=tmp_path, saves=False)
    assert resumed.restore(15) == [5, 10]  # version 15 itself comes with the resumed run's first weights
    assert float(resumed.snapshots[10]["w"][0]) == 10.0
    (tmp_path / "step_000005.pt").unlink()
    with pytest.raises(UserError, match=r"snapshot\(s\) \[5\] are missing"):
        OpponentPool(size=2, every=5, sampling="uniform", decay=0.5, folder=tmp_path, saves=False).restore(15)


def test_opponents_are_drawn_by_weight_and_the_same_after_a_resume():
    from agentrl.config.schema import OpponentConfig

    opponents = [OpponentConfig(kind="self", weight=3), OpponentConfig(kind="pool", weight=1)]
    draws = [draw_opponent(opponents, game_rng(0, step, game, 0)).kind for step in range(50) for game in range(40)]
    assert abs(draws.count("self") / len(draws) - 0.75) < 0.03
    again = [draw_opponent(opponents, game_rng(0, step, game, 0)).kind for step in range(50) for game in range(40)]
    assert draws == again


def test_elo_moves_with_results_and_survives_a_checkpoint(tmp_path):
    ratings = EloRatings()
    ratings.add_snapshot(0)
    for _ in range(20):
        ratings.record("step_000000", 1.0)
    assert ratings.ratings[LEARNER] > 1100 > 900 > ratings.ratings["step_000000"]
    ratings.add_snapshot(10)  # enters at the learner's rating
    assert ratings.ratings["step_000010"] == ratings.ratings[LEARNER]
    ratings.record("random", 0.0)
    ratings.save(tmp_path)
    loaded = EloRatings()
    loaded.load(tmp_path)
    assert loaded.ratings == ratings.ratings


def test_the_printed_plan_shows_each_policys_weight_sync(tiny_model_dir):
    from agentrl.run.plan import JobShape, config_plan

    rows = config_plan(relay_config(tiny_model_dir), JobShape(3))
    assert [row.weights for row in rows] == ["mpi send proposer", "mpi send solver", "mpi recv proposer, solver"]
