"""What a sweep has done: the trials table, results.csv, results.png (learning curves and objective against each
parameter), and the one-line progress a running sweep prints."""

from __future__ import annotations

import csv
from pathlib import Path

from agentrl.sweep import require
from agentrl.sweep.objective import last_step, read_scalars
from agentrl.sweep.study import Sweep

COLUMNS = ("trial", "seed", "params", "objective", "state", "steps", "wall_s")


def rows(sweep: Sweep, study, steps: bool = True) -> list[dict]:
    """One row per started trial (queued replicas left out), in trial order; `steps=False` leaves out each trial's
    last logged step, read from its TensorBoard files (the slow part)."""
    optuna = require("optuna")
    out = []
    for trial in study.get_trials(deepcopy=False):
        if trial.state == optuna.trial.TrialState.WAITING:
            continue
        record = sweep.read_runner(trial.number) or {}
        state = trial.state.name.lower()
        if state == "running":
            state = "running" if sweep.runner_alive(trial.number) else "stopped"
        params = {k: v for k, v in trial.params.items() if k != "seed"}
        out.append(
            {
                "trial": trial.number,
                "seed": trial.user_attrs.get("seed"),
                "params": params,
                "objective": trial.value,
                "state": state,
                "steps": last_step(sweep.trial_dir(trial.number)) if steps else None,
                "wall_s": record.get("wall_s"),
                "run_dir": str(sweep.trial_dir(trial.number)),
                "last_report": max(trial.intermediate_values.items(), default=None),
            }
        )
    return out


def best(sweep: Sweep, table: list[dict]) -> tuple[dict, float, int] | None:
    """The best point of the space by its mean objective over the seeds finished so far: (params, mean, seeds)."""
    by_point: dict[str, list] = {}
    for row in table:
        if row["state"] == "complete" and row["objective"] is not None:
            by_point.setdefault(repr(sorted(row["params"].items())), [row["params"], []])[1].append(row["objective"])
    if not by_point:
        return None
    sign = 1 if sweep.spec.objective.direction == "maximize" else -1
    params, values = max(by_point.values(), key=lambda item: sign * sum(item[1]) / len(item[1]))
    return params, sum(values) / len(values), len(values)


def progress_line(sweep: Sweep, study) -> str:
    table = rows(sweep, study, steps=False)  # computed every poll of a running sweep: no TensorBoard reads
    counts = {state: sum(row["state"] == state for row in table) for state in ("complete", "running", "pruned")}
    failed = sum(row["state"] in ("fail", "failed") for row in table)
    line = (
        f"{counts['complete']}/{sweep.spec.budget()} done, {counts['running']} running, {counts['pruned']} pruned"
        + (f", {failed} failed" if failed else "")
    )
    top = best(sweep, table)
    if top is not None:
        params, value, seeds = top
        line += f"; best {sweep.spec.objective.scalar} {value:.4g} with {_params_text(params)}"
        line += f" ({seeds} seed{'s' if seeds > 1 else ''})" if len(sweep.spec.seeds) > 1 else ""
    return line


def _params_text(params: dict) -> str:
    return " ".join(f"{key}={_value_text(value)}" for key, value in params.items())


def _value_text(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_table(sweep: Sweep, table: list[dict]) -> str:
    keys = sweep.spec.param_keys()
    header = ["trial", "seed", *keys, sweep.spec.objective.scalar, "state", "steps", "wall_s"]
    lines = [
        [
            str(row["trial"]),
            str(row["seed"]),
            *(_value_text(row["params"].get(key, "")) for key in keys),
            "" if row["objective"] is None else f"{row['objective']:.4g}",
            row["state"],
            "" if row["steps"] is None else str(row["steps"] + 1),
            "" if row["wall_s"] is None else f"{row['wall_s']:.0f}",
        ]
        for row in table
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines, strict=True)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, *lines]
    )


def write_csv(sweep: Sweep, table: list[dict], path: Path) -> Path:
    keys = sweep.spec.param_keys()
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["trial", "seed", *keys, "objective", "state", "steps", "wall_s", "run_dir"])
        for row in table:
            steps = None if row["steps"] is None else row["steps"] + 1
            writer.writerow(
                [
                    row["trial"],
                    row["seed"],
                    *(row["params"].get(k) for k in keys),
                    row["objective"],
                    row["state"],
                    steps,
                    row["wall_s"],
                    row["run_dir"],
                ]
            )
    return path


def write_plot(sweep: Sweep, table: list[dict], path: Path) -> Path:
    """Left: each trial's curve of the objective's scalar, coloured by its final objective; then one panel per
    parameter: the objective of each finished trial against the parameter's value."""
    matplotlib = require("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objective = sweep.spec.objective
    keys = sweep.spec.param_keys()
    finals = [row["objective"] for row in table if row["objective"] is not None]
    low, high = (min(finals), max(finals)) if finals else (0.0, 1.0)
    norm = matplotlib.colors.Normalize(vmin=low, vmax=high if high > low else low + 1.0)
    cmap = matplotlib.colormaps["viridis"]
    fig, axes = plt.subplots(1, 1 + len(keys), figsize=(5 * (1 + len(keys)), 4), squeeze=False)
    curves = axes[0][0]
    for row in table:
        points = read_scalars(row["run_dir"], objective.scalar)
        if not points:
            continue
        steps, values = zip(*points, strict=True)
        final = row["objective"]
        colour = "lightgrey" if final is None else cmap(norm(final))
        style = "--" if row["state"] == "pruned" else "-"
        curves.plot(steps, values, style, color=colour, marker="." if len(points) < 20 else None, lw=1)
    curves.set(title=f"{objective.scalar} per trial (dashed: pruned)", xlabel="step", ylabel=objective.scalar)
    fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=curves, label="final objective")
    for axis, key in zip(axes[0][1:], keys, strict=True):
        done = [row for row in table if row["objective"] is not None and key in row["params"]]
        values = [row["params"][key] for row in done]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        xs = values if numeric else [str(v) for v in values]
        axis.scatter(xs, [row["objective"] for row in done], c=[cmap(norm(row["objective"])) for row in done])
        dim = sweep.spec.space.get(key)
        if numeric and dim is not None and dim.log and values and all(v > 0 for v in values):
            axis.set_xscale("log")
        axis.set(title=f"objective against {key}", xlabel=key, ylabel=f"{objective.reduce} {objective.scalar}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def report(sweep: Sweep) -> str:
    """The table, with results.csv and results.png written into the sweep folder."""
    study = sweep.study()
    table = rows(sweep, study)
    csv_path = write_csv(sweep, table, sweep.dir / "results.csv")
    png_path = write_plot(sweep, table, sweep.dir / "results.png")
    text = format_table(sweep, table)
    return f"{text}\n{progress_line(sweep, study)}\nwrote {csv_path} and {png_path}"
