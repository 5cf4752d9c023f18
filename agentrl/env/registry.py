"""Find environments by id: in-process registrations, `module:Class`, or the `agentrl.envs` entry points."""

from __future__ import annotations

from collections.abc import Callable

from agentrl.plugins import Registry

ENTRY_POINT_GROUP = "agentrl.envs"
_envs = Registry("env id", ENTRY_POINT_GROUP, "agentrl.env.register", overwrite=True)


def register(env_id: str, entry_point: str | Callable) -> None:
    """Register `env_id` -> `"module:Class"` or a callable returning an env."""
    _envs.register(env_id, entry_point)


def registered_ids() -> list[str]:
    return _envs.names()


def resolve(env_id: str) -> Callable:
    """The constructor behind `env_id`, imported lazily."""
    try:
        return _envs.resolve(env_id)
    except KeyError as error:
        raise KeyError(f"{error.args[0]}{gymnasium_hint(env_id)}") from None


def gymnasium_hint(env_id: str) -> str:
    """For a Gymnasium id: how to play that game as text (agentrl envs take and return strings)."""
    import gymnasium

    if env_id not in gymnasium.registry:
        return ""
    if toy_text_plays(env_id):
        return (
            f". {env_id!r} is a Gymnasium id, whose observations and actions are not text; it plays as text "
            f"through the toy_text adapter: env.id=toy_text env.kwargs.game={env_id}"
        )
    return (
        f". {env_id!r} is a Gymnasium id, whose observations and actions are not text, and the toy_text adapter "
        "cannot draw its state; wrap it in an agentrl.env.TextEnv (docs/writing-an-environment.md)"
    )


def toy_text_plays(game: str) -> bool:
    """Whether the toy_text adapter can play Gymnasium's `game` (Discrete actions and a text view of its state)."""
    try:
        make("toy_text", game=game).close()
    except ValueError:  # toy_text's answer for a game it cannot play
        return False
    return True


def make(env_id: str, /, **kwargs):
    return resolve(env_id)(**kwargs)


register("guess_number", "envs.guess_number:GuessNumberEnv")
register("calculator", "envs.calculator:CalculatorEnv")
register("python_tool", "envs.python_tool:PythonToolEnv")
register("search_qa", "envs.search_qa:SearchQAEnv")
register("toy_text", "envs.toy_text:ToyTextEnv")
register("frozen_lake", "envs.toy_text:FrozenLakeEnv")
register("taxi", "envs.toy_text:TaxiEnv")
register("cliff_walking", "envs.toy_text:CliffWalkingEnv")
register("blackjack", "envs.toy_text:BlackjackEnv")
