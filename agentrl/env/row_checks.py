"""Checks of a training dataset before a run starts: every problem names the file and the row.

An env may declare `required_columns` (a class attribute) and a `check_row(row) -> str | None`
method (None: the row is fine, else what is wrong with it); the built-in `qa` env does both.
"""

from __future__ import annotations

from agentrl.data.loading import load_rows
from agentrl.data.tasks import ID_COLUMN
from agentrl.errors import UserError


def check_rows(rows, source: str, env, env_id: str, tasks_per_step: int, field: str = "data.train") -> None:
    """Raise a UserError for a dataset smaller than one step, a missing column, or a row the env rejects."""
    where = f"{field}={source!r}"
    if len(rows) < tasks_per_step:
        raise UserError(
            f"{where} has {len(rows)} row(s), fewer than one step's tasks (rollout.tasks_per_step="
            f"{tasks_per_step}); add rows or lower rollout.tasks_per_step"
        )
    required = tuple(getattr(env, "required_columns", ()))
    missing = [name for name in required if name not in rows.column_names]
    if missing:
        raise UserError(
            f"{where} has no column(s) {', '.join(map(repr, missing))}, which env {env_id!r} needs "
            f"(its columns: {', '.join(rows.column_names)}); rename the columns or fix the file"
        )
    check_row = getattr(env, "check_row", None)
    if check_row is None:
        return
    for index, row in enumerate(rows):
        problem = check_row(row)
        if problem:
            named = f" (id {row[ID_COLUMN]!r})" if row.get(ID_COLUMN) is not None else ""
            raise UserError(f"{where} row {index}{named}: env {env_id!r} rejects it: {problem}; fix or remove that row")


def check_val_rows(config) -> dict:
    """Load and check `data.val` alone (a run that evaluates it without data.train); its first row."""
    from agentrl.env.registry import make

    rows = load_rows(config.data.val, "data.val")
    env = make(config.env.id, **config.env.kwargs)
    try:
        check_rows(rows, config.data.val, env, config.env.id, 1, "data.val")
    finally:
        env.close()
    return rows[0]


def check_training_rows(config) -> dict:
    """Load `data.train` (and `data.val`, if set), check them against the configured env, and return the first
    training row (rank 0, before a run)."""
    from agentrl.env.registry import make

    rows = load_rows(config.data.train, "data.train")
    env = make(config.env.id, **config.env.kwargs)
    try:
        check_rows(rows, config.data.train, env, config.env.id, config.rollout.tasks_per_step)
        if config.data.val:
            check_rows(load_rows(config.data.val, "data.val"), config.data.val, env, config.env.id, 1, "data.val")
    finally:
        env.close()
    return rows[0]
