"""An agent session's calls become training samples: merged when each prompt extends the last call token for
token, split otherwise; split samples count once in the group's statistics and the episode metrics."""

import numpy as np

from agentrl.algorithms import make_algorithm
from agentrl.algorithms.advantages import group_advantages, local_sum
from agentrl.algorithms.base import AlgorithmContext
from agentrl.config import from_dict
from agentrl.gateway.trace import SessionCall, samples_from_calls
from agentrl.metrics import episode_sums
from agentrl.trajectory import Episode, pack


def call(prompt, output, version=3):
    return SessionCall(list(prompt), list(output), [-0.5] * len(output), version)


def test_a_prompt_that_extends_the_last_call_continues_its_sample():
    first = call([1, 2, 3], [10, 11, 2])
    second = call([1, 2, 3, 10, 11, 2, 7, 8], [12, 2], version=4)
    (sample,) = samples_from_calls([first, second])
    assert sample.tokens == [1, 2, 3, 10, 11, 2, 7, 8, 12, 2]
    assert sample.loss_mask == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert sample.prompt_len == 3
    assert sample.turn_spans == [(3, 6), (8, 10)]
    assert sample.token_versions == [-1, -1, -1, 3, 3, 3, -1, -1, 4, 4]
    assert sample.logprobs[3:6] == [-0.5] * 3 and sample.logprobs[6:8] == [0.0, 0.0]
    assert sample.calls == 2


def test_a_rewritten_history_starts_a_new_sample():
    first = call([1, 2, 3], [10, 11, 2])
    summarized = call([1, 5, 6], [12, 2])  # the agent replaced its history with a summary
    then = call([1, 5, 6, 12, 2, 9], [13, 2])
    samples = samples_from_calls([first, summarized, then])
    assert [s.tokens for s in samples] == [[1, 2, 3, 10, 11, 2], [1, 5, 6, 12, 2, 9, 13, 2]]
    assert [s.calls for s in samples] == [1, 2]


def test_a_prompt_that_differs_by_one_token_inside_the_completion_is_not_merged():
    first = call([1, 2, 3], [10, 11, 2])
    retokenized = call([1, 2, 3, 10, 99, 2, 7], [12, 2])  # the client re-tokenized the reply differently
    assert len(samples_from_calls([first, retokenized])) == 2


def test_interleaved_sub_agents_each_keep_their_own_sample():
    main_1 = call([1, 2], [10, 2])
    sub_1 = call([50, 51], [60, 2])
    main_2 = call([1, 2, 10, 2, 3], [11, 2])
    sub_2 = call([50, 51, 60, 2, 52], [61, 2])
    samples = samples_from_calls([main_1, sub_1, main_2, sub_2])
    assert [s.tokens for s in samples] == [[1, 2, 10, 2, 3, 11, 2], [50, 51, 60, 2, 52, 61, 2]]


def _session_rows(group, reward, samples, sample_tokens):
    rows = []
    for k in range(samples):
        episode = Episode(group=group, task_seed=0, reward=reward, success=reward > 0, turns=1, sample=k)
        episode.extend([1, 2], mask=0)
        episode.extend([3] * sample_tokens, mask=1)
        rows.append(episode)
    return rows


def test_an_episode_of_several_samples_counts_once_in_the_group_and_each_sample_takes_its_advantage():
    config = from_dict({"model": {"path": "unused"}, "algorithm": {"name": "grpo"}})
    algorithm = make_algorithm(config, AlgorithmContext(config=config, reduce=local_sum))
    # group 0: episode A (reward 1, 3 samples) and episode B (reward 0, 1 sample)
    rows = _session_rows(0, 1.0, 3, 2) + _session_rows(0, 0.0, 1, 2)
    batch = pack(rows)
    valid = np.ones(len(rows), dtype=bool)
    advantages = algorithm.advantages(batch, valid)
    expected = group_advantages(np.array([1.0, 0.0]), np.array([0, 0]), np.array([True, True]))
    per_row = np.repeat(expected, [3, 1])
    assert np.allclose(advantages, np.repeat(per_row, np.diff(batch["offsets"])))
    sums = episode_sums(batch, version=0)
    assert sums["count"] == 2 and sums["reward"] == 1.0 and sums["success"] == 1.0
    assert sums["tokens"] == 4 * 4  # every sample's tokens count
    assert sums["groups"] == 1 and sums["zero_signal_groups"] == 0
