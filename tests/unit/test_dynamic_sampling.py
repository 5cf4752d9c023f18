"""Dynamic sampling in the rollout worker: the algorithm's keep_group drops groups, extra rounds of fresh
tasks refill the share, seeds never repeat, and the stats count it all."""

import numpy as np
import pytest

from agentrl.config import from_dict
from agentrl.data.tasks import task_seed
from agentrl.engine.base import Engine, GenerateOutput
from agentrl.env.api import TextEnv
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.metrics import merge_stats
from agentrl.roles.rollout_parts import rollout_worker
from agentrl.rollout.trainer_messages import shard_for_trainers
from agentrl.rollout.worker import RolloutWorker

SHARE = 4  # tasks per rollout rank: tasks_per_step 8 over 2 rollout ranks
GROUP = 4
SEED = 0  # the run seed of worker()'s config


class AlternatingEngine(Engine):
    """Answers "0", "1", "0", ... in call order: the episodes of one group get different answers."""

    def __init__(self, zero: int, one: int, stop: int):
        self.ids, self.stop, self.calls = (zero, one), stop, 0

    async def generate(self, input_ids, sampling):
        token = self.ids[self.calls % 2]
        self.calls += 1
        return GenerateOutput(np.array([token, self.stop]), np.full(2, -0.7, np.float32), "stop", weight_version=0)

    def load_weights(self, named_tensors, version):
        raise NotImplementedError


class SignalEnv(TextEnv):
    """One turn. Tasks with an odd seed pay 1 for answering "1" (signal); even seeds pay `flat` to all (none)."""

    def __init__(self, flat: float = 0.0, signal: bool = True):
        super().__init__()
        self.flat, self.signal = flat, signal

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed = seed
        return "Say 0 or 1.", {}

    def step(self, action):
        reward = float("1" in action) if self.signal and self.seed % 2 else self.flat
        return "ok", reward, True, False, {"success": reward > 0}


def worker(model_dir, algorithm: dict, index: int = 0, **env) -> RolloutWorker:
    config = from_dict(
        {
            "seed": SEED,
            "model": {"path": str(model_dir)},
            "layout": {"trainer": 2, "rollout": 2, "env": 0},
            "rollout": {"tasks_per_step": 2 * SHARE, "group_size": GROUP, "max_new_tokens": 2, "max_turns": 1},
            "algorithm": algorithm,
        }
    )
    host = EnvHost("signal", factory=lambda _id, **kw: SignalEnv(**env), call_timeout_s=None)
    made = rollout_worker(config, LocalEnvClient(host), index, 2)
    tokenizer = made.chat.tokenizer
    zero, one = (tokenizer(digit, add_special_tokens=False)["input_ids"][0] for digit in "01")
    made.engine = AlternatingEngine(zero, one, made.chat.eos_id)
    return made


def groups_of(episodes):
    out = {}
    for e in episodes:
        out.setdefault(e.group, []).append(e)
    return out


@pytest.fixture(scope="module")
def dapo_runs(tiny_model_dir):
    """Steps 0..2 of both rollout ranks under DAPO: (episodes, stats) per (rank, step)."""
    runs = {}
    for index in range(2):
        w = worker(tiny_model_dir, {"name": "dapo", "max_extra_rounds": 3}, index)
        for step in range(3):
            runs[index, step] = w.collect(step)
    return runs


def test_kept_groups_have_signal_and_fill_the_share(dapo_runs):
    for (index, step), (episodes, stats) in dapo_runs.items():
        groups = groups_of(episodes)
        for members in groups.values():
            assert len(members) == GROUP
            assert len({e.reward for e in members}) > 1, (index, step)  # never a zero-signal group
            assert len({e.task_seed for e in members}) == 1
        assert len(groups) + stats["rollout/groups_short"] == SHARE
        assert stats["rollout/generated_groups"] == (
            len(groups) + stats["rollout/dropped_groups"] + stats["rollout/surplus_groups"]
        )
        assert 0 <= stats["rollout/extra_rounds"] <= 3
        assert (stats["rollout/extra_rounds"] > 0) == (stats["rollout/dropped_groups"] > 0)
        odd = [task_seed(0, step, task) % 2 for task in range(index * SHARE, (index + 1) * SHARE)]
        assert stats["rollout/success_rate"] == np.mean(odd) / 2  # first round: half of each odd group says "1"
    total_dropped = sum(stats["rollout/dropped_groups"] for _, stats in dapo_runs.values())
    assert total_dropped > 0  # about half the seeds are even: the test exercised the refill


def test_extra_tasks_have_fresh_seeds_and_group_ids(dapo_runs):
    seeds = {}
    for (index, step), (episodes, _) in dapo_runs.items():
        for group, members in groups_of(episodes).items():
            # Round 0 indices [index*SHARE, (index+1)*SHARE), round r the same slice shifted by r x tasks_per_step.
            assert (group % (2 * SHARE)) // SHARE == index
            seeds.setdefault(members[0].task_seed, set()).add((index, step, group))
    assert all(len(uses) == 1 for uses in seeds.values())  # no (rank, step, task) repeats a seed


def test_a_share_still_short_is_sent_as_it_is(tiny_model_dir):
    w = worker(tiny_model_dir, {"name": "dapo", "max_extra_rounds": 2}, flat=0.5, signal=False)
    episodes, stats = w.collect(0)
    assert episodes == []  # nothing had signal: an empty share (the trainers handle empty shards)
    assert stats["rollout/groups_short"] == SHARE and stats["rollout/extra_rounds"] == 2
    assert stats["rollout/generated_groups"] == stats["rollout/dropped_groups"] == 3 * SHARE  # whole share each round


