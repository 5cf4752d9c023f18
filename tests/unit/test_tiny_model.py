"""model.tiny builds the random model it describes, init_std included."""

import json

import pytest
import torch
from safetensors.torch import load_file

from agentrl.config.schema import ModelConfig
from agentrl.errors import UserError
from agentrl.models.loading import ensure_model

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


def test_the_chat_roles_are_single_tokens_so_a_turn_costs_few_tokens():
    from agentrl.models.tiny import build_tokenizer

    tokenizer = build_tokenizer(TEXTS, vocab_size=128)
    messages = [
        {"role": "system", "content": "The number"},
        {"role": "user", "content": TEXTS[0]},
        {"role": "assistant", "content": "4"},
        {"role": "tool", "content": TEXTS[1]},
    ]
    ids = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False))["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]
    for role in ("system", "user", "assistant"):
        assert role in pieces  # one token each, right after <|im_start|>
    assert pieces.count("user") == 2  # the tool result is rendered as a user turn
    assert tokenizer.decode(ids[:3]) == "<|im_start|>system\n"
    assert tokenizer.decode(ids).startswith("<|im_start|>system\nThe number<|im_end|>\n<|im_start|>user\nYou have")


def test_output_scale_starts_the_final_norm_small_so_the_first_answers_are_near_uniform(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spreads = {}
    for scale in (1.0, 0.1):
        path = tmp_path / f"model{scale}"
        tiny = {"hidden_size": 64, "init_std": 0.1, "output_scale": scale}
        ensure_model(ModelConfig(path=str(path), tiny=tiny), lambda: TEXTS)
        model = AutoModelForCausalLM.from_pretrained(path)
        assert torch.equal(model.model.norm.weight, torch.full((64,), scale))
        assert float(model.model.layers[0].mlp.gate_proj.weight.std()) == pytest.approx(0.1, rel=0.05)  # unscaled
        tokenizer = AutoTokenizer.from_pretrained(path)
        ids = tokenizer(TEXTS[0], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            probabilities = model(ids).logits[0, -1].softmax(-1)
        spreads[scale] = float(probabilities.max() / probabilities.min())
    assert spreads[0.1] < 2 and spreads[1.0] > 10, spreads  # the most likely token over the least likely


def test_a_folder_built_before_a_tiny_field_existed_is_taken_as_built_with_its_default(tmp_path):
    path = tmp_path / "model"
    ensure_model(ModelConfig(path=str(path), tiny={"hidden_size": 32}), lambda: TEXTS)
    record = json.loads((path / "agentrl_tiny.json").read_text())
    del record["output_scale"]
    (path / "agentrl_tiny.json").write_text(json.dumps(record))
    ensure_model(ModelConfig(path=str(path), tiny={"hidden_size": 32}), lambda: TEXTS)
    with pytest.raises(UserError, match=r"output_scale: 1\.0 there, 0\.5 in the config"):
        ensure_model(ModelConfig(path=str(path), tiny={"hidden_size": 32, "output_scale": 0.5}), lambda: TEXTS)


def test_the_tokenizers_corpus_is_read_from_episodes_it_closes_after():
    from agentrl.config.load import from_dict
    from agentrl.run.tokenizer_corpus import env_texts
    from tests.fault_envs import SessionCountingEnv

    config = from_dict({"model": {"path": "m"}, "env": {"id": "tests.fault_envs:SessionCountingEnv"}})
    texts = env_texts(config, episodes=3)
    assert len(texts) > 3 and all(isinstance(text, str) for text in texts)
    assert SessionCountingEnv.open_sessions == 0  # an openenv:http env would otherwise keep its server session
