"""Find algorithms by name: in-process registrations, `module:Class`, or the `agentrl.algorithms` entry points.

Envs plug in the same way (agentrl/env/registry.py). An algorithm is a subclass of
`agentrl.algorithms.base.Algorithm`; its `Options` class validates the `algorithm:`
section of the config, so options of another algorithm are an error naming the field.
"""

from __future__ import annotations

from agentrl.plugins import Registry

ENTRY_POINT_GROUP = "agentrl.algorithms"
_algorithms = Registry("algorithm", ENTRY_POINT_GROUP, "agentrl.algorithms.register")


def register(name: str, target: str | type) -> None:
    """Register `name` -> an Algorithm subclass or its `"module:Class"` path; a taken name is an error."""
    _algorithms.register(name, target)


def registered_names() -> list[str]:
    return _algorithms.names()


def resolve(name: str) -> type:
    """The Algorithm subclass behind `name`, imported lazily."""
    from agentrl.algorithms.base import Algorithm

    found = _algorithms.resolve(name)
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
register("turn_rloo", "agentrl.algorithms.turn_rloo:TurnRLOO")