def test_grpo_keeps_every_group_in_one_round(tiny_model_dir):
    w = worker(tiny_model_dir, {"name": "grpo"})
    episodes, stats = w.collect(5)
    assert sorted(groups_of(episodes)) == list(range(SHARE))
    assert [e.task_seed for e in episodes[::GROUP]] == [w_seed(5, task) for task in range(SHARE)]
    zeros = ("generated_groups", "dropped_groups", "extra_rounds", "groups_short", "surplus_groups")
    assert [stats[f"rollout/{k}"] for k in zeros] == [SHARE, 0, 0, 0, 0]


def w_seed(step, task):
    return task_seed(SEED, step, task)


def test_counts_are_summed_and_times_maxed_over_rollout_ranks():
    merged = merge_stats(
        [
            {"time/rollout": 2.0, "rollout/dropped_groups": 3.0, "rollout/extra_rounds": 1.0},
            {"time/rollout": 5.0, "rollout/dropped_groups": 4.0, "rollout/extra_rounds": 2.0},
        ]
    )
    assert merged == {"time/rollout": 5.0, "rollout/dropped_groups": 7.0, "rollout/extra_rounds": 2.0}
    rates = merge_stats([{"rollout/success_rate": 0.25, "rollout/reward_mean": 1.0}, {"rollout/success_rate": 0.75}])
    assert rates == {"rollout/success_rate": 0.5, "rollout/reward_mean": 1.0}


def test_uneven_shards_rotate_the_larger_chunks_and_may_be_empty(tiny_model_dir):
    from agentrl.trajectory import Episode

    episodes = [Episode(group=g, task_seed=g) for g in (3, 9, 17) for _ in range(2)]
    sizes = [[len({e.group for e in s}) for s in shard_for_trainers(episodes, 2, rotate)] for rotate in range(2)]
    assert sizes == [[2, 1], [1, 2]]
    one = episodes[:2]
    assert [len(s) for s in shard_for_trainers(one, 2, 0)] == [2, 0]
    assert [len(s) for s in shard_for_trainers(one, 2, 1)] == [0, 2]
    assert [len(s) for s in shard_for_trainers([], 2, 1)] == [0, 0]


def test_shards_balance_what_the_groups_cost_to_train(tiny_model_dir):
    from agentrl.trajectory import Episode

    def group(g, lengths, shared=0):
        return [Episode(group=g, task_seed=g, tokens=[1] * shared + [g + 2 + i] * (n - shared)) for i, n in
                enumerate(lengths)]  # fmt: skip

    # in order, contiguous halves would give one trainer groups 0 and 1 (200 tokens) and the other 2 and 3 (20)
    episodes = [*group(0, [50, 50]), *group(1, [50, 50]), *group(2, [5, 5]), *group(3, [5, 5])]
    shards = shard_for_trainers(episodes, 2)
    assert sorted(sum(len(e.tokens) for e in shard) for shard in shards) == [110, 110]
    assert [len({e.group for e in shard}) for shard in shards] == [2, 2]
    assert all(shard == [e for e in episodes if e in shard] for shard in shards)  # each in the order they came
    # with the shared prefix, a group costs its distinct prefixes: group 4's rows repeat a 90-token prefix (300 tokens,
    # 120 distinct), group 5's share nothing (200); by tokens 4 is the costliest, by the tree 5 is
    episodes = [*group(4, [100, 100, 100], shared=90), *group(5, [100, 100]), *group(6, [30, 30]), *group(7, [10, 10])]
    for shared_prefix, partner in ((False, 7), (True, 6)):
        shards = shard_for_trainers(episodes, 2, shared_prefix=shared_prefix)
        assert {e.group for e in next(shard for shard in shards if shard[0].group == 4)} == {4, partner}


def test_trainers_count_groups_without_signal():
    from agentrl.metrics import episode_metrics, episode_sums
    from agentrl.trajectory import Episode, pack

    def e(group, reward, finish="terminated"):
        made = Episode(group=group, task_seed=0, reward=reward, finish=finish)
        made.extend([1, 2], mask=1)
        return made

    batch = pack([e(0, 1.0), e(0, 0.0), e(1, 0.5), e(1, 0.5), e(2, 1.0), e(2, 0.0, finish="error"), e(7, 0.2)])
    metrics = episode_metrics(episode_sums(batch, version=0))
    assert metrics["episode/groups"] == 4  # 0 has signal; 1 all equal; 2 and 7 have one valid episode
    assert metrics["episode/zero_signal_groups"] == 3
    assert episode_sums(pack([]), version=0)["groups"] == 0


def test_a_batch_without_episodes_logs_counts_not_means():
    """Every group dropped: the counts are logged, and no mean (success 0 would read as a collapse)."""
    from agentrl.metrics import episode_metrics, episode_sums
    from agentrl.trajectory import pack

    metrics = episode_metrics({**episode_sums(pack([]), version=0), "tool_calls": 0.0, "tool_errors": 0.0})
    assert metrics["episode/count"] == 0 and metrics["episode/groups"] == 0
    assert not {"episode/success_rate", "episode/reward_mean", "episode/tool_error_rate"} & set(metrics)
    assert not any(name.startswith("episode/finish_") for name in metrics)
