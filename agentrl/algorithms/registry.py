"""Find algorithms by name: in-process registrations, `module:Class`, or the `agentrl.algorithms` entry points.

Envs plug in the same way (agentrl/env/registry.py). An algorithm is a subclass of
`agentrl.algorithms.base.Algorithm`; its `Options` class validates the `algorithm:`
section of the config, so options of another algorithm are an error naming the field.
"""

from __future__ import annotations

import difflib
from importlib.metadata import entry_points

from agentrl.env.registry import load_callable

ENTRY_POINT_GROUP = "agentrl.algorithms"
_registry: dict[str, str | type] = {}


def register(name: str, target: str | type) -> None:
    """Register `name` -> an Algorithm subclass or its `"module:Class"` path; a taken name is an error."""
    if name in _registry and _registry[name] != target:
        raise ValueError(
            f"algorithm name {name!r} is already registered ({_registry[name]!r}); pick another name for {target!r}"
        )
    _registry[name] = target


def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registered_names() -> list[str]:
    return sorted(set(_registry) | set(_entry_points()))


def resolve(name: str) -> type:
    """The Algorithm subclass behind `name`, imported lazily."""
    from agentrl.algorithms.base import Algorithm

    if name in _registry:
        target = _registry[name]
        found = load_callable(target, "algorithm") if isinstance(target, str) else target
    elif name in (installed := _entry_points()):
        found = installed[name].load()
    elif ":" in name:
        found = load_callable(name, "algorithm")
    else:
        known = registered_names()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise KeyError(
            f"unknown algorithm {name!r}; {hint}known: {', '.join(known)}. Use one of them, a 'module:Class' path, "
            f"or register yours with agentrl.algorithms.register or the '{ENTRY_POINT_GROUP}' entry point group"
        )
    if not (isinstance(found, type) and issubclass(found, Algorithm)):
        raise TypeError(f"algorithm {name!r} resolves to {found!r}, not a subclass of agentrl.algorithms.Algorithm")
    return found


def describe() -> list[tuple[str, str]]:
    """(name, one-line summary) of every registered algorithm, for `agentrl algorithms`."""
    rows = []
    for name in registered_names():
        try:
            rows.append((name, resolve(name).summary))
        except (ImportError, AttributeError, TypeError, ValueError) as error:
            rows.append((name, f"(cannot load: {error})"))
    return rows


register("grpo", "agentrl.algorithms.grpo:GRPO")
register("dr_grpo", "agentrl.algorithms.policy_gradient:DrGRPO")
register("rloo", "agentrl.algorithms.policy_gradient:RLOO")
register("reinforce_pp", "agentrl.algorithms.policy_gradient:ReinforcePP")
register("reinforce_pp_baseline", "agentrl.algorithms.policy_gradient:ReinforcePPBaseline")
register("gspo", "agentrl.algorithms.policy_gradient:GSPO")
register("cispo", "agentrl.algorithms.policy_gradient:CISPO")
register("ppo", "agentrl.algorithms.ppo:PPO")
register("dapo", "agentrl.algorithms.dapo:DAPO")
register("gigpo", "agentrl.algorithms.gigpo:GiGPO")
