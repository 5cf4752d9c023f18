"""Each policy seen as a single-policy config (its model, algorithm and optimizer in place of the top-level ones, its
own run folder run_dir/policies/NAME), so the single-policy parts (trainer, checkpoints, logger) serve it as they
are; and which trainer ranks train which policy."""

from __future__ import annotations

from pathlib import Path

from agentrl.config import Config, ConfigError

POLICIES_FOLDER = "policies"


def policy_dir(run_dir: str | Path, name: str) -> Path:
    return Path(run_dir) / POLICIES_FOLDER / name


def policy_view(config: Config, name: str) -> Config:
    """`config` as policy `name`'s own: its sections where it sets them, its run folder, no `policies`/`game`."""
    policy = config.policies[name]
    update = {"run_dir": str(policy_dir(config.run_dir, name)), "policies": {}, "game": None}
    for section in ("model", "algorithm", "optimizer"):
        if getattr(policy, section) is not None:
            update[section] = getattr(policy, section)
    return config.model_copy(update=update)


def trained_policies(config: Config) -> list[str]:
    return [name for name, policy in config.policies.items() if policy.train]


def learner_of(config: Config) -> str | None:
    """The self-play learner (the one policy every player maps to) when game.opponents or game.evaluate is set."""
    game = config.game
    if not (game.opponents or game.evaluate is not None):
        return None
    return next(iter(game.players.values()))


def policy_trainer_ranks(config: Config, trainer_ranks: list[int]) -> dict[str, list[int]]:
    """Each trained policy's trainer ranks: consecutive, in the order `policies` names them. ConfigError when the
    job's trainer ranks do not match the policies' (a policy would be left without ranks)."""
    wanted = {name: config.policies[name].trainers for name in trained_policies(config)}
    if sum(wanted.values()) != len(trainer_ranks):
        shares = ", ".join(f"{name}: {count}" for name, count in wanted.items())
        raise ConfigError(
            f"the job has {len(trainer_ranks)} trainer rank(s) but the policies ask for {sum(wanted.values())} "
            f"({shares}); set layout.trainer={sum(wanted.values())}"
        )
    ranks, first = {}, 0
    for name, count in wanted.items():
        ranks[name] = trainer_ranks[first : first + count]
        first += count
    return ranks
