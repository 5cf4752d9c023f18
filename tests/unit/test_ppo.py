"""PPO with a critic: token rewards on turn ends, GAE targets through the trainer, the critic trained and
checkpointed through the generic extra-model hooks."""

import json

import numpy as np
import pytest
import torch

from agentrl.algorithms import registered_names, resolve
from agentrl.algorithms.ppo import PPOOptions, step_mask, token_rewards
from agentrl.config import ConfigError, from_dict
from agentrl.models.loading import load_tokenizer
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trainer import checkpoint
from agentrl.trajectory import Episode, concat, pack


def turn_episode(turns, rewards, extra_reward=0.0, prompt=3, observation=2, group=0, seed=0):
    """Prompt, then per turn `n` generated tokens (mask 1), an eos (mask 0) and an observation (mask 0)."""
    rng = np.random.default_rng(seed)
    e = Episode(group=group, task_seed=seed)
    e.extend(rng.integers(3, 40, size=prompt), mask=0)
    for n, reward in zip(turns, rewards, strict=True):
        start = len(e.tokens)
        e.extend(rng.integers(3, 40, size=n), mask=1, logprobs=-rng.random(n))
        e.turn_spans.append((start, len(e.tokens)))
        e.turn_rewards.append(reward)
        e.turn_states.append(0)
        e.extend([2], mask=0)
        e.extend(rng.integers(3, 40, size=observation), mask=0)
    e.reward = float(sum(rewards) + extra_reward)
    e.turns = len(turns)
    return e


def test_turn_rewards_land_on_each_turns_last_generated_token():
    episodes = [
        turn_episode([2, 3], [0.1, 0.5], extra_reward=1.0),  # a reward_fn added 1.0: on the last generated token
        turn_episode([1, 1, 2], [0.0, 0.25, 0.0], seed=1),
    ]
    batch = concat([pack(episodes[:1]), pack(episodes[1:])])  # turn indices shift with the episodes
    rewards = token_rewards(batch)
    offsets = batch["offsets"]
    first = rewards[offsets[0] : offsets[1]]
    # prompt 0..2, turn 1 at 3..4, eos 5, observation 6..7, turn 2 at 8..10
    expected = np.zeros(len(first), np.float32)
    expected[4], expected[10] = 0.1, 0.5 + 1.0
    np.testing.assert_allclose(first, expected, rtol=0, atol=1e-7)
    second = rewards[offsets[1] : offsets[2]]
    # prompt 0..2, turn 1 at 3, eos, obs, turn 2 at 7, eos, obs, turn 3 at 11..12
    assert np.flatnonzero(second).tolist() == [7]
    assert second[7] == np.float32(0.25)
    np.testing.assert_allclose(np.add.reduceat(rewards, offsets[:-1]), batch["reward"], atol=1e-6)
    steps = step_mask(batch)
    assert (rewards[~steps] == 0).all()  # observation, eos and prompt tokens carry no reward


def test_rewards_without_turns_failed_episodes_and_first_tokens():
    plain = Episode(group=0, task_seed=0, reward=2.0)  # no turn spans (a synthetic batch): all at the end
    plain.extend([5, 6], mask=0)
    plain.extend([7, 8, 9], mask=1, logprobs=[-1.0] * 3)
    plain.extend([2], mask=0)
    failed = turn_episode([2], [1.0])
    failed.finish = "error"  # invalid: no reward at all
    batch = pack([plain, failed])
    valid = batch["finish"] != 4
    rewards = token_rewards(batch, valid)
    assert rewards[:6].tolist() == [0, 0, 0, 0, 2.0, 0]
    assert (rewards[6:] == 0).all()
    first_generated = Episode(group=0, task_seed=0, reward=1.0)  # nothing predicts an episode's first token
    first_generated.extend([5], mask=1, logprobs=[0.0])
    first_generated.extend([6], mask=1, logprobs=[0.0])
    assert token_rewards(pack([first_generated])).tolist() == [0.0, 1.0]


def test_ppo_is_registered_with_its_options():
    assert "ppo" in registered_names()
    assert resolve("ppo").Options is PPOOptions
    assert "Schulman" in resolve("ppo").summary and "gae" in resolve("ppo").summary
    for name, field in PPOOptions.model_fields.items():
        assert name in ("name", "correction") or field.description, name
    with pytest.raises(ConfigError, match=r"algorithm\.adv_std_norm"):
        from_dict({"model": {"path": "m"}, "algorithm": {"name": "ppo", "adv_std_norm": False}})


