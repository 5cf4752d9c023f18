"""model.tiny builds the random model it describes, init_std included."""

import json

import pytest
import torch
from safetensors.torch import load_file

from agentrl.config.schema import ModelConfig
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
