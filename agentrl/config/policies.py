"""A multi-policy config (`policies:` and `game:`, or `agent:` calling policies by name): its checks (every seat has a
policy, every trained policy has a seat or, with agent:, is served by name, and has trainer ranks, and what this
first version cannot run with several policies is refused), and each policy
seen as a single-policy config (its model, algorithm and optimizer in place of the top-level ones, its own run
folder run_dir/policies/NAME), so the single-policy parts (trainer, checkpoints, logger) serve it as they are."""

from __future__ import annotations

from pathlib import Path

from agentrl.config.algorithm_kinds import TURN_LEVEL_ALGORITHMS
from agentrl.sections import ConfigError

# What a multi-policy job cannot run yet, as (is it set?, the refusal naming the fix).
_REFUSALS = (
    (lambda c: c.rollout.max_staleness > 0, "rollout.max_staleness: set rollout.max_staleness=0 (lockstep)"),
    (lambda c: c.rollout.dispatch == "dynamic", "rollout.dispatch=dynamic: set rollout.dispatch=static"),
    (
        lambda c: bool(c.env.reward_fn) or c.reward.enabled,
        "env.reward_fn or reward: (a score of one transcript): "
        "score each game in the env, or with agent: post each policy's reward to the session's /reward",
    ),
    (lambda c: c.eval.enabled, "eval: (single-policy evaluation): remove eval: and use game.evaluate for matches"),
    (lambda c: bool(c.data.train or c.data.val), "data.train/data.val: play the env's seeds (leave data: empty)"),
    (lambda c: c.parallelism.fsdp, "parallelism.fsdp=true: set parallelism.fsdp=false"),
    (lambda c: c.layout.colocate, "layout.colocate=true: set layout.colocate=false"),
    (lambda c: c.weights.transport not in ("auto", "mpi"), "weights.transport other than mpi: set it to mpi"),
    (lambda c: c.rollout.engine.backend != "torch", "rollout.engine.backend=sglang: use rollout.engine.backend=torch"),
)


def check_policies(config) -> None:
    """ValueError naming the field and the fix for a multi-policy config that cannot run."""
    policies, game = config.policies, config.game
    if not policies:
        raise ValueError("game: seats policies, but policies: is empty; name them, e.g. policies: {learner: {}}")
    if config.agent.enabled:
        _check_agent_policies(config)
    elif game is None:
        raise ValueError(
            "policies: needs game.players, which says which policy plays each player id the env names "
            "(e.g. game: {players: {'0': learner, '1': learner}})"
        )
    known = ", ".join(policies)
    for player, name in game.players.items() if game is not None else ():
        if name not in policies:
            raise ValueError(
                f"game.players.{player}={name!r} names no policy (policies: {known}); name one of them or add "
                f"policies.{name}"
            )
    seated = set(game.players.values()) if game is not None else set(policies)
    for name, policy in policies.items():
        if name not in seated:
            raise ValueError(f"policies.{name} plays no seat; seat it in game.players or remove it")
        if policy.train and policy.trainers == 0:
            raise ValueError(
                f"policies.{name}.trainers=0 leaves the trained policy {name} without trainer ranks; set "
                f"policies.{name}.trainers=1 (and layout.trainer to the policies' sum) or policies.{name}.train=false"
            )
        if not policy.train and policy.trainers:
            raise ValueError(f"policies.{name}.train=false trains nothing; set policies.{name}.trainers=0")
        options = policy.algorithm or config.algorithm
        if getattr(options, "max_extra_rounds", 0):
            raise ValueError(
                f"policies.{name}: algorithm {options.name} draws more tasks for the groups it drops (dynamic "
                "sampling), which a game shared by several policies cannot do for one of them; set "
                f"algorithm.max_extra_rounds=0 for it, or choose grpo, rloo, dr_grpo or reinforce_pp"
            )
    wanted = sum(policy.trainers for policy in policies.values())
    if wanted != config.layout.trainer:
        shares = ", ".join(f"{name}: {policy.trainers}" for name, policy in policies.items())
        raise ValueError(
            f"layout.trainer={config.layout.trainer}, but the policies' trainer ranks add up to {wanted} ({shares}); "
            f"set layout.trainer={wanted} or change policies.NAME.trainers so every trained policy has its ranks"
        )
    if not any(policy.train for policy in policies.values()):
        raise ValueError("no policy trains (every policies.NAME.train=false); set train: true on one")
    if game is not None and (game.opponents or game.evaluate is not None):
        learners = set(game.players.values())
        if len(learners) != 1 or not policies[next(iter(learners))].train:
            raise ValueError(
                "game.opponents and game.evaluate are for self-play: every player in game.players must be one "
                f"trained policy (here {sorted(learners)}); seat one policy everywhere or remove them"
            )
        if len(game.players) < 2:
            raise ValueError("game.opponents needs at least 2 players in game.players (one learner, one opponent)")
    for is_set, refusal in _REFUSALS:
        if is_set(config):
            raise ValueError(f"several policies (policies:) cannot run with {refusal}")
    check_shared_bases(config)


