"""`agentrl envs`: the registered environment ids, one a line."""

from __future__ import annotations

from agentrl.env.registry import registered_ids


def add_arguments(parser) -> None:
    pass


def main(args) -> int:
    for env_id in registered_ids():
        print(env_id)
    return 0
