"""The rollout role: generate each step's episodes, ship them to the trainers, take new weights.

One loop serves every mode; how it waits for weights and ships batches is its pace:
- `Lockstep` (rollout.max_staleness=0): step s runs on weights of version s; the batch is sent and the
  rank waits for the next version.
- `RunningAhead` (rollout.max_staleness=K >= 1): asynchronous rollouts with bounded staleness. Step s
  starts once the rank holds weights of version s - K or newer (admission control), so it generates
  while the trainer trains, at most K steps ahead; the trainer, about to train step s on weights of
  version s, gets episodes at most K versions old. With rollout.partial_rollouts, versions published
  meanwhile reach the episodes in flight between engine batches, at their next turn; every token
  records the version that made it. A batch is sent without waiting for the trainer to take it (at
  most one batch in flight per rank). Evaluation steps are sync points: they run on exactly the
  weights of their step.

  Stops lose nothing and repeat nothing: the trainer announces the stop instead of a version; a rank
  cancels the episodes in flight, lets the trainers take (and discard) any batch it had sent ahead,
  and says it ended. The checkpoint holds the data position of the last trained step, so a resumed
  run generates the discarded steps' tasks again, the same tasks, from the resumed weights.

Where a step's tasks come from is the worker's business (agentrl/rollout/worker.py): rounds of this
rank's share, or claims from one queue for all ranks (rollout.dispatch=dynamic, agentrl/roles/rollout_parts.py).
"""

from __future__ import annotations

import time

from agentrl import node_wakeup, transport
from agentrl.config import Config
from agentrl.layout import Layout
from agentrl.roles.rollout_parts import rollout_parts
from agentrl.rollout.agent_loop import Stopped
from agentrl.rollout.trainer_messages import batch_messages
from agentrl.rollout.worker import RolloutWorker
from agentrl.run import preempt, startup_gc
from agentrl.run.start import RunStart
from agentrl.transport import Tag

END_OF_BATCHES = {"end": True}  # after a stop: this rollout rank sends no more batches


def run_rollout(config: Config, layout: Layout, start: RunStart) -> None:
    """The rollout rank's role: set up its parts (env client, weights, tasks, worker; roles/rollout_parts.py), run
    the loop, close.

    The message to the trainer leader also carries this rank's data position after the step (kept in
    checkpoints) and, with rollout.dump_episodes, the step's episodes as dump records. At a step due for
    evaluation (`eval:`), this rank's share of the eval split runs first, on the same weights, and its
    results go to the trainer leader; after the last step that needs the last weights, sent for it.
    """
    parts = rollout_parts(config, layout, start)
    worker, sync = parts.worker, parts.sync
    pace = (
        RunningAhead(config, layout, worker, sync)
        if config.rollout.max_staleness
        else Lockstep(config, layout, worker, sync)
    )
    rollout_loop(config, layout, start.step, worker, parts.evaluator, pace)
    close(worker, parts.env_client, parts.scorer)


def rollout_loop(config: Config, layout: Layout, start_step: int, worker: RolloutWorker, evaluator, pace) -> None:
    """Steps from `start_step` to `config.steps`: evaluate when due, collect, ship; ends early at a stop."""
    index = layout.rollout_ranks.index(layout.rank)
    startup_gc.settle()
    pace.start(start_step)
    for step in range(start_step, config.steps + 1):
        if evaluator is not None and config.eval.due(step):
            from agentrl.evaluation.report import send_results

            if not pace.weights_for(step):
                break
            send_results(layout, step, evaluator.run(step, config.eval.dump_episodes))
        if step == config.steps or not pace.may_start(step):
            break
        try:
            episodes, stats = worker.collect(step)
        except Stopped:
            break
        stats["time/rollout_idle"] = pace.take_idle()
        preempt.forward(layout.world, layout.trainer_ranks[0])  # before the batch, so it is seen at this step's end
        messages = batch_messages(config, worker, index, len(layout.trainer_ranks), step, episodes, stats)
        if not pace.ship(messages) or not pace.next_weights(step):
            break
    pace.finish(start_step)


def send_batches(layout, messages) -> list:
    """Start sending each (trainer index, message) to its trainer rank and ring those ranks; the requests."""
    trainer_ranks = layout.trainer_ranks
    sends = [transport.isend(layout.world, message, trainer_ranks[t], Tag.TRAJECTORIES) for t, message in messages]
    node_wakeup.ring_ranks([trainer_ranks[t] for t, _ in messages])
    return sends


