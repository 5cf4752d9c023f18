import pytest

from agentrl.config import ConfigError, config_reference, from_dict, load_config

BASE = {"model": {"path": "some/model"}}


def test_defaults_validate():
    config = from_dict(BASE)
    assert config.layout.world_size == 2
    assert config.rollout.group_size == 8


def test_override_parses_yaml_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {path: m}\nrollout: {group_size: 4}\n")
    config = load_config(path, ["rollout.group_size=6", "trainer.lr=3e-4", "resume=true", "env.kwargs.high=20"])
    assert config.rollout.group_size == 6
    assert config.trainer.lr == 3e-4
    assert config.resume is True
    assert config.env.kwargs == {"high": 20}


def test_unknown_field_names_the_field():
    with pytest.raises(ConfigError, match=r"rollout\.grup_size: unknown field"):
        from_dict({**BASE, "rollout": {"grup_size": 3}})


def test_bounds_name_field_and_value():
    with pytest.raises(ConfigError, match=r"rollout\.group_size: .*greater than or equal to 2.*got 1"):
        from_dict({**BASE, "rollout": {"group_size": 1}})


def test_missing_model_path_is_reported():
    with pytest.raises(ConfigError, match=r"model: required field is missing"):
        from_dict({})


def test_batch_must_split_over_ranks():
    with pytest.raises(ConfigError, match=r"tasks_per_step=6 must be a multiple of .* = 4"):
        from_dict({**BASE, "layout": {"trainer": 2, "rollout": 2}, "rollout": {"tasks_per_step": 6}})


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="not key=value"):
        load_config(None, ["rollout.group_size"])


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent.yaml")


def test_reference_lists_every_section_field():
    text = config_reference()
    for name in ("rollout.group_size", "trainer.kl_coef", "layout.env", "checkpoint.every", "run_dir"):
        assert f"`{name}`" in text


def test_readme_config_reference_is_up_to_date():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("<!-- config-reference:start -->")[1].split("<!-- config-reference:end -->")[0]
    assert block.strip() == config_reference().strip(), (
        "README's config reference is stale: paste the output of `agentrl config-doc` between its markers"
    )


def test_yaml_syntax_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("model:\n  path: m\nsteps 800\n  bad: [\n")
    with pytest.raises(ConfigError, match=r"typo.yaml is not valid YAML, .*\(line 3, column 1\).*\(line 4"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"override 'steps=\[1' is not valid YAML"):
        load_config(None, ["model.path=m", "steps=[1"])
