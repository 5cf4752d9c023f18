"""Episode failures counted by kind, and the rule that stops a run whose steps only fail.

A contained fault ends its episode and training goes on. But when every episode of a step
fails with the same error (an env that raises on every step, a reward_fn that always
raises, a tool sandbox that cannot start), the run cannot learn and would still run to its
last step and write checkpoints. The trainer leader, which sees the whole step, stops it
instead: `runtime.abort_on_failed_fraction`.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field


def error_kind(error: str) -> str:
    """An error's first line with its numbers masked: errors that differ only in a seed or a pid are one kind."""
    return re.sub(r"\d+", "#", error.splitlines()[0])


@dataclass
class FailureTally:
    """One step's failed episodes (of all its `episodes`) by error kind; small, so it travels with the batch."""

    episodes: int = 0
    kinds: dict[str, tuple[int, str]] = field(default_factory=dict)
    """error kind -> (episodes that failed with it, the first such error in full)"""

    @classmethod
    def of(cls, episodes) -> FailureTally:
        tally = cls(episodes=len(episodes))
        for episode in episodes:
            if episode.error:
                kind = error_kind(episode.error)
                count, first = tally.kinds.get(kind, (0, episode.error))
                tally.kinds[kind] = (count + 1, first)
        return tally

    @classmethod
    def merged(cls, tallies: list[FailureTally]) -> FailureTally:
        """The tally of a whole step from the tallies of its parts (one per rollout rank)."""
        whole = cls(episodes=sum(tally.episodes for tally in tallies))
        for tally in tallies:
            for kind, (count, first) in tally.kinds.items():
                seen, first_seen = whole.kinds.get(kind, (0, first))
                whole.kinds[kind] = (seen + count, first_seen)
        return whole


class StepFailed(RuntimeError):
    """A step in which too many episodes failed alike; the run stops (runtime.abort_on_failed_fraction)."""


def abort_if_failing(step: int, tally: FailureTally, abort_on_failed_fraction: float | None) -> None:
    """Raise StepFailed, after printing the first error and the count, when the most common error kind
    ended at least `abort_on_failed_fraction` of the step's episodes (None: never)."""
    if abort_on_failed_fraction is None or not tally.kinds:
        return
    count, first = max(tally.kinds.values(), key=lambda kind: kind[0])
    if count < abort_on_failed_fraction * tally.episodes:
        return
    print(
        f"agentrl: step {step}: {count} of {tally.episodes} episodes failed with the same error, at or above "
        f"runtime.abort_on_failed_fraction={abort_on_failed_fraction} of the step; stopping the run, "
        f"which cannot learn from failed episodes. The first of them:\n{first.rstrip()}\n"
        "Fix what it names: the env (`agentrl check-env ID` runs an env on its own), the agent program, the "
        "reward_fn, or the policy (a model whose weights went NaN cannot sample); to train on through "
        "such steps, set runtime.abort_on_failed_fraction higher (at most 1) or to null (never stop).",
        file=sys.stderr,
        flush=True,
    )
    raise StepFailed(
        f"step {step}: {count} of {tally.episodes} episodes failed with the same error "
        f"(runtime.abort_on_failed_fraction={abort_on_failed_fraction}); the error is printed above"
    )