def ppo_trainer(model_dir, **options):
    config = from_dict(
        {
            "model": {"path": str(model_dir)},
            "algorithm": {"name": "ppo", **options},
            "trainer": {"micro_batch_size": 3},
            "optimizer": {"lr": 1e-2},
        }
    )
    return policy_trainer(config, str(model_dir), "cpu")


def multi_turn_batch(step: int) -> dict:
    rng = np.random.default_rng(step)
    episodes = []
    for group in range(2):
        for i in range(4):
            turns = [int(n) for n in rng.integers(1, 4, size=int(rng.integers(1, 4)))]
            rewards = [float(r) for r in rng.random(len(turns)) < 0.3]
            episodes.append(turn_episode(turns, rewards, float(rng.random() < 0.5), group=group, seed=10 * step + i))
    return pack(episodes)


def critic_weights(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.extras[0].module.named_parameters()}


def test_ppo_trains_policy_and_critic(tiny_model_dir):
    trainer = ppo_trainer(tiny_model_dir, lam=0.95)
    assert [extra.name for extra in trainer.extras] == ["critic"]
    policy_before = {name: t.clone() for name, t in trainer.named_weights()}
    critic_before = critic_weights(trainer)
    backbone = dict(trainer.model.model.named_parameters())  # the critic starts from the policy's backbone
    for name, tensor in critic_before.items():
        if name.startswith("backbone."):
            assert torch.equal(tensor, backbone[name.removeprefix("backbone.")]), name
    assert critic_before["value_head.weight"].abs().sum() == 0
    metrics = [trainer.train_step(multi_turn_batch(step)) for step in range(2)]
    for key in ("value_loss", "explained_variance", "value_mean", "return_mean", "value_clip_frac", "critic_grad_norm"):
        assert all(np.isfinite(m[f"train/{key}"]) for m in metrics), key
    assert metrics[0]["train/value_mean"] == 0.0  # a zero head: the first values are 0
    assert metrics[0]["train/explained_variance"] == 0.0  # ... a constant predictor
    assert metrics[0]["train/critic_grad_norm"] > 0
    critic_after = critic_weights(trainer)
    assert max(float((critic_after[n] - critic_before[n]).abs().max()) for n in critic_before) > 1e-3
    backbone_moved = [
        n for n in critic_before if n.startswith("backbone.") and not torch.equal(critic_after[n], critic_before[n])
    ]
    assert backbone_moved, "the critic's backbone did not train"
    policy_after = dict(trainer.named_weights())
    assert max(float((policy_after[n] - policy_before[n]).abs().max()) for n in policy_before) > 1e-3


def test_prepare_gives_returns_to_go_with_a_fresh_critic(tiny_model_dir):
    trainer = ppo_trainer(tiny_model_dir, whiten_advantages=False)  # gamma = lam = 1
    batch = multi_turn_batch(0)
    valid = np.ones(len(batch["reward"]), bool)
    prepared = trainer.algorithm.prepare(batch, valid, lambda name: trainer._extra_outputs(batch, name))
    advantages = trainer.algorithm.advantages(batch, valid)
    steps = step_mask(batch)
    rewards = token_rewards(batch)
    offsets = batch["offsets"]
    for i in range(len(batch["reward"])):
        span = slice(offsets[i], offsets[i + 1])
        to_go = np.cumsum(rewards[span][::-1])[::-1] * steps[span]  # V = 0: returns are the rewards to go
        np.testing.assert_allclose(prepared.per_token["returns"][span], to_go, atol=1e-6)
        np.testing.assert_allclose(advantages[span], to_go, atol=1e-6)
        assert prepared.per_token["returns"][span][steps[span]][0] == pytest.approx(batch["reward"][i], abs=1e-6)
    assert (prepared.per_token["old_values"] == 0).all()


