"""What the trainer side is built from, each part given the config sections it reads: the policy trainer (resumed
from the start step's checkpoint) and its tokenizer; on the trainer leader, the run logger and the evaluation at due
steps; and the weight sync the trainer leader and the rollout ranks share."""

from __future__ import annotations

from collections.abc import Callable

from agentrl.algorithms import algorithm_of
from agentrl.config import Config
from agentrl.evaluation.report import RunEvaluation
from agentrl.layout import Layout
from agentrl.models.loading import load_tokenizer
from agentrl.run.supervise import restart_count
from agentrl.tracking import open_trackers
from agentrl.tracking.run_logger import RunLogger
from agentrl.trainer import checkpoint
from agentrl.trainer.policy_trainer import PolicySections, PolicyTrainer
from agentrl.weights import make_weight_sync


def policy_trainer(config: Config, weights_path: str, device: str, group=None, comm=None) -> PolicyTrainer:
    """The policy trainer of `weights_path` (the model, or a checkpoint to resume) among the ranks of `group`
    (torch.distributed) and `comm` (the same ranks' MPI communicator)."""
    return PolicyTrainer(weights_path, device, group, PolicySections.of(config), algorithm_of(config), comm)


def make_trainer(config: Config, layout: Layout, start_step: int, group=None):
    """The policy trainer (resumed from the checkpoint of `start_step`, if any) and the tokenizer."""
    resumed_from = checkpoint.step_path(config.run_dir, start_step) if start_step else None
    trainer = policy_trainer(config, str(resumed_from or config.model.path), layout.device, group, layout.role_comm)
    if resumed_from is not None:
        checkpoint.load_state(
            resumed_from, trainer.optimizer, trainer.scheduler, trainer.model, extra_state=trainer.extra_state
        )
    return trainer, load_tokenizer(config.model.path)


def leader_parts(config: Config, start_step: int, results: Callable[[int], list[dict]] | None):
    """The trainer leader's run logger (TensorBoard, and the W&B/MLflow runs logging.backends lists) and, given
    the rollout side's `results(step)`, its side of evaluation in a training run (None without)."""
    trackers = open_trackers(config.logging, config.run_dir, start_step, config.model_dump(mode="json"))
    logger = RunLogger(
        config.run_dir, config.steps, start_step, config.logging.progress, restarts=restart_count(), trackers=trackers
    )
    if results is None:
        return logger, None
    evaluate = RunEvaluation(
        results,
        logger,
        run_dir=config.run_dir,
        model_path=config.model.path,
        eval_config=config.eval,
        env=config.env,
        rollout=config.rollout,
    )
    return logger, evaluate


def weight_sync(config: Config, layout: Layout):
    """This rank's weight sync: the trainer leader's, or a rollout rank's (it meets its engine at each receive)."""
    return make_weight_sync(
        config.weights,
        layout,
        colocate=config.layout.colocate,
        rollout_gpus=config.rollout.engine.gpus,
        lora=config.model.lora,
        mapped=config.maps_weights,
        in_place=config.trains_in_window,
    )
