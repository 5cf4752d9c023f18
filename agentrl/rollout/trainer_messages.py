"""What a rollout rank ships to the trainer ranks after a step: each trainer's shard of whole groups, the
stats, and for the trainer leader the data position, episode records and sample texts."""

from __future__ import annotations

from agentrl.rollout.failures import FailureTally
from agentrl.trajectory import Episode, pack, trained_totals


def shard_for_trainers(
    episodes: list[Episode], trainers: int, rotate: int = 0, shared_prefix: bool = False
) -> list[list[Episode]]:
    """Split whole groups over trainer ranks, as many to each as the others give or take one, balancing what they
    cost to train: the rows' tokens, or with `shared_prefix` (trainer.shared_prefix) the distinct prefixes of the
    group's rows (a token tree's nodes), which is what the trainer forwards. The costliest group goes first, each
    to the trainer with the least cost so far that still takes groups (verl balances its data-parallel ranks'
    sequence lengths alike): data-parallel trainers wait for the slowest at every gradient sum.

    When the groups do not divide evenly (dynamic sampling left a share short), the extra groups go to trainers
    `rotate`, `rotate + 1`, ... (mod trainers): each rollout rank passes its own index, so the remainders of
    several rollout ranks land on different trainers. A trainer may get no group at all (an empty shard); the
    trainer still joins every collective.
    """
    by_group: dict[int, list[Episode]] = {}
    for episode in episodes:
        by_group.setdefault(episode.group, []).append(episode)
    base, extra = divmod(len(by_group), trainers)
    order = [(rotate + k) % trainers for k in range(trainers)]  # who takes the extra groups, and wins ties
    room = {trainer: base + (k < extra) for k, trainer in enumerate(order)}
    load = dict.fromkeys(order, 0)
    cost = {group: _training_cost(rows, shared_prefix) for group, rows in by_group.items()}
    owner = {}
    for group in sorted(by_group, key=lambda group: (-cost[group], group)):
        owner[group] = min((t for t in order if room[t]), key=lambda t: load[t])
        room[owner[group]] -= 1
        load[owner[group]] += cost[group]
    shards: list[list[Episode]] = [[] for _ in range(trainers)]
    for episode in episodes:  # in the order they came
        shards[owner[episode.group]].append(episode)
    return shards


def _training_cost(episodes: list[Episode], shared_prefix: bool) -> int:
    """Tokens a trainer forwards for a group's rows (each episode's further samples are rows too)."""
    rows = [e.tokens for episode in episodes for e in (episode, *episode.more_samples)]
    if not shared_prefix:
        return sum(len(row) for row in rows)
    nodes, previous = 0, []
    for row in sorted(rows):  # a row shares the most with its neighbour in sorted order
        shared = next((i for i, (a, b) in enumerate(zip(previous, row, strict=False)) if a != b), len(previous))
        nodes += len(row) - shared
        previous = row
    return nodes


def batch_messages(config, worker, index: int, trainers: int, step: int, episodes, stats):
    """(trainer index, message) for each trainer rank: its shard of the step's groups, the stats, the trained
    totals of every shard this rank sends (`step_trained`: summed over the rollout ranks, the step's loss
    denominators), and for the first trainer (the leader) this rank's data position and, with
    rollout.dump_episodes, the episode records; rollout rank 0 adds sample texts for TensorBoard."""
    failures = FailureTally.of(episodes)  # of the whole step on this rank: the trainer leader judges the step
    shards = shard_for_trainers(episodes, trainers, index, config.trainer.shared_prefix)
    packed = [pack(shard) for shard in shards]
    step_trained = sum(trained_totals(batch) for batch in packed)
    for trainer_index, (shard, batch) in enumerate(zip(shards, packed, strict=True)):
        samples = sample_texts(config, step, shard) if trainer_index == 0 and index == 0 else []
        message = {
            "batch": batch,
            "step_trained": step_trained,
            "stats": stats,
            "samples": samples,
            "failures": failures,
        }
        if trainer_index == 0 and (index == 0 or config.rollout.dispatch == "static"):
            message["data_position"] = worker.task_source.position()  # dynamic dispatch: one queue, one position
        if trainer_index == 0:
            message["episodes"] = worker.episode_records(step) if config.rollout.dump_episodes else []
        yield trainer_index, message


def sample_texts(config, step: int, episodes: list[Episode]) -> list[str]:
    """A few whole episodes as text for TensorBoard, every `logging.sample_every` steps."""
    every = config.logging.sample_every
    if not every or step % every:
        return []
    return [
        f"reward={e.reward:.2f} turns={e.turns} finish={e.finish} version={e.weight_version}\n{e.text}"
        for e in episodes[: config.logging.num_samples]
    ]
