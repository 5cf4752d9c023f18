"""The rollout role running ahead of the trainer: asynchronous rollouts with bounded staleness.

With rollout.max_staleness = K a rollout rank starts step s's episodes once it holds weights of
version s - K or newer (admission control), so it generates while the trainer trains, at most K
steps ahead; the trainer, about to train step s on weights of version s, gets episodes at most K
versions old. With rollout.partial_rollouts, versions published meanwhile reach the episodes in
flight between engine batches, at their next turn; every token records the version that made it.

A batch is sent without waiting for the trainer to take it (at most one batch in flight per
rank). Evaluation steps are sync points: they run on exactly the weights of their step.

Stops lose nothing and repeat nothing: the trainer announces the stop instead of a version; a
rank cancels the episodes in flight, lets the trainers take (and discard) any batch it had sent
ahead, and says it ended. The checkpoint holds the data position of the last trained step, so a
resumed run generates the discarded steps' tasks again, the same tasks, from the resumed weights.
"""

from __future__ import annotations

from agentrl import preempt, transport
from agentrl.rollout.agent_loop import Stopped
from agentrl.rollout.shipping import batch_messages
from agentrl.transport import Tag
from agentrl.weights.announce import WeightWatcher

END_OF_BATCHES = {"end": True}  # after a stop: this rollout rank sends no more batches


def run_ahead(config, layout, start_step: int, worker, evaluator, weight_sync) -> None:
    index = layout.rollout_ranks.index(layout.rank)
    ahead = config.rollout.max_staleness
    watcher = WeightWatcher(weight_sync, worker.engine, layout.world, layout.trainer_ranks[0])
    if config.rollout.partial_rollouts and worker.engine.event_loop is None:
        worker.between_batches = watcher.poll
    elif worker.dispatch is not None and worker.engine.event_loop is None:
        # Whole episodes on one version, tasks from one queue: a rank takes new weights mid-step while none of its
        # groups runs. Taking them only between steps hung: a rank in the weight handoff waited for rank 0, which
        # served a step that waited for that rank's verdicts.
        worker.between_batches = worker.when_idle(watcher.poll)
    elif config.rollout.partial_rollouts and index == 0:  # SGLang updates weights by running its own loop
        print(f"agentrl: {type(worker.engine).__name__} takes new weights between steps only", flush=True)
    in_flight: list = []  # the last batch's sends: complete before the next batch is sent
    watcher.wait_for(start_step)
    for step in range(start_step, config.steps + 1):
        if evaluator is not None and config.eval.due(step):
            from agentrl.evaluation.report import send_results

            if not watcher.wait_for(step):
                break
            send_results(layout, step, evaluator.run(step, config.eval.dump_episodes))
        if step == config.steps or not watcher.wait_for(step - ahead):
            break
        try:
            episodes, stats = worker.collect(step)
        except Stopped:
            break
        stats["time/rollout_idle"], watcher.idle_s = watcher.idle_s, 0.0
        preempt.forward(layout.world, layout.trainer_ranks[0])  # before the batch, so it is seen at this step's end
        if not watcher.wait_sent(in_flight):
            break
        in_flight = [
            transport.isend(layout.world, message, layout.trainer_ranks[trainer], Tag.TRAJECTORIES)
            for trainer, message in batch_messages(
                config, worker, index, len(layout.trainer_ranks), step, episodes, stats
            )
        ]
    if not watcher.stopped:
        watcher.wait_for(last_version(config, start_step))  # the trainer publishes them whether used or not
    watcher.wait_sent(in_flight)
    if watcher.stopped:
        for trainer_rank in layout.trainer_ranks:
            transport.send(layout.world, END_OF_BATCHES, trainer_rank, Tag.TRAJECTORIES)


def last_version(config, start_step: int) -> int:
    """The last weight version the trainer publishes in a run that is not stopped (see trainer/loop.py)."""
    if start_step >= config.steps:
        return start_step
    return config.steps if config.eval.due(config.steps) else config.steps - 1


def discard_batches_ahead(layout) -> int:
    """Trainer ranks, after a stop: take every batch the rollout ranks sent ahead, until each says it ended;
    the number of batches discarded."""
    discarded = 0
    for rank in layout.rollout_ranks:
        while not transport.recv(layout.world, rank, Tag.TRAJECTORIES)[0].get("end"):
            discarded += 1
    return discarded
