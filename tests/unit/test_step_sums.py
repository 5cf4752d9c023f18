"""`PolicyTrainer.train_and_sum`: a training loop's numbers ride the sum of the step's statistics, and the loss's
denominators may come with the shards (`trajectory.trained_totals`, summed by the senders) instead of a sum over the
trainer ranks. Two ranks' sums: tests/mpi/scripts/replicas.py."""

from __future__ import annotations

import torch

from agentrl.trajectory import concat, trained_tokens, trained_totals
from tests.unit.test_nonfinite_updates import trainer_for
from tests.unit.test_parallel import synthetic_batch


def test_trained_totals_count_what_the_loss_takes_and_add_up_over_shards(tiny_model_dir):
    vocab = trainer_for(tiny_model_dir).model.config.vocab_size
    whole = synthetic_batch(vocab, 0)
    whole["loss_mask"][whole["offsets"][3] : whole["offsets"][4]] = 0  # an episode with nothing to train
    tokens = trained_tokens(whole)
    assert tokens.tolist() == [9, 9, 9, 0, 9, 9, 9, 9]  # the first token of an episode has no prediction
    assert trained_totals(whole).tolist() == [63.0, 7.0]
    parts = [synthetic_batch(vocab, seed) for seed in (1, 2)]
    assert (trained_totals(parts[0]) + trained_totals(parts[1])).tolist() == trained_totals(concat(parts)).tolist()


def test_given_totals_train_as_the_counted_ones_and_riders_come_back_summed(tiny_model_dir):
    torch.manual_seed(0)
    counted = trainer_for(tiny_model_dir)
    torch.manual_seed(0)
    given = trainer_for(tiny_model_dir)
    for seed in range(3):
        batch = synthetic_batch(counted.model.config.vocab_size, seed)
        want = counted.train_step(batch)
        got, totals = given.train_and_sum(batch, {"episodes": 8.0, "stop_vote": 0.0}, trained_totals(batch))
        assert got == want and totals == {"episodes": 8.0, "stop_vote": 0.0}
    for a, b in zip(counted.params, given.params, strict=True):
        assert torch.equal(a, b)


def test_the_given_totals_are_the_denominators(tiny_model_dir):
    torch.manual_seed(0)
    trainer = trainer_for(tiny_model_dir)
    batch = synthetic_batch(trainer.model.config.vocab_size, 0)
    right = trainer.train_and_sum(batch, {}, trained_totals(batch))[0]["train/grad_norm"]
    torch.manual_seed(0)
    trainer = trainer_for(tiny_model_dir)
    doubled = trainer.train_and_sum(batch, {}, 2 * trained_totals(batch))[0]["train/grad_norm"]
    assert abs(doubled - right / 2) < 1e-4 * right


def test_with_several_updates_a_step_each_minibatch_is_counted(tiny_model_dir):
    """The totals are the whole step's: a step of two updates counts each minibatch's own."""
    torch.manual_seed(0)
    counted = trainer_for(tiny_model_dir, updates_per_step=2)
    torch.manual_seed(0)
    given = trainer_for(tiny_model_dir, updates_per_step=2)
    batch = synthetic_batch(counted.model.config.vocab_size, 0)
    assert counted.train_step(batch) == given.train_and_sum(batch, {}, trained_totals(batch))[0]


def test_each_trainer_message_carries_the_rollout_ranks_whole_step_totals():
    """A rollout rank's messages to its trainer ranks each carry the totals of all the shards it sends: summed over
    the rollout ranks, every trainer rank holds the step's denominators."""
    from types import SimpleNamespace

    from agentrl.config import from_dict
    from agentrl.rollout.trainer_messages import batch_messages
    from agentrl.trajectory import Episode, pack

    episodes = []
    for group in range(3):  # three groups over two trainer ranks: shards of different sizes
        for copy in range(4):
            episode = Episode(group=group, task_seed=group)
            episode.extend([1, 2, 3], mask=0)
            episode.extend([4] * (copy + 1), mask=int(copy != 3 or group != 0))
            episodes.append(episode)
    worker = SimpleNamespace(task_source=SimpleNamespace(position=lambda: None), episode_records=lambda step: [])
    config = from_dict({"model": {"path": "unused"}})
    messages = [message for _, message in batch_messages(config, worker, 0, 2, 0, episodes, {})]
    whole = trained_totals(pack(episodes))
    assert whole.tolist() == [26.0, 11.0]  # 1+2+3+4 tokens a group, one episode of group 0 untrained
    assert len(messages) == 2 and all(m["step_trained"].tolist() == whole.tolist() for m in messages)
    assert sum(trained_totals(m["batch"]) for m in messages).tolist() == whole.tolist()
