"""What a rollout rank ships to the trainer ranks after a step: each trainer's shard of whole groups, the
stats, and for the trainer leader the data position, episode records and sample texts."""

from __future__ import annotations

import numpy as np

from agentrl.rollout.failures import FailureTally
from agentrl.trajectory import Episode, pack


def shard_for_trainers(episodes: list[Episode], trainers: int, rotate: int = 0) -> list[list[Episode]]:
    """Split whole groups over trainer ranks in contiguous chunks of sizes that differ by at most one.

    When the groups do not divide evenly (dynamic sampling left a share short), the larger chunks
    go to trainers `rotate`, `rotate + 1`, ... (mod trainers): each rollout rank passes its own
    index, so the remainders of several rollout ranks land on different trainers. A trainer may
    get no group at all (an empty shard); the trainer still joins every collective.
    """
    groups = sorted({e.group for e in episodes})
    base, extra = divmod(len(groups), trainers)
    sizes = [base + ((index - rotate) % trainers < extra) for index in range(trainers)]
    bounds = np.cumsum([0, *sizes])
    owner = {group: index for index in range(trainers) for group in groups[bounds[index] : bounds[index + 1]]}
    shards: list[list[Episode]] = [[] for _ in range(trainers)]
    for episode in episodes:
        shards[owner[episode.group]].append(episode)
    return shards


def batch_messages(config, worker, index: int, trainers: int, step: int, episodes, stats):
    """(trainer index, message) for each trainer rank: its shard of the step's groups, the stats, and for
    the first trainer (the leader) this rank's data position and, with rollout.dump_episodes, the episode
    records; rollout rank 0 adds sample texts for TensorBoard."""
    failures = FailureTally.of(episodes)  # of the whole step on this rank: the trainer leader judges the step
    for trainer_index, shard in enumerate(shard_for_trainers(episodes, trainers, index)):
        samples = sample_texts(config, step, shard) if trainer_index == 0 and index == 0 else []
        message = {"batch": pack(shard), "stats": stats, "samples": samples, "failures": failures}
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
