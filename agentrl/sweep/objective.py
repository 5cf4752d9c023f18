"""A trial's score: the objective's TensorBoard scalar read from its run folder (tb/), reduced to one number."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agentrl.sweep.spec import Objective

TB_DIR = "tb"
STEP_TAG = "run/restarts"  # agentrl.tracking.run_logger.RunLogger logs it at every training step


def read_scalars(run_dir: str | Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of `tag` in the run's TensorBoard events, by step; a resumed run's redone steps counted once."""
    return read_run_scalars(run_dir, [tag]).get(tag, [])


def read_run_scalars(run_dir: str | Path, tags: list[str]) -> dict[str, list[tuple[int, float]]]:
    """`read_scalars` of several tags from one read of the run's events; tags it never logged are left out."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    folder = Path(run_dir) / TB_DIR
    if not folder.is_dir():
        return {}
    events = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    events.Reload()
    logged = set(events.Tags()[SCALARS])
    by_tag = {}
    for tag in tags:
        if tag in logged:
            by_step = {event.step: event.value for event in events.Scalars(tag)}  # a later file's value wins
            by_tag[tag] = sorted(by_step.items())
    return by_tag


def window_means(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Mean over the first 2% of the points (at least one) and over the last 10%: where a run started and ended."""
    values = np.array([value for _, value in points])
    if not len(values):
        return float("nan"), float("nan")
    head = max(1, round(0.02 * len(values)))
    tail = max(1, round(0.10 * len(values)))
    return float(values[:head].mean()), float(values[-tail:].mean())


def reduce(points: list[tuple[int, float]], objective: Objective, total_steps: int) -> float | None:
    """The objective from the points logged so far; mean_last averages the last `fraction` of `total_steps` that
    ends at the newest point (so a value reported mid-run is comparable between trials at the same step)."""
    if not points:
        return None
    values = [value for _, value in points]
    if objective.reduce == "last":
        return values[-1]
    if objective.reduce == "max":
        return max(values)
    if objective.reduce == "min":
        return min(values)
    newest = points[-1][0]
    window = max(1, round(objective.fraction * total_steps))
    recent = [value for step, value in points if step > newest - window]
    return sum(recent) / len(recent)


def score(run_dir: str | Path, objective: Objective, total_steps: int, up_to: int | None = None) -> float | None:
    """The objective of the run in `run_dir`, over its steps <= `up_to` (all when None); None before it is logged."""
    points = read_scalars(run_dir, objective.scalar)
    if up_to is not None:
        points = [(step, value) for step, value in points if step <= up_to]
    return reduce(points, objective, total_steps)


def last_step(run_dir: str | Path) -> int | None:
    """The last training step the run logged (`run/restarts` goes with every step), 0-based; None before one."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    folder = Path(run_dir) / TB_DIR
    if not folder.is_dir():
        return None
    events = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    events.Reload()
    if STEP_TAG not in events.Tags()[SCALARS]:
        return None
    return max(event.step for event in events.Scalars(STEP_TAG))
