"""A multi-policy run's start on rank 0: every policy's model built or checked (a tiny model's tokenizer learns the
game's texts), and the step to resume from: the newest one that every trained policy has a complete checkpoint of."""

from __future__ import annotations

import random
from pathlib import Path

from agentrl.config import Config
from agentrl.config.policies import policy_dir, policy_view, trained_policies
from agentrl.errors import UserError
from agentrl.run.tokenizer_corpus import env_texts


def ensure_policy_models(config: Config) -> None:
    """Build each policy's tiny model (once per model.path) or check that it loads."""
    from agentrl.models.loading import ensure_model

    done = set()
    for name in config.policies:
        model = policy_view(config, name).model
        if model.path not in done:
            ensure_model(model, lambda: game_texts(config))
            done.add(model.path)


def game_texts(config: Config, games: int = 64) -> list[str]:
    """Observations of a few games played with random small numbers as actions: the tiny tokenizer's corpus."""
    players = len(config.game.players) if config.game is not None else len(config.policies)
    return env_texts(config, games, config.rollout.max_turns * players, small_number)


def small_number(rng: random.Random) -> str:
    """Mostly a take of 1 to 4 (a game's moves), sometimes any number to 99."""
    return str(rng.randint(1, 4) if rng.random() < 0.8 else rng.randint(0, 99))


def policies_resume_step(config: Config) -> int:
    """The step a multi-policy run starts at: 0, or with resume=true the newest step every trained policy has a
    complete checkpoint of; UserError when checkpoints exist without resume=true."""
    from agentrl.trainer import checkpoint

    complete: dict[str, set[int]] = {}
    for name in trained_policies(config):
        folder = policy_dir(config.run_dir, name)
        steps = [step for step, path in checkpoint.step_folders(folder) if checkpoint.check(step, path).problem is None]
        complete[name] = set(steps)
    anywhere = set().union(*complete.values())
    if not config.resume:
        if anywhere:
            raise UserError(
                f"run_dir {config.run_dir} already has policy checkpoints (step {max(anywhere)}); pass resume=true "
                "to continue it, or choose a new run_dir=... so nothing is overwritten"
            )
        return 0
    common = set.intersection(*complete.values())
    if not common:
        print(f"agentrl: resume=true but {config.run_dir} has no step that every policy saved; starting at step 0")
        return 0
    step = max(common)
    names = ", ".join(complete)
    print(f"agentrl: resuming policies {names} from step {step} ({Path(config.run_dir) / 'policies'})", flush=True)
    return step
