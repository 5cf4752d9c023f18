"""World size 1: rollout, envs and training take turns in this one process (pdb works anywhere)."""

from __future__ import annotations

from agentrl.config import Config
from agentrl.data.recorder import StepRecorder
from agentrl.layout import Layout
from agentrl.roles.rollout_parts import rollout_parts
from agentrl.roles.trainer import TrainingParts, train_loop
from agentrl.roles.trainer_parts import leader_parts, make_trainer
from agentrl.rollout.failures import FailureTally, abort_if_failing
from agentrl.rollout.trainer_messages import sample_texts
from agentrl.run.start import RunStart
from agentrl.trajectory import pack
from agentrl.weights.base import InProcessWeightCopy


def run_single_process(config: Config, layout: Layout, start: RunStart) -> tuple[int, dict[int, float]]:
    """The trainer's side and a rollout rank's (roles/trainer_parts.py, roles/rollout_parts.py) in one process;
    the steps done and the success rate logged at each step."""
    trainer, tokenizer = make_trainer(config, layout, start.step)
    rollout = rollout_parts(config, layout, start)
    worker, tasks = rollout.worker, rollout.tasks
    sync = InProcessWeightCopy(worker.engine)
    sync.send(trainer.named_weights(), start.step)
    recorder = StepRecorder(config.run_dir, config.rollout.dump_episodes)

    def collect(step: int):
        episodes, stats = worker.collect(step)
        abort_if_failing(step, FailureTally.of(episodes), config.runtime.abort_on_failed_fraction)
        dumped = worker.episode_records(step) if config.rollout.dump_episodes else []
        recorder.record(step, [tasks.position()], dumped)
        return pack(episodes), stats, sample_texts(config, step, episodes)

    evaluator = rollout.evaluator
    results = None if evaluator is None else lambda step: [evaluator.run(step, config.eval.dump_episodes)]
    logger, evaluate = leader_parts(config, start.step, results)
    parts = TrainingParts(trainer, tokenizer, logger, evaluate)
    done = train_loop(config, parts, collect, sync, start.step, layout.role_comm, [recorder])
    logger.close()
    if worker.gateway is not None:
        worker.gateway.stop(worker.loop)
    if rollout.env_client is not None:  # closes the env instances kept for reuse
        rollout.env_client.shutdown()
    return done, logger.success_by_step
