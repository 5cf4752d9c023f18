"""World size 1: rollout, envs and training take turns in this one process (pdb works anywhere)."""

from __future__ import annotations

from agentrl.config import Config
from agentrl.env.client import LocalEnvClient
from agentrl.layout import Layout
from agentrl.roles.trainer import make_evaluation, make_logger, make_trainer, train_loop
from agentrl.run.start import env_host, rollout_worker, task_source


def run_single_process(config: Config, layout: Layout, start_step: int, data_start) -> tuple[int, dict[int, float]]:
    """World size 1: rollout, envs and training take turns in this process (pdb works anywhere)."""
    from agentrl.data.recorder import StepRecorder
    from agentrl.rollout.failures import FailureTally, abort_if_failing
    from agentrl.rollout.trainer_messages import sample_texts
    from agentrl.trajectory import pack
    from agentrl.weights.base import InProcessWeightCopy

    trainer, tokenizer = make_trainer(config, layout, start_step)
    tasks = task_source(config, 0, 1, data_start)
    env_client = None if config.agent.enabled else LocalEnvClient(env_host(config, check=False))
    worker = rollout_worker(config, env_client, 0, 1, layout.device, tasks)
    sync = InProcessWeightCopy(worker.engine)
    sync.send(trainer.named_weights(), start_step)
    recorder = StepRecorder(config.run_dir, config.rollout.dump_episodes)

    def collect(step: int):
        episodes, stats = worker.collect(step)
        abort_if_failing(step, FailureTally.of(episodes), config.runtime.abort_on_failed_fraction)
        dumped = worker.episode_records(step) if config.rollout.dump_episodes else []
        recorder.record(step, [tasks.position()], dumped)
        return pack(episodes), stats, sample_texts(config, step, episodes)

    logger = make_logger(config, start_step)
    evaluate = None
    if config.eval.enabled:
        from agentrl.evaluation.runner import Evaluator

        evaluator = Evaluator(worker, eval_config=config.eval, data_val=config.data.val)
        evaluate = make_evaluation(config, lambda step: [evaluator.run(step, config.eval.dump_episodes)], logger)
    done = train_loop(
        config, trainer, tokenizer, collect, sync, start_step, layout.role_comm, logger, [recorder], evaluate
    )
    logger.close()
    if worker.gateway is not None:
        worker.gateway.stop(worker.loop)
    return done, logger.success_by_step
