import re

import pytest

from agentrl.commands.config_doc import config_reference
from agentrl.config import ConfigError, from_dict, load_config

BASE = {"model": {"path": "some/model"}}


def test_defaults_validate():
    config = from_dict(BASE)
    assert config.layout.world_size == 2
    assert config.rollout.group_size == 8


def test_override_parses_yaml_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {path: m}\nrollout: {group_size: 4}\n")
    config = load_config(path, ["rollout.group_size=6", "optimizer.lr=3e-4", "resume=true", "env.kwargs.high=20"])
    assert config.rollout.group_size == 6
    assert config.optimizer.lr == 3e-4
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


@pytest.mark.parametrize(
    "weights, rollout, named",
    [
        ({"transport": "mpi"}, {}, "weights.transport=shm"),
        ({"shm_mapped": False}, {}, "weights.shm_mapped not false"),
        ({}, {"max_staleness": 1}, "rollout.max_staleness=0"),
    ],
)
def test_training_in_the_shared_window_needs_shm_mapped_weights_and_lockstep(weights, rollout, named):
    layout = {"trainer": 1, "rollout": 2}
    with pytest.raises(ConfigError, match=rf"weights.shm_in_place=true[\s\S]*{re.escape(named)}"):
        from_dict({**BASE, "layout": layout, "weights": {"shm_in_place": True, **weights}, "rollout": rollout})
    from_dict({**BASE, "layout": layout, "weights": weights, "rollout": rollout})  # auto: copies where it must
    from_dict({**BASE, "layout": layout, "weights": {"shm_in_place": True}})


def test_dynamic_dispatch_running_ahead_on_sglang_is_refused():
    base = {"dispatch": "dynamic", "max_staleness": 2, "tasks_per_step": 8}
    sglang = {**base, "engine": {"backend": "sglang"}}
    with pytest.raises(ConfigError, match=r"sglang engine takes them only between steps.*rollout\.dispatch=static"):
        from_dict({**BASE, "layout": {"trainer": 1, "rollout": 2}, "rollout": sglang})
    for rollout in (base, {**base, "partial_rollouts": False}):  # the torch engine takes them mid-step
        from_dict({**BASE, "layout": {"trainer": 1, "rollout": 2}, "rollout": rollout})
    from_dict({**BASE, "layout": {"trainer": 1, "rollout": 1}, "rollout": sglang})  # one rank: no wait


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="not key=value"):
        load_config(None, ["rollout.group_size"])


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent.yaml")


def test_reference_lists_every_section_field():
    text = config_reference()
    for name in ("rollout.group_size", "algorithm.kl_coef", "layout.env", "checkpoint.every", "run_dir"):
        assert f"`{name}`" in text


def test_docs_config_reference_is_up_to_date():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "config.md").read_text()
    block = page.split("<!-- config-reference:start -->")[1].split("<!-- config-reference:end -->")[0]
    assert block.strip() == config_reference().strip(), (
        "docs/config.md's config reference is stale: run `agentrl config-doc --write docs/config.md` "
        "(or paste the output of `agentrl config-doc` between its markers)"
    )


def test_renamed_fields_of_older_configs_still_load_and_say_the_new_name():
    config = from_dict(
        {
            **BASE,
            "trainer": {"lr": 0.01, "clip_eps_high": 0.3, "fsdp": False, "seed": 3},
            "rollout": {"backend": "torch"},
        }
    )
    assert config.optimizer.lr == 0.01 and config.algorithm.clip_eps_high == 0.3
    assert config.rollout.engine.backend == "torch" and config.parallelism.fsdp is False
    assert "trainer.lr is now optimizer.lr; please rename it" in config.notes
    assert any(note.startswith("trainer.seed is no longer read") for note in config.notes)
    with pytest.raises(ConfigError, match=r"trainer.lr was renamed optimizer.lr, and both are set"):
        from_dict({**BASE, "trainer": {"lr": 0.01}, "optimizer": {"lr": 0.02}})