class Lockstep:
    """Each step on the weights of its own version: send the batch, then wait for the next version."""

    def __init__(self, config: Config, layout: Layout, worker: RolloutWorker, weight_sync):
        self.config, self.layout, self.worker, self.weight_sync = config, layout, worker, weight_sync
        self.idle_s = 0.0

    def start(self, start_step: int) -> None:
        self.weight_sync.receive(self.worker.engine)

    def weights_for(self, step: int) -> bool:
        return True  # held already: the version of this step arrived after the last batch

    def may_start(self, step: int) -> bool:
        return True

    def take_idle(self) -> float:
        return self.idle_s

    def ship(self, messages) -> bool:
        for request in send_batches(self.layout, messages):
            transport.wait_sent(request, "a batch to a trainer rank")
        return True

    def next_weights(self, step: int) -> bool:
        """Wait for the next version; False when the run needs none (the last step) or the trainer said stop."""
        more = step + 1 < self.config.steps or self.config.eval.due(self.config.steps)
        waited = time.perf_counter()
        if not more or self.weight_sync.receive(self.worker.engine) is None:
            return False
        self.idle_s = time.perf_counter() - waited
        return True

    def finish(self, start_step: int) -> None:
        pass


class RunningAhead:
    """Up to rollout.max_staleness steps ahead of the trainer, taking versions as they are announced."""

    def __init__(self, config: Config, layout: Layout, worker: RolloutWorker, weight_sync):
        from agentrl.weights.announce import WeightWatcher

        self.config, self.layout, self.worker = config, layout, worker
        self.ahead = config.rollout.max_staleness
        self.watcher = WeightWatcher(weight_sync, worker.engine, layout.world, layout.trainer_ranks[0])
        self.in_flight: list = []  # the last batch's sends: complete before the next batch is sent

    def start(self, start_step: int) -> None:
        worker, poll = self.worker, self.watcher.poll
        if self.config.rollout.partial_rollouts and worker.engine.event_loop is None:
            worker.between_batches = poll
        elif worker.dispatch is not None and worker.engine.event_loop is None:
            # Whole episodes on one version, tasks from one queue: a rank takes new weights mid-step while none of its
            # groups runs. Taking them only between steps hung: a rank in the weight handoff waited for rank 0, which
            # served a step that waited for that rank's verdicts.
            worker.between_batches = worker.when_idle(poll)
        elif self.config.rollout.partial_rollouts and self.layout.rank == self.layout.rollout_ranks[0]:
            # SGLang updates weights by running its own loop
            print(f"agentrl: {type(worker.engine).__name__} takes new weights between steps only", flush=True)
        self.watcher.wait_for(start_step)
        # known once the first version has come (the shared-memory sync learns its nodes then)
        worker.weights_at_batches = worker.between_batches == poll and not self.watcher.sync.paces_sender()

    def weights_for(self, step: int) -> bool:
        return self.watcher.wait_for(step)

    def may_start(self, step: int) -> bool:
        return self.watcher.wait_for(step - self.ahead)

    def take_idle(self) -> float:
        idle, self.watcher.idle_s = self.watcher.idle_s, 0.0
        return idle

    def ship(self, messages) -> bool:
        if not self.watcher.wait_sent(self.in_flight):
            return False
        self.in_flight = send_batches(self.layout, messages)
        return True

    def next_weights(self, step: int) -> bool:
        return True  # taken as announced, by `may_start` and between engine batches

    def finish(self, start_step: int) -> None:
        """Take every version the trainer publishes; after a stop, tell the trainers no batch follows."""
        if not self.watcher.stopped:
            self.watcher.wait_for(last_version(self.config, start_step))  # published whether used or not
        self.watcher.wait_sent(self.in_flight)
        if self.watcher.stopped:
            for trainer_rank in self.layout.trainer_ranks:
                transport.send(self.layout.world, END_OF_BATCHES, trainer_rank, Tag.TRAJECTORIES)


def last_version(config: Config, start_step: int) -> int:
    """The last weight version the trainer publishes in a run that is not stopped (see roles/trainer.py)."""
    if start_step >= config.steps:
        return start_step
    return config.steps if config.eval.due(config.steps) else config.steps - 1


def close(worker: RolloutWorker, env_client, scorer=None) -> None:
    """Take every message still addressed to this rank: MPI_Finalize fails on unreceived ones."""
    if worker.dispatch is not None:
        worker.dispatch.close()
    if worker.gateway is not None:
        worker.gateway.stop(worker.loop)
    if env_client is not None:
        env_client.shutdown()
    if scorer is not None:
        scorer.shutdown()