def test_checkpoint_restores_the_critic_bit_exactly(tiny_model_dir, tmp_path):
    trainer = ppo_trainer(tiny_model_dir)
    trainer.train_step(multi_turn_batch(0))
    tokenizer = load_tokenizer(str(tiny_model_dir))
    saved = checkpoint.save(
        tmp_path,
        1,
        trainer,
        tokenizer,
        keep=2,
        extra_state=trainer.extra_state,
    )
    assert (saved / "critic" / "value_head.safetensors").is_file() and (saved / "critic" / "optimizer.pt").is_file()
    assert checkpoint.latest(tmp_path) == (1, saved)
    manifest = json.loads((saved / checkpoint.MANIFEST_FILE).read_text())["files"]
    assert {"critic/model.safetensors", "critic/value_head.safetensors", "critic/optimizer.pt"} <= set(manifest)

    resumed = ppo_trainer(tiny_model_dir, critic_path=str(tiny_model_dir))
    assert not torch.equal(critic_weights(resumed)["value_head.weight"], critic_weights(trainer)["value_head.weight"])
    step = checkpoint.load_state(
        saved, resumed.optimizer, resumed.scheduler, resumed.model, extra_state=resumed.extra_state
    )
    assert step == 1
    for name, tensor in critic_weights(trainer).items():
        assert torch.equal(critic_weights(resumed)[name], tensor), name
    original, loaded = trainer.extras[0].optimizer.state_dict(), resumed.extras[0].optimizer.state_dict()
    assert original["param_groups"] == loaded["param_groups"]
    for index, state in original["state"].items():
        for key, value in state.items():
            assert torch.equal(loaded["state"][index][key], value), (index, key)
    # The saved critic is a model folder: a new run may start from it (critic_path).
    from_saved = ppo_trainer(tiny_model_dir, critic_path=str(saved / "critic"))
    for name, tensor in critic_weights(trainer).items():
        assert torch.equal(critic_weights(from_saved)[name], tensor), name
    # Resumed training continues exactly as uninterrupted training.
    for step_trainer in (trainer, resumed):
        step_trainer.train_step(multi_turn_batch(1))
    for name, tensor in critic_weights(trainer).items():
        assert torch.equal(critic_weights(resumed)[name], tensor), name


def test_a_checkpoint_without_the_critic_names_the_fix(tiny_model_dir, tmp_path):
    from agentrl.algorithms.grpo import GRPO

    grpo = policy_trainer(from_dict({"model": {"path": str(tiny_model_dir)}}), str(tiny_model_dir), "cpu")
    assert isinstance(grpo.algorithm, GRPO) and grpo.extra_state == []
    tokenizer = load_tokenizer(str(tiny_model_dir))
    saved = checkpoint.save(tmp_path, 1, grpo, tokenizer, keep=2)
    assert not (saved / "critic").exists()
    ppo = ppo_trainer(tiny_model_dir)
    with pytest.raises(FileNotFoundError, match="without the 'critic' model"):
        checkpoint.load_state(saved, ppo.optimizer, ppo.scheduler, ppo.model, extra_state=ppo.extra_state)


def test_the_critic_follows_bf16_and_activation_checkpointing(tiny_model_dir):
    config = from_dict(
        {
            "model": {"path": str(tiny_model_dir), "dtype": "bfloat16"},
            "algorithm": {"name": "ppo"},
            "parallelism": {"mixed_precision": "bf16", "activation_checkpointing": True},
        }
    )
    trainer = policy_trainer(config, str(tiny_model_dir), "cpu")
    critic = trainer.extras[0].module
    assert all(layer.gradient_checkpointing for layer in critic.backbone.layers)
    before = critic_weights(trainer)
    assert all(t.dtype == torch.float32 for t in before.values())  # float32 master weights, bf16 compute
    metrics = trainer.train_step(multi_turn_batch(0))
    assert np.isfinite(metrics["train/value_loss"]) and metrics["train/critic_grad_norm"] > 0
    after = critic_weights(trainer)
    assert max(float((after[n] - before[n]).abs().max()) for n in before) > 1e-4


def test_an_empty_shard_moves_neither_policy_nor_critic(tiny_model_dir):
    trainer = ppo_trainer(tiny_model_dir)
    policy, critic = [p.detach().clone() for p in trainer.params], critic_weights(trainer)
    metrics = trainer.train_step(pack([]))  # dynamic sampling dropped every group of this rank
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert metrics["train/critic_grad_norm"] == 0.0 and metrics["train/value_loss"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(policy, trainer.params, strict=True))
    assert all(torch.equal(critic[n], t) for n, t in critic_weights(trainer).items())
