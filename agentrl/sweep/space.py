"""The search space: a trial's values drawn through Optuna, and the config they make, checked before any trial runs."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from agentrl.config.load import apply_override, from_dict, merge_override, parse_yaml
from agentrl.sections import ConfigError
from agentrl.sweep.spec import SpecError, SweepSpec


def base_data(spec: SweepSpec, name: str | None = None) -> dict:
    """A base config's YAML (`base:`, or `bases:` by name) with the spec's fixed overrides, then the named base's
    own, applied (not validated yet). An override's mapping merges into the base's (nested mappings are dotted
    keys); a search-space value replaces the field it names."""
    named = spec.named_bases()[name]
    data = parse_yaml(Path(named.config).read_text(), f"config file {named.config}") or {}
    if not isinstance(data, dict):
        raise SpecError(f"{base_label(name)}: {named.config} must hold a mapping of config sections")
    for key, value in [*spec.overrides.items(), *named.overrides.items()]:
        merge_override(data, key.split("."), value)
    return data


def base_label(name: str | None) -> str:
    return "base" if name is None else f"bases.{name}"


def trial_data(base: dict, params: dict[str, Any], seed: int, run_dir: str | Path) -> dict:
    """The full config of one trial: the base with its sampled values (the base's name among them is not a config
    field), seed and run folder."""
    data = copy.deepcopy(base)
    for key, value in params.items():
        if key != "base":
            apply_override(data, key.split("."), value)
    data["seed"], data["run_dir"] = seed, str(run_dir)
    return data


def group_trial(data: dict, sweep_dir: str | Path, number: int) -> dict:
    """A trial's place in W&B and MLflow, where the base config and overrides leave it open: the sweep folder's
    name as its group (one W&B group, one MLflow experiment), `<sweep>-NNNN` as its run name, and with mlflow
    listed but no store named (nor MLFLOW_TRACKING_URI set), one file store for every trial: sweep_dir/mlruns."""
    sweep_dir = Path(sweep_dir).resolve()
    data = copy.deepcopy(data)
    logging = data.setdefault("logging", {})
    if not isinstance(logging, dict):
        return data  # the config loader names the problem
    logging.setdefault("group", sweep_dir.name)
    logging.setdefault("run_name", f"{sweep_dir.name}-{number:04d}")
    backends = logging.get("backends") or []
    listed = "mlflow" in ([backends] if isinstance(backends, str) else backends)
    if listed and not os.environ.get("MLFLOW_TRACKING_URI"):
        mlflow = logging.setdefault("mlflow", {})
        if isinstance(mlflow, dict) and mlflow.get("tracking_uri") is None:
            mlflow["tracking_uri"] = (sweep_dir / "mlruns").as_uri()
    return data


def check_space(spec: SweepSpec) -> None:
    """Validate the base with its overrides, then every choice and both ends of every range, through the config
    loader: a key the config lacks or a value it refuses fails here, naming the spec field."""
    probe_dir = Path(spec.sweep_dir) / "trials" / "check"
    for name, named in spec.named_bases().items():
        base, label = base_data(spec, name), base_label(name)
        try:
            config = from_dict(
                trial_data(base, {}, spec.seeds[0], probe_dir), source=f"{label} {named.config} with overrides"
            )
        except ConfigError as error:
            raise SpecError(f"sweep spec: the {label} config with its overrides is refused:\n{error}") from None
        for key, dimension in spec.space.items():
            for value in dimension.edges():
                try:
                    from_dict(
                        trial_data(base, {key: value}, spec.seeds[0], probe_dir),
                        source=f"space.{key}={value!r}" + (f" on {label}" if name else ""),
                    )
                except ConfigError as error:
                    raise SpecError(
                        f"sweep spec: space.{key} = {value!r} is refused by the config loader"
                        + (f" on {label}" if name else "")
                        + f"; fix the key (dotted, as in `agentrl train` overrides) or its values:\n{error}"
                    ) from None
        if spec.pruner.name != "none" and config.eval.every == 0 and "eval.every" not in spec.space:
            raise SpecError(
                f"sweep spec: pruner: {spec.pruner.name} judges trials at their evaluations, and the "
                f"{label} trial config has eval.every: 0; set overrides: {{eval.every: N}} or "
                "pruner: {name: none}"
            )


def suggest(trial, spec: SweepSpec) -> dict[str, Any]:
    """The trial's values, drawn by its study's sampler (fixed when the trial was enqueued or is a grid point)."""
    params = {}
    if spec.bases:
        params["base"] = trial.suggest_categorical("base", list(spec.bases))
    for key, dim in spec.space.items():
        if spec.method == "grid":
            params[key] = trial.suggest_categorical(key, dim.grid_values(key))
        elif dim.choice:
            params[key] = trial.suggest_categorical(key, dim.choice)
        elif dim.float_range:
            low, high = dim.float_range
            params[key] = trial.suggest_float(key, low, high, log=dim.log, step=dim.step)
        else:
            low, high = dim.int_range
            params[key] = trial.suggest_int(key, low, high, log=dim.log, step=int(dim.step or 1))
    if spec.method == "grid":  # the seed is one of the grid's dimensions (random and TPE queue a point's seeds)
        params["seed"] = trial.suggest_categorical("seed", list(spec.seeds))
    return params
