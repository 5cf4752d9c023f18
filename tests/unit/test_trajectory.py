import numpy as np

from agentrl.data.tasks import task_seed
from agentrl.metrics import episode_metrics, episode_sums
from agentrl.rollout.trainer_messages import shard_for_trainers
from agentrl.trajectory import Episode, concat, num_episodes, pack


def episode(group, tokens, mask, reward=0.0, finish="terminated", version=3):
    e = Episode(group=group, task_seed=0, reward=reward, finish=finish, weight_version=version, turns=1)
    e.tokens, e.loss_mask, e.logprobs = list(tokens), list(mask), [-0.5] * len(tokens)
    return e


def test_pack_and_concat_keep_boundaries():
    a = pack([episode(0, [1, 2, 3], [0, 1, 1]), episode(0, [4, 5], [0, 1])])
    b = pack([episode(1, [6], [0])])
    both = concat([a, b])
    assert num_episodes(both) == 3
    assert both["offsets"].tolist() == [0, 3, 5, 6]
    assert both["tokens"].tolist() == [1, 2, 3, 4, 5, 6]
    assert both["tokens"].dtype == np.int64 and both["loss_mask"].dtype == np.uint8
    assert both["group"].tolist() == [0, 0, 1]


def test_turns_and_metrics_survive_pack_and_concat():
    first = episode(0, [1, 2, 3, 4, 5], [0, 1, 0, 1, 1])
    first.turn_spans, first.turn_rewards, first.turn_states = [(1, 2), (3, 5)], [0.0, 1.0], [11, 12]
    first.add_metrics({"hits": 2})
    second = episode(1, [6, 7], [0, 1])
    second.turn_spans, second.turn_rewards, second.turn_states = [(1, 2)], [0.5], [13]
    second.add_metrics({"misses": 1})
    both = concat([pack([first]), pack([second])])
    assert both["turn_episode"].tolist() == [0, 0, 1]
    assert both["turn_start"].tolist() == [1, 3, 6] and both["turn_end"].tolist() == [2, 5, 7]
    assert both["turn_reward"].tolist() == [0.0, 1.0, 0.5] and both["turn_state"].tolist() == [11, 12, 13]
    assert both["metric/hits"].tolist() == [2, 0] and both["metric/misses"].tolist() == [0, 1]
    assert both["loss_mask"][both["turn_start"][1] : both["turn_end"][1]].tolist() == [1, 1]


def test_env_metrics_become_episode_means_by_name():
    a, b = episode(0, [1, 2], [0, 1]), episode(0, [1, 2], [0, 1])
    a.add_metrics({"hits": 3})
    metrics = episode_metrics(episode_sums(pack([a, b]), version=3))
    assert metrics["episode/hits_mean"] == 1.5 and "episode/tool_error_rate" not in metrics


def test_shards_keep_groups_whole_and_balanced():
    episodes = [episode(g, [1], [0]) for g in range(4) for _ in range(2)]
    shards = shard_for_trainers(episodes, 2)
    groups = [{e.group for e in s} for s in shards]
    assert [len(g) for g in groups] == [2, 2] and groups[0] | groups[1] == {0, 1, 2, 3}
    assert all(len(s) == 4 for s in shards)  # whole groups: both episodes of each


def test_episode_metrics_count_everything():
    batch = pack(
        [
            episode(0, [1, 2, 3], [0, 1, 1], reward=1.0),
            episode(0, [1, 2], [0, 0], finish="error", version=1),
        ]
    )
    metrics = episode_metrics(episode_sums(batch, version=3))
    assert metrics["episode/count"] == 2
    assert metrics["episode/reward_mean"] == 0.5
    assert metrics["episode/failed"] == 1
    assert metrics["episode/response_tokens_mean"] == 1.0
    assert metrics["episode/weight_lag_mean"] == 1.0
    assert metrics["episode/finish_error"] == 0.5


def test_task_seeds_differ_by_step_and_task():
    seeds = {task_seed(0, step, task) for step in range(5) for task in range(5)}
    assert len(seeds) == 25
