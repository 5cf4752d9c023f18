"""Every role in turns in each process: world size 1, or layout.hybrid, where every rank generates its share of a
step's tasks, then all train on them, data parallel.

A rank holds its trainer (gradients summed over the ranks), its engine, fed the trainer's weights in-process after
each step, and its envs; one process is the case of one rank. What only the leader holds
in a split layout comes to it over MPI each step: the ranks' rollout stats, failure tallies, data positions, sample
texts and episode records, and at an evaluation step their shares of the eval split. Each rank deals its groups over
the ranks by their cost to train, as rollout ranks deal theirs over trainer ranks, so that the trainers' shards cost
alike.
"""

from __future__ import annotations

from agentrl import transport
from agentrl.config import Config
from agentrl.data.recorder import StepRecorder
from agentrl.layout import Layout
from agentrl.metrics import merge_stats
from agentrl.roles.rollout_parts import rollout_parts
from agentrl.roles.trainer import TrainingParts, train_loop
from agentrl.roles.trainer_parts import leader_parts, make_trainer
from agentrl.rollout.failures import FailureTally, abort_if_failing
from agentrl.rollout.trainer_messages import sample_texts, shard_for_trainers
from agentrl.run.start import RunStart
from agentrl.trainer.model import init_trainer_group
from agentrl.trajectory import concat, pack, trained_totals
from agentrl.transport import Tag
from agentrl.weights.base import InProcessWeightCopy

LEADER = 0  # the trainer leader's rank in the hybrid ranks' communicator


def run_hybrid(config: Config, layout: Layout, start: RunStart) -> tuple[int, dict[int, float] | None]:
    """Steps done, and on the leader the success rate logged at each step."""
    group = init_trainer_group(layout.role_comm, layout.device, shares_gpu=layout.shared_trainer_gpu is not None)
    trainer, tokenizer = make_trainer(config, layout, start.step, group)
    rollout = rollout_parts(config, layout, start)
    worker, evaluator = rollout.worker, rollout.evaluator
    sync = InProcessWeightCopy(worker.engine)
    sync.send(trainer.named_weights(), start.step)
    comm, leader = layout.role_comm, layout.is_trainer_leader
    if leader != (comm.Get_rank() == LEADER):
        raise RuntimeError("layout.hybrid: the trainer leader must be rank 0 of the ranks' communicator")
    prefix = config.trainer.shared_prefix
    recorder = StepRecorder(config.run_dir, config.rollout.dump_episodes) if leader else None

    def collect(step: int):
        episodes, stats = worker.collect(step)
        report = {
            "stats": stats,
            "failures": FailureTally.of(episodes),
            "data_position": worker.task_source.position(),
            "episodes": worker.episode_records(step) if config.rollout.dump_episodes else [],
            "samples": sample_texts(config, step, episodes) if leader else [],
        }
        # each rank deals its groups over the ranks by what they cost to train, as a rollout rank deals them over
        # trainer ranks: the gradient sums wait for the slowest rank's forward and backward
        shards = [pack(shard) for shard in shard_for_trainers(episodes, comm.Get_size(), comm.Get_rank(), prefix)]
        # with every shard go the trained totals of all this rank's shards: summed, the step's loss denominators;
        # what only the leader reads rides with its shard: one exchange, no collective before it or for the sums
        mine = sum(trained_totals(shard) for shard in shards)
        outgoing = [(shard, mine, report if rank == LEADER else None) for rank, shard in enumerate(shards)]
        incoming = transport.exchange(comm, outgoing, Tag.TRAJECTORIES)
        batch = concat([shard for shard, _, _ in incoming])
        step_trained = sum(totals for _, totals, _ in incoming)
        if not leader:
            return batch, {}, [], step_trained
        reports = [report for _, _, report in incoming]
        tally = FailureTally.merged([r["failures"] for r in reports])
        abort_if_failing(step, tally, config.runtime.abort_on_failed_fraction)
        records = [record for r in reports for record in r["episodes"]]
        recorder.record(step, [r["data_position"] for r in reports], records)
        return batch, merge_stats([r["stats"] for r in reports]), report["samples"], step_trained

    def eval_results(step: int) -> list[dict]:
        return transport.allgather_object(comm, {**evaluator.run(step, config.eval.dump_episodes), "step": step})

    logger, evaluate = None, None
    if leader:
        logger, evaluate = leader_parts(config, start.step, eval_results if evaluator is not None else None)
    elif evaluator is not None:
        evaluate = eval_results  # this rank's share of the split, gathered by the leader's evaluation
    parts = TrainingParts(trainer, tokenizer, logger, evaluate)
    done = train_loop(config, parts, collect, sync, start.step, comm, [recorder] if leader else [])
    if worker.gateway is not None:
        worker.gateway.stop(worker.loop)
    if rollout.env_client is not None:
        rollout.env_client.shutdown()
    if logger is None:
        return done, None
    logger.close()
    return done, logger.success_by_step