def test_algorithm_options_are_validated_by_the_named_algorithm():
    config = from_dict({**BASE, "algorithm": {"name": "grpo", "adv_std_norm": False, "correction": {"mode": "tis"}}})
    assert type(config.algorithm).__name__ == "GRPOOptions" and config.algorithm.correction.mode == "tis"
    with pytest.raises(ConfigError, match=r"algorithm\.nonsense: unknown field[\s\S]*options of algorithm grpo"):
        from_dict({**BASE, "algorithm": {"name": "grpo", "nonsense": 1}})
    with pytest.raises(ConfigError, match=r"algorithm\.name: unknown algorithm 'grp' \(did you mean 'grpo'\?\)"):
        from_dict({**BASE, "algorithm": {"name": "grp"}})
    with pytest.raises(
        ConfigError, match=r"algorithm\.correction\.mode: Input should be 'none', 'tis', 'mask' or 'tis_mask'"
    ):
        from_dict({**BASE, "algorithm": {"correction": {"mode": "nope"}}})
    floored = from_dict({**BASE, "algorithm": {"name": "rloo", "entropy_coef": 0.2, "entropy_floor": 0.2}})
    assert floored.algorithm.entropy_floor == 0.2
    with pytest.raises(ConfigError, match=r"entropy_coef is 0, so there is no bonus to cap; set entropy_coef"):
        from_dict({**BASE, "algorithm": {"name": "rloo", "entropy_floor": 0.2}})
    with pytest.raises(ConfigError, match=r"entropy_schedule=lr scales the entropy bonus.*no bonus to schedule"):
        from_dict({**BASE, "algorithm": {"name": "rloo", "entropy_schedule": "lr"}})
    with pytest.raises(ConfigError, match=r"entropy_on=failed places the entropy bonus.*no bonus to place"):
        from_dict({**BASE, "algorithm": {"name": "rloo", "entropy_on": "failed"}})
    with pytest.raises(ConfigError, match=r"entropy_measure=uniform_kl picks the entropy bonus.*no bonus to measure"):
        from_dict({**BASE, "algorithm": {"name": "rloo", "entropy_measure": "uniform_kl"}})
    with pytest.raises(ConfigError, match=r"entropy_schedule: Input should be 'constant' or 'lr'"):
        from_dict({**BASE, "algorithm": {"name": "rloo", "entropy_coef": 0.2, "entropy_schedule": "cosine"}})


def test_engine_options_belong_to_their_backend():
    config = from_dict({**BASE, "rollout": {"engine": {"backend": "sglang", "tp_size": 2}}})
    assert config.rollout.engine.tp_size == 2
    with pytest.raises(ConfigError, match=r"rollout\.engine\.torch\.tp_size: unknown field"):
        from_dict({**BASE, "rollout": {"engine": {"backend": "torch", "tp_size": 2}}})


def test_checks_that_need_only_the_config_run_at_parse_time():
    with pytest.raises(ConfigError, match=r"parallelism.fsdp=true needs at least 2 trainer ranks"):
        from_dict({**BASE, "parallelism": {"fsdp": True}})
    with pytest.raises(ConfigError, match=r"weights.transport=nccl cannot join a trainer and a rollout rank"):
        from_dict({**BASE, "layout": {"trainer": 1, "rollout": 1, "colocate": True}, "weights": {"transport": "nccl"}})
    # whether cuda_ipc can serve depends on the GPUs found at start (agentrl.weights.resolve_weight_sync)
    assert from_dict({**BASE, "weights": {"transport": "cuda_ipc"}}).weights.transport == "cuda_ipc"


def test_saved_config_loads_back_equal(tmp_path):
    from agentrl.config import save_config

    config = from_dict({**BASE, "algorithm": {"adv_std_norm": False, "loss_agg": "seq-mean-token-mean"}})
    save_config(config, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == config


def test_reference_shows_literal_choices_and_each_union_member():
    text = config_reference()
    assert "`'constant' \\| 'linear' \\| 'cosine'`" in text
    assert "#### `rollout.engine` with `backend: sglang`" in text and "`rollout.engine.tp_size`" in text
    assert "#### `algorithm.name: grpo`" in text and "`algorithm.correction.mode`" in text


def test_yaml_syntax_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("model:\n  path: m\nsteps 800\n  bad: [\n")
    with pytest.raises(ConfigError, match=r"typo.yaml is not valid YAML, .*\(line 3, column 1\).*\(line 4"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"override 'steps=\[1' is not valid YAML"):
        load_config(None, ["model.path=m", "steps=[1"])


def test_an_engine_option_alone_picks_the_torch_engine():
    config = load_config(None, ["model.path=m", "rollout.engine.scheduler=continuous"])
    assert config.rollout.engine.backend == "torch" and config.rollout.engine.scheduler == "continuous"
    with pytest.raises(ConfigError, match=r"rollout\.engine\.torch\.tp_size: unknown field"):
        load_config(None, ["model.path=m", "rollout.engine.tp_size=2"])  # an SGLang option needs backend=sglang


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback():
    """`agentrl config-doc | head`: the command stops quietly, as a shell tool does, with SIGPIPE's status."""
    import fcntl
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # the reference is ~50 KB: more than the pipe holds
    command = [sys.executable, "-c", "from agentrl.cli import entry_point; entry_point()", "config-doc"]
    process = subprocess.Popen(command, stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.read(100)
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141 and "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
