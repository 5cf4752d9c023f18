"""The sweep spec: a base config with fixed overrides, a search space, the method, the objective and the budget."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrl.config.load import parse_yaml
from agentrl.sections import ConfigError, Section, format_validation_error

Scalar = bool | int | float | str | None
# Fields a sweep sets itself for every trial; the space and the overrides may not.
RESERVED = ("run_dir", "seed", "resume")


class SpecError(ConfigError):
    """A sweep spec that cannot run; the message names the field and the fix."""


class Dimension(Section):
    """One searched field: `choice: [...]`, or a range `float: [low, high]` / `int: [low, high]`."""

    choice: list[Scalar] | None = Field(None, description="Values to pick from (numbers, strings, booleans).")
    float_range: tuple[float, float] | None = Field(None, alias="float", description="[low, high] of a float.")
    int_range: tuple[int, int] | None = Field(None, alias="int", description="[low, high] of an integer, inclusive.")
    log: bool = Field(False, description="Sample the range uniformly in log space (learning rates).")
    step: float | None = Field(None, gt=0, description="Range values are low + k * step (linear ranges only).")
    grid: int | None = Field(
        None, ge=2, description="method: grid: points taken from the range (evenly spaced, in log space with log)."
    )

    model_config: ClassVar[ConfigDict] = ConfigDict(**Section.model_config, populate_by_name=True)

    @model_validator(mode="after")
    def _one_kind(self):
        kinds = [k for k, v in (("choice", self.choice), ("float", self.float_range), ("int", self.int_range)) if v]
        if len(kinds) != 1:
            raise ValueError(
                "give exactly one of choice: [a, b, ...], float: [low, high] or int: [low, high]"
                + (f" (got {', '.join(kinds)})" if kinds else "")
            )
        low_high = self.float_range or self.int_range
        if low_high is not None:
            low, high = low_high
            if not low < high:
                raise ValueError(f"the range's low must be below its high (got [{low}, {high}])")
            if self.log and low <= 0:
                raise ValueError(f"a log range needs low > 0 (got {low}); drop log: true or raise low")
            if self.log and self.step is not None:
                raise ValueError("step works on linear ranges only; drop step or log")
        elif self.log or self.step is not None or self.grid is not None:
            raise ValueError("log, step and grid apply to ranges; a choice lists its values")
        return self

    @property
    def kind(self) -> str:
        return "choice" if self.choice else "float" if self.float_range else "int"

    def edges(self) -> list[Scalar]:
        """Values that must all be valid config values: every choice, or both ends of the range."""
        return list(self.choice) if self.choice else list(self.float_range or self.int_range)

    def grid_values(self, key: str) -> list[Scalar]:
        if self.choice:
            return list(self.choice)
        low, high = self.float_range or self.int_range
        if self.grid is None:
            if self.int_range and not self.log:
                return list(range(low, high + 1, int(self.step or 1)))
            raise SpecError(
                f"space.{key}: method: grid needs the points of this range; add grid: N (e.g. grid: 3) or list "
                "them with choice: [...]"
            )
        if self.log:
            ratio = math.log(high / low) / (self.grid - 1)
            points = [low * math.exp(i * ratio) for i in range(self.grid)]
        else:
            points = [low + i * (high - low) / (self.grid - 1) for i in range(self.grid)]
        if self.int_range:
            return sorted({round(p) for p in points})
        return [float(f"{p:.6g}") for p in points]


class Objective(Section):
    """What a trial scores: one TensorBoard scalar of its run, reduced to one number."""

    scalar: str = Field("eval/success", description="TensorBoard tag, e.g. eval/success or episode/success_rate.")
    reduce: Literal["last", "mean_last", "max", "min"] = Field(
        "last",
        description="last: the value at the last step logged; mean_last: the mean over the last `fraction` of the "
        "run's steps; max / min over the run.",
    )
    fraction: float = Field(0.1, gt=0, le=1, description="reduce: mean_last: the share of the run's steps averaged.")
    direction: Literal["maximize", "minimize"] = Field("maximize", description="Whether higher or lower is better.")


class Pruner(Section):
    """Early stopping: a trial reports its objective at each of its evaluations; hopeless ones stop gracefully."""

    name: Literal["none", "median", "halving"] = Field(
        "none",
        description="none: every trial runs to the end; median: Optuna's MedianPruner (stop a trial below the "
        "median of earlier trials at the same step); halving: SuccessiveHalvingPruner (asynchronous rungs).",
    )
    startup_trials: int = Field(2, ge=0, description="median: trials that finish before any is pruned.")
    warmup_steps: int = Field(0, ge=0, description="median: training steps a trial runs before it may be pruned.")
    min_resource: int | None = Field(
        None, ge=1, description="halving: the step of the first rung; None: the trial config's eval.every."
    )
    reduction_factor: int = Field(3, ge=2, description="halving: 1 in reduction_factor trials goes on at each rung.")


class NamedBase(Section):
    """One of several base configs (`bases:`): its config file, overrides of its own, and its ranks per trial."""

    config: str = Field(description="Config YAML, e.g. launch/configs/frozen_lake.yaml.")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Fixed overrides for this base only, applied after the spec's overrides."
    )
    ranks: int | None = Field(None, ge=1, description="Ranks per trial of this base; None: the spec's ranks.")

    @field_validator("overrides")
    @classmethod
    def _not_reserved(cls, value: dict) -> dict:
        return _refuse_reserved(value)


def _refuse_reserved(value: dict) -> dict:
    for key in value:
        if key in RESERVED:
            raise ValueError(
                f"{key} is set by the sweep for every trial; "
                + ("list training seeds under seeds: [...]" if key == "seed" else f"remove {key}")
            )
    return value


class SweepSpec(Section):
    """A whole sweep (docs/sweeps.md)."""

    base: str | None = Field(
        None, description="The config every trial starts from, e.g. launch/configs/quickstart.yaml (or bases:)."
    )
    bases: dict[str, NamedBase] | None = Field(
        None,
        description="Instead of base: several named configs, searched as one more dimension, `base` (e.g. the "
        "envs of a learning table); each with overrides and ranks of its own.",
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="Fixed `key: value` overrides of the base config, dotted keys as in train; a nested mapping "
        "merges into the base's section, changing only the fields it names.",
    )
    sweep_dir: str = Field(description="Folder of the sweep: study journal, trials/NNNN run folders, results.")
    space: dict[str, Dimension] = Field(description="Dotted config key -> its range or choices.")
    seeds: list[int] = Field(
        default_factory=lambda: [0],
        min_length=1,
        description="Training seeds: every point of the space runs once on each (each run is one trial); its "
        "score is the mean over its seeds.",
    )
    method: Literal["grid", "random", "tpe"] = Field(
        "tpe", description="grid: every point (GridSampler); random: RandomSampler; tpe: TPESampler."
    )
    sampler_seed: int = Field(0, description="Seed of the sampler (which points are tried).")
    objective: Objective = Field(default_factory=Objective)
    pruner: Pruner = Field(default_factory=Pruner)
    trials: int | None = Field(
        None, ge=1, description="Trials (runs) in all, seeds included; None with method: grid: the whole grid."
    )
    concurrency: int = Field(1, ge=1, description="Trials running at once (local), or the array's %K (SLURM).")
    ranks: int = Field(1, ge=1, description="Ranks per trial: 1 runs `agentrl train` alone, N: `mpirun -n N`.")
    agentrl_command: list[str] | None = Field(
        None,
        min_length=1,
        description="The command that starts `agentrl` for each trial (each of its ranks under mpirun), e.g. "
        "[apptainer, exec, image.sif, agentrl] to train in a container; None: this environment's `agentrl`.",
    )
    cores: int | None = Field(
        None, ge=1, description="Local: cores split between the running trials; None: the cores this process may use."
    )

    @field_validator("overrides", "space")
    @classmethod
    def _not_reserved(cls, value: dict) -> dict:
        return _refuse_reserved(value)

    @model_validator(mode="after")
    def _one_base_and_a_budget(self):
        if (self.base is None) == (self.bases is None):
            raise ValueError(
                "give the config trials start from as base: PATH, or several as bases: {name: {config: PATH}} "
                + ("(not both)" if self.base else "(neither is set)")
            )
        if self.bases is not None and not self.bases:
            raise ValueError("bases: is empty; name at least one config, or use base: PATH")
        if "base" in self.space:
            raise ValueError("space.base: the base is searched through bases: {name: {config: PATH}}, not space")
        if self.trials is None and self.method != "grid":
            raise ValueError(f"method: {self.method} needs a budget; set trials: N (runs, seeds included)")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds repeat a value ({self.seeds}); list each seed once")
        return self

    def grid_space(self) -> dict[str, list[Scalar]]:
        """method: grid: each key's values, the base's name and the seed among them (Optuna's GridSampler space)."""
        named = {"base": list(self.bases)} if self.bases else {}
        return {**named, **{key: dim.grid_values(key) for key, dim in self.space.items()}, "seed": list(self.seeds)}

    def param_keys(self) -> list[str]:
        """A trial's searched values, in table order: the base's name (with bases:), then the space's keys."""
        return (["base"] if self.bases else []) + list(self.space)

    def named_bases(self) -> dict[str | None, NamedBase]:
        """Every base a trial may start from, by name (None: the one `base:`)."""
        if self.bases is None:
            return {None: NamedBase(config=self.base)}
        return dict(self.bases)

    def ranks_for(self, base: str | None) -> int:
        named = self.named_bases()[base]
        return named.ranks or self.ranks

    def most_ranks(self) -> int:
        return max(self.ranks_for(name) for name in self.named_bases())

    def budget(self) -> int:
        if self.trials is not None:
            return self.trials
        return math.prod(len(values) for values in self.grid_space().values())


def parse_spec(data: Any, source: str, base_dir: Path | None = None) -> SweepSpec:
    """Validate a spec mapping; a relative `base` is looked up in the current folder, then beside the spec."""
    if not isinstance(data, dict):
        raise SpecError(
            f"sweep spec {source} must hold a mapping (base, sweep_dir, space, ...), not {type(data).__name__}"
        )
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as error:
        raise SpecError(
            format_validation_error(error, f"sweep spec {source}").replace("invalid config", "invalid sweep spec", 1)
        ) from None
    update = {"sweep_dir": str(Path(spec.sweep_dir).resolve())}
    if spec.base is not None:
        update["base"] = _config_file(spec.base, "base", source, base_dir)
    else:
        update["bases"] = {}
        for name, named in spec.bases.items():
            config = _config_file(named.config, f"bases.{name}.config", source, base_dir)
            update["bases"][name] = named.model_copy(update={"config": config})
    return spec.model_copy(update=update)


def _config_file(given: str, field: str, source: str, base_dir: Path | None) -> str:
    path = Path(given)
    if not path.is_absolute() and not path.is_file() and base_dir is not None and (base_dir / path).is_file():
        path = base_dir / path
    if not path.is_file():
        raise SpecError(f"sweep spec {source}: {field}: {given} does not exist; point it at a config YAML")
    return str(path.resolve())


def load_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"sweep spec {path} does not exist; pass a YAML file such as launch/sweeps/quickstart_lr.yaml")
    return parse_spec(parse_yaml(path.read_text(), f"sweep spec {path}"), str(path), path.parent)


def dump_spec(spec: SweepSpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)
