"""Find environments by id: in-process registrations, `module:Class`, the `agentrl.envs` entry points, or
`ADAPTER:NAME` for an environment of another ecosystem's package (`reasoning_gym:countdown`), made by an adapter
registered with `register_adapter` or the `agentrl.env_adapters` entry point group."""

from __future__ import annotations

import functools
from collections.abc import Callable

from agentrl.plugins import Registry

ENTRY_POINT_GROUP = "agentrl.envs"
ADAPTER_ENTRY_POINT_GROUP = "agentrl.env_adapters"
_envs = Registry("env id", ENTRY_POINT_GROUP, "agentrl.env.register", overwrite=True)
_adapters = Registry("env adapter", ADAPTER_ENTRY_POINT_GROUP, "agentrl.env.register_adapter", overwrite=True)


def register(env_id: str, entry_point: str | Callable) -> None:
    """Register `env_id` -> `"module:Class"` or a callable returning an env."""
    _envs.register(env_id, entry_point)


def register_adapter(prefix: str, entry_point: str | Callable) -> None:
    """Register `prefix` -> `"module:function"` or a function `make(name, **kwargs)` returning an env: the env id
    `prefix:name` is then made by that function (an adapter to another package's environments)."""
    _adapters.register(prefix, entry_point)


def registered_ids() -> list[str]:
    return _envs.names()


def registered_adapters() -> list[str]:
    return _adapters.names()


def resolve(env_id: str) -> Callable:
    """The constructor behind `env_id`, imported lazily."""
    prefix, sep, name = env_id.partition(":")
    if sep and prefix in _adapters.names():
        return functools.partial(_adapters.resolve(prefix), name)
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
register("nim", "envs.nim:NimEnv")
register("relay", "envs.relay:RelayEnv")
register("calculator", "envs.calculator:CalculatorEnv")
register("python_tool", "envs.python_tool:PythonToolEnv")
register("search_qa", "envs.search_qa:SearchQAEnv")
register("toy_text", "envs.toy_text:ToyTextEnv")
register("frozen_lake", "envs.toy_text:FrozenLakeEnv")
register("taxi", "envs.toy_text:TaxiEnv")
register("cliff_walking", "envs.toy_text:CliffWalkingEnv")
register("blackjack", "envs.toy_text:BlackjackEnv")
register_adapter("reasoning_gym", "agentrl.env.adapters.reasoning_gym:make")
register_adapter("textarena", "agentrl.env.adapters.textarena:make")
