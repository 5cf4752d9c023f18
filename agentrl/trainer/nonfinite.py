"""Updates that would put NaN or inf into the weights: skipped whole, counted, and a stop after too many in a row.

A mini-batch whose loss or gradient norm (the policy's, or an extra model's) is not finite on any trainer rank is
skipped on every rank alike: gradients dropped, no optimizer step and no scheduler step, so the weights and the
optimizer state stay exactly as they were (as torch's GradScaler skips the step of an overflowed batch). The run
stops with a message after `trainer.max_skipped_nonfinite` such updates in a row: by then the fault is no accident
of one batch, and skipping on would burn the rest of the run learning nothing.
"""

from __future__ import annotations

import math
import sys

from agentrl.errors import UserError


class NonFiniteUpdates(UserError):
    """Too many optimizer updates in a row had a loss or gradient norm that is not finite."""


class NonFiniteGuard:
    """Counts skipped updates in a row and stops the run at `limit` (None: never)."""

    def __init__(self, limit: int | None, announce: bool = True):
        self.limit = limit
        self.announce = announce  # print a line per skipped update (the trainer leader)
        self.in_row = 0

    def record(self, skipped: bool, loss: float, norms: dict[str, float]) -> None:
        """After each update (the same decision on every trainer rank): count it, say so, stop at the limit."""
        if not skipped:
            self.in_row = 0
            return
        self.in_row += 1
        shown = ", ".join([f"loss {loss:.4g}", *(f"{name} {value:.4g}" for name, value in norms.items())])
        if self.limit is not None and self.in_row >= self.limit:
            raise NonFiniteUpdates(
                f"{self.in_row} optimizer updates in a row had a loss or gradient norm that is not finite (the last: "
                f"{shown}) and were skipped, leaving the weights and optimizer state of the last finite update; "
                f"stopping at trainer.max_skipped_nonfinite={self.limit}. NaN or inf comes from the batch (rewards, "
                "log-probs or advantages that are not finite) or from a learning rate too high for the model "
                "(optimizer.lr, optimizer.max_grad_norm); set trainer.max_skipped_nonfinite higher, or null to skip "
                "such updates without stopping."
            )
        if self.announce:
            stop = "never stops" if self.limit is None else f"stops at {self.limit}"
            print(
                f"agentrl: skipped an optimizer update whose {shown} is not finite; weights and optimizer state are "
                f"unchanged ({self.in_row} in a row; the run {stop}: trainer.max_skipped_nonfinite)",
                file=sys.stderr,
                flush=True,
            )


def all_finite(*values: float) -> bool:
    return all(math.isfinite(value) for value in values)
