"""Find environments by id: in-process registrations, `module:Class`, or the `agentrl.envs` entry points."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "agentrl.envs"
_registry: dict[str, str | Callable] = {}


def register(env_id: str, entry_point: str | Callable) -> None:
    """Register `env_id` -> `"module:Class"` or a callable returning an env."""
    _registry[env_id] = entry_point


def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registered_ids() -> list[str]:
    return sorted(set(_registry) | set(_entry_points()))


def resolve(env_id: str) -> Callable:
    """The constructor behind `env_id`, imported lazily."""
    if env_id in _registry:
        target = _registry[env_id]
        return load_callable(target) if isinstance(target, str) else target
    installed = _entry_points()
    if env_id in installed:
        return installed[env_id].load()
    if ":" in env_id:
        return load_callable(env_id)
    known = ", ".join(registered_ids()) or "none"
    raise KeyError(
        f"unknown env id {env_id!r}{did_you_mean(env_id, registered_ids())}; known ids: {known}. "
        f"Use one of them, a 'module:Class' path, or register your env with agentrl.env.register "
        f"or the '{ENTRY_POINT_GROUP}' entry point group{gymnasium_hint(env_id)}"
    )


def did_you_mean(name: str, choices) -> str:
    """`" (did you mean 'x'?)"` for the closest of `choices`, or "" when none is close (as Gymnasium hints)."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


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


def load_callable(path: str, what: str = "env") -> Callable:
    """The object at `"module:attribute"`; errors name `what` the path was given for."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} {path!r} must look like 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"cannot import module {module_name!r} for {what} {path!r}: {error}") from error
    try:
        return getattr(module, attr)
    except AttributeError:
        hint = did_you_mean(attr, [name for name in dir(module) if not name.startswith("_")])
        raise AttributeError(f"module {module_name!r} has no attribute {attr!r}{hint}; {what} {path!r}") from None


register("guess_number", "envs.guess_number:GuessNumberEnv")
register("calculator", "envs.calculator:CalculatorEnv")
register("python_tool", "envs.python_tool:PythonToolEnv")
register("search_qa", "envs.search_qa:SearchQAEnv")
register("toy_text", "envs.toy_text:ToyTextEnv")
register("frozen_lake", "envs.toy_text:FrozenLakeEnv")
register("taxi", "envs.toy_text:TaxiEnv")
register("cliff_walking", "envs.toy_text:CliffWalkingEnv")
register("blackjack", "envs.toy_text:BlackjackEnv")
