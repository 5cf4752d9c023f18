"""`agentrl algorithms`: the registered RL algorithms (`algorithm.name`), each with one line on what it is."""

from __future__ import annotations

from agentrl.algorithms.registry import describe


def add_arguments(parser) -> None:
    pass


def main(args) -> int:
    rows = describe()
    width = max(len(name) for name, _ in rows)
    for name, summary in rows:
        print(f"{name:<{width}}  {summary}")
    return 0
