"""The sweep spec and its space: errors that name the field and the fix, values drawn through a real Optuna study
(grid points times seeds, seed replicas, ranges), and trial configs the config loader accepts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

pytest.importorskip("optuna")

from agentrl.config import load_config
from agentrl.sweep.space import check_space
from agentrl.sweep.spec import SpecError, load_spec, parse_spec
from agentrl.sweep.study import Sweep
from tests.conftest import ROOT

BASE = str(ROOT / "launch" / "configs" / "quickstart.yaml")


def spec_data(tmp_path, **changes) -> dict:
    data = {
        "base": BASE,
        "sweep_dir": str(tmp_path / "sweep"),
        "overrides": {"steps": 6, "eval.every": 2},
        "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}, "rollout.group_size": {"choice": [2, 4]}},
        "method": "random",
        "trials": 4,
    }
    data.update(changes)
    return data


def refused(tmp_path, **changes) -> str:
    with pytest.raises(SpecError) as caught:
        spec = parse_spec(spec_data(tmp_path, **changes), "test.yaml")
        check_space(spec)
    return str(caught.value)


def test_spec_errors_name_the_field_and_the_fix(tmp_path):
    message = refused(tmp_path, space={"optimizer.lr": {"float": [0.0, 1e-2], "log": True}})
    assert "space.optimizer.lr" in message and "log range needs low > 0" in message
    message = refused(tmp_path, space={"optimizer.lr": {"choice": [1e-3], "float": [1e-4, 1e-2]}})
    assert "exactly one of choice" in message
    assert "seeds: [...]" in refused(tmp_path, space={"seed": {"choice": [0, 1]}})
    assert "set trials: N" in refused(tmp_path, method="tpe", trials=None)
    assert "base: nowhere.yaml does not exist" in refused(tmp_path, base="nowhere.yaml")
    assert "spaec" in refused(tmp_path, spaec={}) and "unknown field" in refused(tmp_path, spaec={})


def test_a_bad_space_key_or_value_fails_at_sweep_start_naming_it(tmp_path):
    message = refused(tmp_path, space={"rollout.group_sise": {"choice": [2, 4]}})
    assert "space.rollout.group_sise" in message and "group_sise: unknown field" in message
    message = refused(tmp_path, space={"eval.top_p": {"float": [0.5, 1.5]}})  # top_p <= 1: the high end is refused
    assert "space.eval.top_p = 1.5" in message and "eval.top_p" in message
    message = refused(tmp_path, pruner={"name": "median"}, overrides={"eval.every": 0})
    assert "eval.every: 0" in message and "pruner" in message


def test_grid_runs_every_point_on_every_seed_and_each_trial_config_loads(tmp_path):
    data = spec_data(
        tmp_path,
        method="grid",
        trials=None,
        seeds=[0, 1],
        space={
            "optimizer.lr": {"float": [1e-4, 1e-2], "log": True, "grid": 3},
            "rollout.group_size": {"choice": [2, 4]},
        },
    )
    spec = parse_spec(data, "test.yaml")
    assert spec.grid_space()["optimizer.lr"] == [1e-4, 1e-3, 1e-2]
    assert spec.budget() == 3 * 2 * 2
    sweep = Sweep(spec)
    sweep.create_or_check(resume=False)
    study = sweep.study()
    claims = []
    while (claim := sweep.claim_next(study)) is not None:
        claims.append(claim)
        study.tell(claim.number, 0.0)
    points = {(c.params["optimizer.lr"], c.params["rollout.group_size"], c.seed) for c in claims}
    assert len(claims) == len(points) == 12
    config = load_config(sweep.config_path(claims[5].number))
    assert config.seed == claims[5].seed and config.optimizer.lr == claims[5].params["optimizer.lr"]
    assert config.run_dir == str(sweep.trial_dir(claims[5].number)) and config.steps == 6


def test_random_draws_inside_the_ranges_and_replays_each_point_on_every_seed(tmp_path):
    space = {
        "optimizer.lr": {"float": [1e-4, 1e-2], "log": True},
        "rollout.temperature": {"float": [0.5, 1.0], "step": 0.25},
        "rollout.group_size": {"int": [2, 8]},
    }
    spec = parse_spec(spec_data(tmp_path, seeds=[3, 4], trials=8, space=space), "test.yaml")
    sweep = Sweep(spec)
    sweep.create_or_check(resume=False)
    study = sweep.study()
    claims = []
    while (claim := sweep.claim_next(study)) is not None:
        claims.append(claim)
        study.tell(claim.number, 1.0)
    assert len(claims) == 8
    for first, second in zip(claims[::2], claims[1::2], strict=True):  # a new point, then its other seed
        assert (first.seed, second.seed) == (3, 4) and first.params == second.params
    lrs = [c.params["optimizer.lr"] for c in claims[::2]]
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs) and len(set(lrs)) == 4
    assert all(c.params["rollout.temperature"] in (0.5, 0.75, 1.0) for c in claims)
    assert all(
        isinstance(c.params["rollout.group_size"], int) and 2 <= c.params["rollout.group_size"] <= 8 for c in claims
    )
    assert max(math.log10(lr) for lr in lrs) - min(math.log10(lr) for lr in lrs) > 0.3  # spread, not one value


def test_a_started_sweep_refuses_a_changed_spec_or_a_restart_without_resume(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec_data(tmp_path)))
    Sweep(load_spec(spec_path)).create_or_check(resume=False)
    with pytest.raises(Exception, match="--resume"):
        Sweep(load_spec(spec_path)).create_or_check(resume=False)
    Sweep(load_spec(spec_path)).create_or_check(resume=True)
    spec_path.write_text(yaml.safe_dump(spec_data(tmp_path, trials=9)))
    with pytest.raises(Exception, match=r"changed: trials"):
        Sweep(load_spec(spec_path)).create_or_check(resume=True)


def trial_configs(tmp_path, **changes) -> list:
    sweep = Sweep(parse_spec(spec_data(tmp_path, trials=2, **changes), "test.yaml"))
    sweep.create_or_check(resume=False)
    study = sweep.study()
    configs = []
    while (claim := sweep.claim_next(study)) is not None:
        configs.append(load_config(sweep.config_path(claim.number)))
        study.tell(claim.number, 0.0)
    return configs


def test_trials_share_one_wandb_group_and_one_mlflow_experiment_and_store(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    overrides = {"steps": 6, "eval.every": 2, "logging.backends": ["wandb", "mlflow"]}
    configs = trial_configs(tmp_path, sweep_dir=str(tmp_path / "lr-sweep"), overrides=overrides)
    assert [c.logging.group for c in configs] == ["lr-sweep", "lr-sweep"]
    assert [c.logging.run_name for c in configs] == ["lr-sweep-0000", "lr-sweep-0001"]
    store = (tmp_path / "lr-sweep" / "mlruns").as_uri()
    assert [c.logging.mlflow.tracking_uri for c in configs] == [store, store]


def test_a_group_or_store_named_by_the_spec_or_the_environment_is_kept(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    overrides = {"logging.group": "mine", "logging.backends": ["mlflow"], "logging.mlflow.tracking_uri": "http://x"}
    (config, _) = trial_configs(tmp_path / "a", overrides=overrides)
    assert (config.logging.group, config.logging.mlflow.tracking_uri) == ("mine", "http://x")
    (config, _) = trial_configs(tmp_path / "b")  # no mlflow listed: no store named
    assert config.logging.group == "sweep" and config.logging.mlflow.tracking_uri is None
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    (config, _) = trial_configs(tmp_path / "c", overrides={"logging.backends": ["mlflow"]})
    assert config.logging.mlflow.tracking_uri is None  # the trial's environment names it


FROZEN_LAKE = str(ROOT / "launch" / "configs" / "frozen_lake.yaml")


def test_bases_are_one_more_grid_dimension_each_with_its_overrides_and_ranks(tmp_path):
    bases = {
        "quickstart": {"config": BASE, "ranks": 4},
        "frozen_lake": {"config": FROZEN_LAKE, "overrides": {"steps": 3}},
    }
    data = spec_data(tmp_path, method="grid", trials=None, seeds=[0, 1], ranks=3, bases=bases)
    del data["base"]
    data["space"] = {"algorithm.name": {"choice": ["grpo", "rloo"]}}
    spec = parse_spec(data, "test.yaml")
    check_space(spec)
    assert spec.param_keys() == ["base", "algorithm.name"] and spec.budget() == 2 * 2 * 2
    assert (spec.ranks_for("quickstart"), spec.ranks_for("frozen_lake"), spec.most_ranks()) == (4, 3, 4)
    sweep = Sweep(spec)
    sweep.create_or_check(resume=False)
    study = sweep.study()
    seen = set()
    while (claim := sweep.claim_next(study)) is not None:
        config = load_config(sweep.config_path(claim.number))
        base = claim.params["base"]
        seen.add((base, claim.params["algorithm.name"], claim.seed))
        assert config.env.id == ("guess_number" if base == "quickstart" else "frozen_lake")
        assert config.steps == (6 if base == "quickstart" else 3)  # the spec's overrides, then the base's own
        assert config.algorithm.name == claim.params["algorithm.name"] and config.seed == claim.seed
        study.tell(claim.number, 0.0)
    assert len(seen) == 8


def test_bases_errors_name_the_field(tmp_path):
    assert "not both" in refused(tmp_path, bases={"a": {"config": BASE}})
    assert "neither is set" in refused(tmp_path, base=None)
    assert "bases.a.config: nowhere.yaml does not exist" in refused(
        tmp_path, base=None, bases={"a": {"config": "nowhere.yaml"}}
    )
    message = refused(tmp_path, base=None, bases={"a": {"config": BASE, "overrides": {"rollout.group_sise": 2}}})
    assert "bases.a" in message and "group_sise" in message
    assert "through bases:" in refused(tmp_path, space={"base": {"choice": ["a"]}})
    assert "seeds: [...]" in refused(tmp_path, base=None, bases={"a": {"config": BASE, "overrides": {"seed": 1}}})


def test_agentrl_command_starts_each_trial_alone_or_each_rank_under_mpirun(tmp_path):
    from agentrl.sweep.runner import launch_command

    container = ["apptainer", "exec", "image.sif", "agentrl"]
    spec = parse_spec(spec_data(tmp_path, agentrl_command=container), "test.yaml")
    assert launch_command(1, spec.agentrl_command) == [*container, "train"]
    mpirun, flag, ranks, *rest = launch_command(4, spec.agentrl_command)
    assert Path(mpirun).name == "mpirun" and (flag, ranks) == ("-n", "4") and rest == [*container, "train"]
    default = launch_command(1, parse_spec(spec_data(tmp_path), "test.yaml").agentrl_command)
    assert Path(default[0]).name == "agentrl" and default[1:] == ["train"]
    assert "agentrl_command" in refused(tmp_path, agentrl_command=[])


SHIPPED_SPECS = sorted([*(ROOT / "launch" / "sweeps").glob("*.yaml"), *(ROOT / "benchmarks" / "sweeps").glob("*.yaml")])


@pytest.mark.parametrize("path", SHIPPED_SPECS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_shipped_spec_loads_and_its_trial_configs_pass_the_loader(path):
    """The specs a user runs (launch/sweeps/) and those behind the measurements in the docs (benchmarks/sweeps/)."""
    check_space(load_spec(path))


def test_an_override_mapping_changes_only_the_fields_it_names(tmp_path):
    """`rollout: {tasks_per_step: 16}` is `rollout.tasks_per_step: 16`: the base's other rollout fields stay (a
    mapping that replaced the section ran the quickstart with the default rollout, many tokens a turn)."""
    from agentrl.sweep.space import base_data

    base = yaml.safe_load(Path(BASE).read_text())
    overrides = {"rollout": {"tasks_per_step": 16}, "env": {"kwargs": {"high": 9}}, "model.tiny": {"num_layers": 3}}
    data = spec_data(tmp_path, overrides=overrides, space={"algorithm.name": {"choice": ["grpo"]}}, method="grid")
    spec = parse_spec(data, "test.yaml")
    check_space(spec)
    merged = base_data(spec)
    assert merged["rollout"] == {**base["rollout"], "tasks_per_step": 16}
    assert merged["env"]["kwargs"] == {**base["env"]["kwargs"], "high": 9} and merged["env"]["id"] == base["env"]["id"]
    assert merged["model"]["tiny"] == {**base["model"]["tiny"], "num_layers": 3}
    assert merged["algorithm"] == base["algorithm"]
