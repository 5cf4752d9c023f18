"""model.tiny builds the random model it describes, init_std included."""

import json

import pytest
import torch
from safetensors.torch import load_file

from agentrl.config.schema import ModelConfig
from agentrl.errors import UserError
from agentrl.trainer.model import ensure_model

TEXTS = ["You have 3 guesses. The number is between 1 and 7", "higher, between 5 and 7"]


@pytest.mark.parametrize("init_std", [0.02, 0.1])
def test_init_std_sets_the_spread_of_the_random_weights(tmp_path, init_std):
    path = tmp_path / "model"
    ensure_model(ModelConfig(path=str(path), tiny={"hidden_size": 64, "init_std": init_std}), lambda: TEXTS)
    assert json.loads((path / "config.json").read_text())["initializer_range"] == init_std
    weights = load_file(path / "model.safetensors")
    gate = weights["model.layers.0.mlp.gate_proj.weight"]  # 256 x 64 normal draws
    assert float(gate.std()) == pytest.approx(init_std, rel=0.05)
    assert torch.isfinite(gate).all()


def test_a_folder_built_from_another_tiny_section_is_refused_not_reused(tmp_path):
    path = tmp_path / "model"
    ensure_model(ModelConfig(path=str(path), tiny={"hidden_size": 32}), lambda: TEXTS)
    weights = (path / "model.safetensors").read_bytes()
    ensure_model(ModelConfig(path=str(path), tiny={"hidden_size": 32}), lambda: TEXTS)  # the same section: reused
    with pytest.raises(UserError, match=r"init_std: 0\.02 there, 0\.1 in the config.*new folder.*delete") as error:
        ensure_model(ModelConfig(path=str(path), tiny={"hidden_size": 32, "init_std": 0.1}), lambda: TEXTS)
    assert "hidden_size" not in str(error.value)
    assert (path / "model.safetensors").read_bytes() == weights  # nothing rebuilt or lost
    ensure_model(ModelConfig(path=str(path)), lambda: TEXTS)  # no tiny section: the folder is used as it is