def lora_field(config, name: str) -> str:
    """Where policy `name`'s LoRA section is set, as a user writes it."""
    policy = config.policies[name]
    if policy.lora is not None:
        return f"policies.{name}.lora"
    return f"policies.{name}.model.lora" if policy.model is not None else "model.lora"


def shared_bases(config) -> list[list[str]]:
    """The groups of policies that share one base on each rollout rank: every policy whose model is a LoRA adapter
    (model.lora) on the same base (model.path and dtype), where two or more are."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name in config.policies:
        model = policy_view(config, name).model
        if model.lora is not None:
            groups.setdefault((str(Path(model.path).resolve()), model.dtype), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def check_shared_bases(config) -> None:
    """ValueError naming the fix where policies sharing a base ask for what a shared base cannot do."""
    for name, policy in config.policies.items():
        if policy.lora is not None and policy.model is not None:
            raise ValueError(
                f"policies.{name}: set lora under policies.{name}.model (its own model), or remove "
                f"policies.{name}.model so policies.{name}.lora adapts the top-level model"
            )
    for names in shared_bases(config):
        together = f"policies {', '.join(names)} share the base {policy_view(config, names[0]).model.path}"
        for name in names:
            if policy_view(config, name).model.lora.modules_to_save:
                field = lora_field(config, name)
                raise ValueError(
                    f"{field}.modules_to_save: {together} and take adapters only; set {field}.modules_to_save=[], "
                    f"or give {name} a model.path of its own (a copy of the base)"
                )
        if getattr(config.rollout.engine, "scheduler", "batch") != "batch":
            raise ValueError(
                f"rollout.engine.scheduler={config.rollout.engine.scheduler}: {together}, which the batch scheduler "
                "serves; set rollout.engine.scheduler=batch, or give each a model.path of its own"
            )


def _check_agent_policies(config) -> None:
    """Agent programs (agent:) call each policy by name through the gateway: no game seats them, the gateway's one
    model name is the policies' names, and each policy trains with an episode-level algorithm."""
    if config.game is not None:
        raise ValueError(
            "game: seats policies in an env's games, but with agent: the agent program calls each policy by its name "
            "(model=NAME); remove game:"
        )
    if config.agent.model_name != type(config.agent).model_fields["model_name"].default:  # a saved config has it
        raise ValueError(
            f"agent.model_name={config.agent.model_name!r}: with policies: the gateway serves each policy under its "
            f"own name ({', '.join(config.policies)}); remove agent.model_name"
        )
    if config.layout.env:
        raise ValueError(
            f"layout.env={config.layout.env}: a multi-policy job's agent programs run on its rollout ranks, not on env "
            "ranks; set layout.env=0"
        )
    for name, policy in config.policies.items():
        options = policy.algorithm or config.algorithm
        if options.name in TURN_LEVEL_ALGORITHMS:
            raise ValueError(
                f"policies.{name}: algorithm {options.name} needs env episodes turn by turn; agent programs train with "
                "the episode-level algorithms (grpo, dr_grpo, rloo, reinforce_pp, gspo, cispo)"
            )


POLICIES_FOLDER = "policies"


def policy_dir(run_dir: str | Path, name: str) -> Path:
    return Path(run_dir) / POLICIES_FOLDER / name


def policy_view(config, name: str):
    """`config` as policy `name`'s own: its sections where it sets them, its run folder, no `policies`/`game`."""
    policy = config.policies[name]
    update = {"run_dir": str(policy_dir(config.run_dir, name)), "policies": {}, "game": None}
    for section in ("model", "algorithm", "optimizer"):
        if getattr(policy, section) is not None:
            update[section] = getattr(policy, section)
    if policy.lora is not None:  # an adapter on the top-level model
        update["model"] = config.model.model_copy(update={"lora": policy.lora})
    return config.model_copy(update=update)


def opponents_of(config) -> list:
    """game.opponents, or none where no game is named (agent programs pick policies by name)."""
    return config.game.opponents if config.game is not None else []


def trained_policies(config) -> list[str]:
    return [name for name, policy in config.policies.items() if policy.train]


def learner_of(config) -> str | None:
    """The self-play learner (the one policy every player maps to) when game.opponents or game.evaluate is set."""
    game = config.game
    if game is None or not (game.opponents or game.evaluate is not None):
        return None
    return next(iter(game.players.values()))


def policy_trainer_ranks(config, trainer_ranks: list[int]) -> dict[str, list[int]]:
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
