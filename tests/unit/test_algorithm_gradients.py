"""Every registered algorithm's gradient on a tiny batch against a reference written here from the papers.

The reference (`reference_gradients`) is plain numpy in float64 and calls none of agentrl's algorithm
code: per-token advantages from each paper's definition, dL/dlogp from the surrogate's derivative
written out by hand (which branch of a clipped min is live, the stop-gradient of CISPO's weight, GSPO's
one ratio per sequence), the aggregation's weight per token, and then the chain rule through
logp = log softmax(z / T)[y] (and the entropy's own derivative) to the logits z.

Two paths are checked against it:

- `test_algorithm_gradient_float64`: the algorithm's own `prepare` / `advantages` / `loss` on
  `LossInputs` built from float64 leaf logits, to 1e-6 relative;
- `test_trainer_gradient_matches_reference`: the real `PolicyTrainer.train_step` on the tiny model,
  its logits' gradient caught with a hook on the LM head (float32, so 1e-4 relative).

The batch: two groups of three multi-turn episodes (prompt, generated tokens, eos, observation per
turn), distinct rewards, turn rewards and anchor states, and old log-probs that differ from the
current ones by 1e-5 in some episodes and by ~0.3 in others, so the token clip (and GSPO's
sequence clip) is live in some tokens and not in others.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl.algorithms import algorithm_of, registered_names
from agentrl.algorithms.advantages import local_sum
from agentrl.algorithms.base import LossInputs
from agentrl.algorithms.losses import uniform_kl
from agentrl.config import from_dict
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trajectory import Episode, pack

SHIPPED = [
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "gspo",
    "cispo",
    "ppo",
    "dapo",
    "gigpo",
    "turn_rloo",
]

# (generated tokens per turn, turn rewards, turn states, episode reward) per episode; groups of three
EPISODES = [
    # group 0: turn 1 acts in state 7 in every episode (one anchor group); turn 2 in state 8 or 9
    ([2, 1], [0.1, 0.0], [7, 8], 0.1),
    ([1, 3], [0.1, 1.0], [7, 8], 1.1),
    ([3], [0.0], [7], 0.5),  # 0.5 from a reward_fn beyond its turn rewards
    # group 1
    ([1, 1, 2], [0.1, 0.1, 0.0], [3, 4, 5], 0.2),
    ([2, 2], [0.1, 1.0], [3, 4], 1.1),
    ([1], [0.0], [3], -0.3),
]
GROUP_OF = [0, 0, 0, 1, 1, 1]
# |old - current| per episode: tiny (nothing clipped) or large (the clip is live in some tokens)
DELTA_SCALE = [1e-5, 0.3, 0.4, 1e-5, 0.35, 1e-5]
ROLLOUT = {"max_new_tokens": 4, "max_turns": 3, "max_episode_tokens": 64, "temperature": 0.8}


def make_batch(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    episodes = []
    for index, (turns, turn_rewards, states, reward) in enumerate(EPISODES):
        e = Episode(group=GROUP_OF[index], task_seed=index)
        e.extend(rng.integers(3, 40, size=3), mask=0)
        for n, turn_reward, state in zip(turns, turn_rewards, states, strict=True):
            start = len(e.tokens)
            e.extend(rng.integers(3, 40, size=n), mask=1, logprobs=np.zeros(n))
            e.turn_spans.append((start, len(e.tokens)))
            e.turn_rewards.append(turn_reward)
            e.turn_states.append(state)
            e.extend([2], mask=0)  # eos, not trained
            e.extend(rng.integers(3, 40, size=2), mask=0)  # the observation
        e.reward, e.turns, e.success = reward, len(turns), reward > 1.0  # episodes 1 and 4 won
        episodes.append(e)
    return pack(episodes)


def old_minus_current(batch: dict[str, np.ndarray], seed: int = 1) -> np.ndarray:
    """Flat per-token offsets of the old log-probs from the current ones (0 at each episode's first token)."""
    rng = np.random.default_rng(seed)
    out = np.zeros(len(batch["tokens"]))
    offsets = batch["offsets"]
    for i, scale in enumerate(DELTA_SCALE):
        length = offsets[i + 1] - offsets[i]
        out[offsets[i] + 1 : offsets[i + 1]] = scale * rng.standard_normal(length - 1)
    return out


# ---------------------------------------------------------------------------------------------------------
# The reference: numpy, float64, from the papers' definitions. Nothing below imports agentrl's math.
# ---------------------------------------------------------------------------------------------------------


def episode_rows(batch):
    """Per episode: (targets t = 1..L-1, mask of those targets)."""
    offsets = batch["offsets"]
    rows = []
    for i in range(len(offsets) - 1):
        span = slice(offsets[i] + 1, offsets[i + 1])
        rows.append((batch["tokens"][span].astype(np.int64), batch["loss_mask"][span].astype(np.float64)))
    return rows


def group_normalised(values, groups, std: bool):
    out = np.zeros(len(values))
    for g in np.unique(groups):
        members = groups == g
        if members.sum() < 2:
            continue
        centred = values[members] - values[members].mean()
        out[members] = centred / (values[members].std() + 1e-6) if std else centred
    return out


def token_whitened(values, weights):
    """(v - mean) / sqrt(var + 1e-8); mean and unbiased var over tokens, episode i standing for weights[i] tokens."""
    total = weights.sum()
    mean = (weights * values).sum() / total
    var = (weights * (values - mean) ** 2).sum() / (total - 1)
    return (values - mean) / np.sqrt(var + 1e-8)


def reference_advantages(name: str, options: dict, batch, rows, old_values=None):
    """Per episode, the advantage of each target token (aligned with `rows`); and PPO's returns."""
    rewards = batch["reward"].astype(np.float64)
    groups = batch["group"]
    tokens_per_episode = np.array([mask.sum() for _, mask in rows])
    returns = None
    if name in ("grpo", "gspo", "cispo"):
        episode = group_normalised(rewards, groups, options.get("adv_std_norm", True))
    elif name == "dr_grpo":
        episode = group_normalised(rewards, groups, std=False)
    elif name == "rloo":
        episode = np.zeros(len(rewards))
        for i in range(len(rewards)):
            others = (groups == groups[i]) & (np.arange(len(rewards)) != i)
            episode[i] = rewards[i] - rewards[others].mean()
    elif name == "reinforce_pp":
        episode = token_whitened(rewards, tokens_per_episode)
    elif name == "reinforce_pp_baseline":
        centred = np.array([rewards[i] - rewards[groups == groups[i]].mean() for i in range(len(rewards))])
        episode = token_whitened(centred, tokens_per_episode)
    elif name == "dapo":
        shaped = rewards.copy()
        buffer = options.get("overlong_buffer", 0)
        if buffer:  # DAPO eq. 13, L_max = overlong_max_tokens, L_cache = buffer
            top = options["overlong_max_tokens"]
            for i, n in enumerate(tokens_per_episode):
                if n > top:
                    shaped[i] -= options.get("overlong_penalty_factor", 1.0)
                elif n > top - buffer:
                    shaped[i] += options.get("overlong_penalty_factor", 1.0) * ((top - buffer) - n) / buffer
        episode = group_normalised(shaped, groups, options.get("adv_std_norm", True))
    elif name == "gigpo":
        return gigpo_reference(options, batch, rows), None
    elif name == "turn_rloo":
        return turn_rloo_reference(options, rows), None
    elif name == "ppo":
        return ppo_reference(options, batch, rows, old_values)
    else:
        raise AssertionError(f"no reference for {name}")
    return [np.full(len(targets), episode[i]) for i, (targets, _) in enumerate(rows)], returns


def gigpo_reference(options, batch, rows):
    """Feng et al. 2025: A = A_episode (GRPO) + w * A_step, A_step = the turn's discounted return normalised
    among the group's turns taken in the same anchor state."""
    gamma, weight = options.get("gamma", 0.95), options.get("step_weight", 1.0)
    std = options.get("std_norm", True)
    rewards = batch["reward"].astype(np.float64)
    episode = group_normalised(rewards, batch["group"], std)
    turn_keys, turn_returns, turn_where = [], [], []
    for i, (turns, turn_rewards, states, reward) in enumerate(EPISODES):
        paid = list(turn_rewards)
        paid[-1] += reward - sum(turn_rewards)  # the rest of the episode reward on its last turn
        running, returns = 0.0, []
        for r in reversed(paid):
            running = r + gamma * running
            returns.append(running)
        returns.reverse()
        for k in range(len(turns)):
            turn_keys.append((GROUP_OF[i], states[k]))
            turn_returns.append(returns[k])
            turn_where.append((i, k))
    turn_returns = np.array(turn_returns)
    key_ids = np.array([sorted(set(turn_keys)).index(key) for key in turn_keys])
    step = group_normalised(turn_returns, key_ids, std)
    out = [np.zeros(len(targets)) for targets, _ in rows]
    for (i, k), value in zip(turn_where, step, strict=True):
        turns = EPISODES[i][0]
        start = 3 + sum(n + 3 for n in turns[:k])  # prompt 3; each earlier turn: n tokens + eos + 2 observed
        out[i][start - 1 : start - 1 + turns[k]] = episode[i] + weight * value  # target t sits at row t - 1
    return out


def turn_rloo_reference(options, rows):
    """Per turn: its reward-to-go (the rest of the episode reward on the last turn) minus the mean reward-to-go of
    the other episodes of its group at the same turn position that have such a turn (no such episode: minus 0); with
    baseline padded, of all the other episodes of its group, one without such a turn counting 0."""
    gamma, padded = options.get("gamma", 1.0), options.get("baseline") == "padded"
    returns = []
    for _, turn_rewards, _, reward in EPISODES:
        paid = list(turn_rewards)
        paid[-1] += reward - sum(turn_rewards)
        returns.append([sum(gamma ** (j - k) * paid[j] for j in range(k, len(paid))) for k in range(len(paid))])
    out = [np.zeros(len(targets)) for targets, _ in rows]
    for i, (turns, _, _, _) in enumerate(EPISODES):
        for k in range(len(turns)):
            others = [
                returns[j][k] if len(returns[j]) > k else 0.0
                for j in range(len(EPISODES))
                if j != i and GROUP_OF[j] == GROUP_OF[i] and (len(returns[j]) > k or padded)
            ]
            baseline = np.mean(others) if others else 0.0
            start = 3 + sum(n + 3 for n in turns[:k])
            out[i][start - 1 : start - 1 + turns[k]] = returns[i][k] - baseline
    return out


def ppo_reference(options, batch, rows, old_values):
    """GAE (Schulman et al. 2016) over the generated tokens, each turn's reward on its last generated
    token and the rest of the episode's reward on the episode's last generated token; whitened over the
    batch (mean, unbiased variance, eps 1e-8 inside the root). Returns (advantages, returns) per episode."""
    gamma, lam = options.get("gamma", 1.0), options.get("lam", 1.0)
    advantages, returns = [], []
    for i, (targets, mask) in enumerate(rows):
        turns, turn_rewards, _, reward = EPISODES[i]
        r = np.zeros(len(targets))
        ends = []
        for k, n in enumerate(turns):
            end = 3 + sum(m + 3 for m in turns[:k]) + n - 1  # the turn's last generated token
            r[end - 1] += turn_rewards[k]
            ends.append(end - 1)
        r[ends[-1]] += reward - sum(turn_rewards)
        steps = np.flatnonzero(mask)
        values = old_values[i]
        a = np.zeros(len(targets))
        next_value = next_advantage = 0.0
        for t in reversed(steps):
            delta = r[t] + gamma * next_value - values[t]
            next_advantage = delta + gamma * lam * next_advantage
            next_value = values[t]
            a[t] = next_advantage
        advantages.append(a)
        returns.append(np.where(mask > 0, a + values, 0.0))
    if options.get("whiten_advantages", True):
        flat = np.concatenate([a[mask > 0] for a, (_, mask) in zip(advantages, rows, strict=True)])
        mean, var = flat.mean(), flat.var(ddof=1)
        advantages = [
            np.where(mask > 0, (a - mean) / np.sqrt(var + 1e-8), 0.0)
            for a, (_, mask) in zip(advantages, rows, strict=True)
        ]
    return advantages, returns


def softmax_parts(logits, temperature):
    z = logits / temperature
    z = z - z.max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return logp_all, np.exp(logp_all)


def reference_gradients(
    name: str,
    options: dict,
    rows,
    logits,
    old,
    rollout,
    advantages,
    temperature,
    ref=None,
    values=None,
    old_values=None,
    returns=None,
    norm_length=None,
):
    """dL/dlogits per episode ((L-1, V) each) and, for PPO, dL/dvalues: the papers' gradients by hand.

    logits, old, rollout, ref, values: per episode, aligned with the targets of `rows`.
    """
    defaults = {
        "ppo": (0.2, 0.2, "token-mean"),
        "gspo": (3e-4, 4e-4, "seq-mean-token-mean"),
        "cispo": (None, 4.0, "token-mean"),
        "dr_grpo": (0.2, 0.28, "seq-mean-token-sum-norm"),
    }.get(name, (0.2, 0.28, "token-mean"))
    low = options.get("clip_eps_low", defaults[0])
    high = options.get("clip_eps_high", defaults[1])
    agg = options.get("loss_agg", defaults[2])
    kl_coef, entropy_coef = options.get("kl_coef", 0.0), options.get("entropy_coef", 0.0)
    if options.get("entropy_schedule") == "lr":
        entropy_coef *= LR_SCALE
    correction = options.get("correction", {"mode": "none"})
    tokens = sum(mask.sum() for _, mask in rows)
    sequences = sum(mask.sum() > 0 for _, mask in rows)
    grads, value_grads = [], []
    for i, (targets, mask) in enumerate(rows):
        logp_all, p = softmax_parts(logits[i], temperature)
        logp = logp_all[np.arange(len(targets)), targets]
        n_i = mask.sum()
        keep = mask.copy()
        weight = np.ones(len(targets))  # the rollout correction's IS weight
        if correction["mode"] != "none":
            rho = np.exp(old[i] - rollout[i])
            if correction.get("level", "token") == "sequence":
                rho = np.full(len(targets), np.exp(((old[i] - rollout[i]) * mask).sum() / n_i))
            if correction["mode"] in ("tis", "tis_mask"):
                weight = np.minimum(rho, correction.get("cap", 2.0))
            if correction["mode"] in ("mask", "tis_mask"):
                keep = keep * ((rho >= correction.get("low", 0.5)) & (rho <= correction.get("high", 2.0)))
        # the aggregation's weight of each token's loss
        if agg == "token-mean":
            w = keep / tokens
        elif agg == "seq-mean-token-sum":
            w = keep / sequences
        elif agg == "seq-mean-token-mean":
            w = keep / (keep.sum() * sequences)
        else:
            w = keep / (sequences * norm_length)
        a = advantages[i]
        if name == "gspo":
            # s_i = (pi(y_i)/pi_old(y_i))^(1/|y_i|); J_i = min(s A, clip(s) A); ds/dlogp_t = s / |y_i| ...
            # spread as the paper's token form: every token's loss carries s A, its gradient s A d logp_t.
            s = np.exp(((logp - old[i]) * mask).sum() / n_i)
            live = s * a <= np.clip(s, 1 - low, 1 + high) * a  # the unclipped term is the min
            dlogp = np.where(live, -s * a, 0.0)
        elif name == "cispo":
            # -sg(clip(r, max 1 + high)) A logp: the weight is a constant, every token keeps its gradient
            r = np.exp(logp - old[i])
            dlogp = -np.clip(r, None if low is None else 1 - low, 1 + high) * a
        else:
            # PPO eq. 7: -min(r A, clip(r) A); the gradient -r A where the unclipped term is the min, else 0
            r = np.exp(logp - old[i])
            live = r * a <= np.clip(r, 1 - low, 1 + high) * a
            dlogp = np.where(live, -r * a, 0.0)
        dlogp = dlogp * weight
        if ref is not None and kl_coef > 0:  # k3 = e^(ref - logp) - (ref - logp) - 1
            dlogp = dlogp + kl_coef * (1.0 - np.exp(ref[i] - logp))
        dlogp = dlogp * w
        # chain rule: d logp_y / dz = (onehot(y) - p) / T; dH/dz = -p (log p + H) / T
        onehot = np.zeros_like(p)
        onehot[np.arange(len(targets)), targets] = 1.0
        grad = dlogp[:, None] * (onehot - p)
        if entropy_coef > 0:
            entropy = -(p * logp_all).sum(-1)
            floor = options.get("entropy_floor")
            below = np.ones(len(targets)) if floor is None else (entropy < floor)  # min(H, floor): no gradient above
            if options.get("entropy_on") == "failed" and EPISODES[i][3] > 1.0:  # a won episode: no bonus
                below = np.zeros(len(targets))
            if options.get("entropy_measure") == "uniform_kl":  # d mean_j log p_j / dz = 1/V - p
                bonus_grad = 1.0 / p.shape[-1] - p
            else:
                bonus_grad = -p * (logp_all + entropy[:, None])
            grad = grad + (-entropy_coef * w * below)[:, None] * bonus_grad
        grads.append(grad / temperature)
        if name == "ppo":
            # 0.5 max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2), aggregated like the policy loss
            c = options.get("value_clip", 0.5)
            v, R = values[i], returns[i]
            inside = (v >= old_values[i] - c) & (v <= old_values[i] + c)
            vc = np.clip(v, old_values[i] - c, old_values[i] + c)
            a2, b2 = (v - R) ** 2, (vc - R) ** 2
            dv = np.where(a2 > b2, v - R, np.where(a2 < b2, 0.0, 0.5 * (v - R) + 0.5 * (vc - R) * inside))
            value_grads.append(dv * mask / tokens if agg == "token-mean" else None)
    return grads, value_grads


# ---------------------------------------------------------------------------------------------------------
# Path 1: the algorithm's prepare / advantages / loss on float64 LossInputs.
# ---------------------------------------------------------------------------------------------------------

VOCAB = 41

CASES = [(name, {}) for name in SHIPPED] + [
    ("grpo", {"loss_agg": "seq-mean-token-sum"}),
    ("grpo", {"loss_agg": "seq-mean-token-mean"}),
    ("grpo", {"loss_agg": "seq-mean-token-sum-norm", "loss_norm_length": 5}),
    ("grpo", {"entropy_coef": 0.03}),
    ("grpo", {"kl_coef": 0.1}),
    ("grpo", {"adv_std_norm": False, "clip_eps_low": 0.1, "clip_eps_high": 0.1}),
    ("grpo", {"correction": {"mode": "tis", "cap": 1.2}}),
    ("grpo", {"correction": {"mode": "tis_mask", "level": "sequence", "cap": 1.5, "low": 0.9, "high": 1.1}}),
    ("gspo", {"clip_eps_low": 0.05, "clip_eps_high": 0.05}),
    ("gspo", {"entropy_coef": 0.01, "kl_coef": 0.05}),
    ("cispo", {"clip_eps_low": 0.2, "clip_eps_high": 0.1}),
    ("ppo", {"gamma": 0.9, "lam": 0.8}),
    ("ppo", {"whiten_advantages": False, "value_clip": 0.05}),
    ("dapo", {"overlong_buffer": 3, "overlong_max_tokens": 4}),
    ("gigpo", {"std_norm": False, "gamma": 0.5, "step_weight": 0.7}),
    ("turn_rloo", {"gamma": 0.6, "loss_agg": "seq-mean-token-sum-norm", "loss_norm_length": 5}),
    ("turn_rloo", {"baseline": "padded"}),
    ("rloo", {"loss_agg": "seq-mean-token-mean", "entropy_coef": 0.02}),
    ("rloo", {"entropy_coef": 0.05, "entropy_floor": 2.6}),  # the random logits' entropies lie on both sides
    ("rloo", {"entropy_coef": 0.05, "entropy_floor": 2.6, "entropy_schedule": "lr"}),
    ("rloo", {"entropy_coef": 0.05, "entropy_floor": 2.6, "entropy_on": "failed"}),
    ("ppo", {"entropy_coef": 0.05, "entropy_on": "failed"}),  # PPO's prepare keeps the base's per-token weight
    ("rloo", {"entropy_coef": 0.05, "entropy_measure": "uniform_kl"}),
    ("rloo", {"entropy_coef": 0.05, "entropy_floor": 2.6, "entropy_on": "failed", "entropy_measure": "uniform_kl"}),
]
LR_SCALE = 0.3  # the scheduler's factor the loss is told (only `entropy_schedule: lr` reads it)


def test_every_registered_algorithm_has_a_reference():
    assert set(registered_names()) == set(SHIPPED)


def config_for(name, options, model_path="m", **sections):
    return from_dict(
        {"model": {"path": str(model_path)}, "algorithm": {"name": name, **options}, "rollout": ROLLOUT, **sections}
    )


def padded(arrays, width):
    out = torch.zeros(len(arrays), width, dtype=torch.float64)
    for row, values in enumerate(arrays):
        out[row, : len(values)] = torch.as_tensor(values, dtype=torch.float64)
    return out


@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_algorithm_gradient_float64(name, options):
    config = config_for(name, options)
    algorithm = algorithm_of(config)(local_sum)
    batch = make_batch()
    rows = episode_rows(batch)
    rng = np.random.default_rng(2)
    width = max(len(t) for t, _ in rows)
    logits_np = [rng.standard_normal((len(t), VOCAB)) * 1.5 for t, _ in rows]
    temperature = ROLLOUT["temperature"]
    current = [
        softmax_parts(z, temperature)[0][np.arange(len(t)), t] for z, (t, _) in zip(logits_np, rows, strict=True)
    ]
    delta = old_minus_current(batch)
    offsets = batch["offsets"]
    old = [current[i] + delta[offsets[i] + 1 : offsets[i + 1]] for i in range(len(rows))]
    rollout = [o + 0.2 * rng.standard_normal(len(o)) for o in old]  # mu != pi_old, for the correction
    ref = [c + 0.5 * rng.standard_normal(len(c)) for c in current]
    batch["logprobs"] = np.zeros(len(batch["tokens"]), np.float32)  # unused here: LossInputs carries them

    valid = np.ones(len(rows), bool)
    old_values = values = None
    if name == "ppo":
        old_values = [rng.standard_normal(len(t)) * (m > 0) for t, m in rows]
        flat = np.zeros(len(batch["tokens"]), np.float32)
        for i, v in enumerate(old_values):
            flat[offsets[i] + 1 : offsets[i + 1]] = v
        prepared = algorithm.prepare(batch, valid, lambda _: flat)
        old_values = [flat[offsets[i] + 1 : offsets[i + 1]].astype(np.float64) for i in range(len(rows))]
        values = [v + 0.1 * rng.standard_normal(len(v)) for v in old_values]  # the critic moved a little
        for i in (1, 4):  # ... and a lot in two episodes, so the value clip is live
            values[i] = values[i] + 2.0 * rng.standard_normal(len(values[i]))
    else:
        prepared = algorithm.prepare(batch, valid, lambda _: None)
    advantages = algorithm.advantages(batch, valid)

    hand_advantages, returns = reference_advantages(name, options, batch, rows, old_values)
    masks = [m for _, m in rows]
    for i in range(len(rows)):
        got = advantages[offsets[i] + 1 : offsets[i + 1]]
        np.testing.assert_allclose(got * masks[i], hand_advantages[i] * masks[i], rtol=1e-6, atol=1e-7)
    if name == "ppo":
        got = prepared.per_token["returns"]
        for i in range(len(rows)):
            np.testing.assert_allclose(got[offsets[i] + 1 : offsets[i + 1]], returns[i], rtol=1e-6, atol=1e-6)

    logits = torch.zeros(len(rows), width, VOCAB, dtype=torch.float64)
    for row, z in enumerate(logits_np):
        logits[row, : len(z)] = torch.from_numpy(z)
    logits.requires_grad_(True)
    targets = torch.zeros(len(rows), width, dtype=torch.long)
    for row, (t, _) in enumerate(rows):
        targets[row, : len(t)] = torch.from_numpy(t)
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    mask = padded(masks, width)
    per_token_adv = padded([advantages[offsets[i] + 1 : offsets[i + 1]] for i in range(len(rows))], width)
    value_leaf = None
    model_outputs = {}
    rows_prepared = {
        key: padded([flat[offsets[i] + 1 : offsets[i + 1]] for i in range(len(rows))], width)
        for key, flat in prepared.per_token.items()
    }
    if name == "ppo":
        value_leaf = padded(values, width).requires_grad_(True)
        model_outputs = {"critic": value_leaf}
    inputs = LossInputs(
        logp=logp,
        old_logp=padded(old, width),
        rollout_logp=padded(rollout, width),
        advantages=per_token_adv,
        mask=mask,
        entropy=entropy if algorithm.needs_entropy_grad else entropy.detach(),
        ref_logp=padded(ref, width) if algorithm.needs_reference else None,
        global_tokens=float(mask.sum()),
        global_sequences=float((mask.sum(-1) > 0).sum()),
        model_outputs=model_outputs,
        prepared=rows_prepared,
        lr_scale=LR_SCALE,
        uniform_kl=uniform_kl(logits, temperature) if algorithm.needs_uniform_kl else None,
    )
    loss, stats = algorithm.loss(inputs)
    loss.backward()

    norm_length = options.get("loss_norm_length") or min(
        ROLLOUT["max_new_tokens"] * ROLLOUT["max_turns"], ROLLOUT["max_episode_tokens"]
    )
    expected, value_expected = reference_gradients(
        name,
        options,
        rows,
        logits_np,
        old,
        rollout,
        hand_advantages,
        temperature,
        ref=ref if algorithm.needs_reference else None,
        values=values,
        old_values=old_values,
        returns=returns,
        norm_length=norm_length,
    )
    scale = max(np.abs(g).max() for g in expected)
    assert scale > 1e-4, "the reference gradient is ~0: the batch does not test anything"
    for row, g in enumerate(expected):
        got = logits.grad[row].numpy()
        np.testing.assert_allclose(got[: len(g)], g, rtol=1e-6, atol=1e-9 * scale, err_msg=f"episode {row}")
        assert (got[len(g) :] == 0).all()
    if name == "ppo":
        for row, g in enumerate(value_expected):
            np.testing.assert_allclose(value_leaf.grad[row, : len(g)].numpy(), g, rtol=1e-6, atol=1e-12)
    if name in ("gspo",) and not options:
        # the clip decides per sequence: some sequences keep their whole gradient, others lose all of it
        norms = [np.abs(g).sum() for g in expected]
        assert any(n == 0 for n in norms) and any(n > 0 for n in norms)
    assert np.isfinite(float(loss.detach())) and np.isfinite(stats["clip_frac"])


# ---------------------------------------------------------------------------------------------------------
# Path 2: the real PolicyTrainer.train_step on the tiny model; the logits' gradient caught at the LM head.
# ---------------------------------------------------------------------------------------------------------

TRAINER_CASES = [(name, {}) for name in SHIPPED] + [
    ("grpo", {"entropy_coef": 0.03, "kl_coef": 0.1}),
    ("gspo", {"clip_eps_low": 0.05, "clip_eps_high": 0.05, "kl_coef": 0.1}),
    ("ppo", {"gamma": 0.9, "lam": 0.8, "entropy_coef": 0.01}),
    ("rloo", {"entropy_coef": 0.05, "entropy_on": "failed"}),
    ("rloo", {"entropy_coef": 0.05, "entropy_on": "failed", "entropy_measure": "uniform_kl"}),
    # the floor's gate reads the entropy without its gradient: uniform_kl's gradient alone reaches the logits
    ("rloo", {"entropy_coef": 0.05, "entropy_floor": 2.9, "entropy_measure": "uniform_kl"}),
]


def capture(module, into: list):
    """Keep every output of `module`; outputs with grad keep their gradient after backward."""

    def hook(_, __, output):
        if output.requires_grad:
            output.retain_grad()
        into.append(output)

    return module.register_forward_hook(hook)


@pytest.mark.parametrize(("name", "options"), TRAINER_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(TRAINER_CASES)])
def test_trainer_gradient_matches_reference(tiny_model_dir, name, options):
    torch.manual_seed(0)
    config = config_for(name, options, tiny_model_dir, trainer={"micro_batch_size": 4}, optimizer={"lr": 1e-3})
    trainer = policy_trainer(config, str(tiny_model_dir), "cpu")
    # uniform_kl reads the entropy only as the floor's gate: no autograd graph is kept for it
    assert trainer.algorithm.needs_entropy_grad == (
        options.get("entropy_coef", 0) > 0 and "entropy_measure" not in options
    )
    temperature = ROLLOUT["temperature"]
    with torch.no_grad():
        if options.get("kl_coef"):  # move the policy off the reference, so the KL term has a gradient
            for p in trainer.params:
                p.add_(0.05 * torch.randn_like(p))
        if options.get("entropy_floor"):  # spread the tokens' entropies, so the floor gates some and not others
            trainer.model.lm_head.weight.mul_(6.0)
        if name == "ppo":  # a critic whose values are not all 0
            torch.nn.init.normal_(trainer.extras[0].module.value_head.weight, std=0.5)
    batch = make_batch()
    rows = episode_rows(batch)
    offsets = batch["offsets"]
    delta = old_minus_current(batch)
    logprobs = np.zeros(len(batch["tokens"]), np.float32)
    logits = []  # per episode, before the update: the step's forward gives these at the positions it trains
    with torch.no_grad():
        for i, (targets, _) in enumerate(rows):
            ids = torch.from_numpy(batch["tokens"][offsets[i] : offsets[i + 1]].astype(np.int64))[None]
            z = trainer.model(input_ids=ids).logits[0, :-1].double().numpy()
            logits.append(z)
            current = softmax_parts(z, temperature)[0][np.arange(len(targets)), targets]
            logprobs[offsets[i] + 1 : offsets[i + 1]] = current + delta[offsets[i] + 1 : offsets[i + 1]]
    batch["logprobs"] = logprobs

    policy_out, reference_out, critic_out = [], [], []
    hooks = [capture(trainer.model.lm_head, policy_out)]
    if trainer.reference is not None:
        hooks.append(capture(trainer.reference.lm_head, reference_out))
    if name == "ppo":
        hooks.append(capture(trainer.extras[0].module, critic_out))
    try:
        trainer.train_step(batch)
    finally:
        for hook in hooks:
            hook.remove()

    micro = [np.arange(0, 4), np.arange(4, 6)]  # micro_batch_size 4, one update
    trained = [z for z in policy_out if z.requires_grad]
    assert len(trained) == len(micro)

    def per_episode(outputs):
        found = {}
        for out, episodes in zip(outputs, micro, strict=True):
            for row, i in enumerate(episodes):
                value = out[row, : len(rows[i][0])]
                found[i] = value.detach().double().numpy() if torch.is_tensor(value) else value
        return [found[i] for i in range(len(rows))]

    def rows_of(out, episodes) -> np.ndarray:
        """(rows, width, vocab): the LM head's output laid out as the micro-batch's right-padded rows (zeros where
        the lean forward computed no logits: at positions predicting no trained token)."""
        width = max(len(rows[i][0]) for i in episodes) + 1
        if out.ndim == 3:
            return out.double().numpy()
        dense = np.zeros((len(episodes), width, out.shape[-1]))
        kept = [(row, t) for row, i in enumerate(episodes) for t in np.flatnonzero(rows[i][1])]
        assert len(kept) == out.shape[0]  # the positions the loss reads, in the rows' order, and none else
        for (row, t), values in zip(kept, out.double().numpy(), strict=True):
            dense[row, t] = values
        return dense

    for out, episodes in zip(trained, micro, strict=True):  # the step's logits are the ones before it
        for row, i in enumerate(episodes):
            got, want = rows_of(out.detach(), episodes)[row, : len(rows[i][0])], logits[i]
            read = rows[i][1] > 0
            np.testing.assert_allclose(got[read], want[read], rtol=1e-4, atol=1e-5)
    old = [logprobs[offsets[i] + 1 : offsets[i + 1]].astype(np.float64) for i in range(len(rows))]
    ref = None
    if trainer.reference is not None:
        reference_rows = [rows_of(out, episodes) for out, episodes in zip(reference_out, micro, strict=True)]
        ref = [
            softmax_parts(z, temperature)[0][np.arange(len(t)), t]
            for z, (t, _) in zip(per_episode(reference_rows), rows, strict=True)
        ]
    old_values = values = None
    if name == "ppo":
        before = [out for out in critic_out if not out.requires_grad]  # prepare's forward, before the update
        during = [out for out in critic_out if out.requires_grad]
        old_values = [v * m for v, (_, m) in zip(per_episode(before), rows, strict=True)]
        values = per_episode(during)
    if "entropy_floor" in options:  # a floor that gates some tokens and not others
        entropies = np.concatenate([-(p * lp).sum(-1) for lp, p in (softmax_parts(z, temperature) for z in logits)])
        assert 0 < (entropies < options["entropy_floor"]).mean() < 1
    hand_advantages, returns = reference_advantages(name, options, batch, rows, old_values)
    expected, value_expected = reference_gradients(
        name,
        options,
        rows,
        logits,
        old,
        old,
        hand_advantages,
        temperature,
        ref=ref,
        values=values,
        old_values=old_values,
        returns=returns,
        norm_length=min(ROLLOUT["max_new_tokens"] * ROLLOUT["max_turns"], ROLLOUT["max_episode_tokens"]),
    )
    scale = max(np.abs(g).max() for g in expected)
    assert scale > 1e-4
    for out, episodes in zip(trained, micro, strict=True):
        grad = rows_of(out.grad, episodes)
        assert (grad[:, -1] == 0).all()  # the last position predicts nothing
        for row, i in enumerate(episodes):
            g = expected[i]
            np.testing.assert_allclose(grad[row, : len(g)], g, rtol=1e-4, atol=1e-6 * scale, err_msg=f"episode {i}")
            assert (grad[row, len(g) :] == 0).all()
    if name == "ppo":
        for out, episodes in zip(during, micro, strict=True):
            for row, i in enumerate(episodes):
                g = value_expected[i]
                np.testing.assert_allclose(out.grad[row, : len(g)].double().numpy(), g, rtol=1e-4, atol=1e-7)


def test_on_policy_gspo_is_grpo_with_sequence_mean_aggregation():
    """With old == current log-probs (one update per step, no rollout mismatch) every sequence ratio is 1,
    GSPO's clip never binds, and its gradient is GRPO's with seq-mean-token-mean: what the quickstart's
    GSPO run trains on (docs/algorithms.md, the learning table)."""
    batch = make_batch()
    rows = episode_rows(batch)
    offsets = batch["offsets"]
    rng = np.random.default_rng(3)
    width = max(len(t) for t, _ in rows)
    base = torch.from_numpy(rng.standard_normal((len(rows), width, VOCAB)))
    targets = torch.zeros(len(rows), width, dtype=torch.long)
    for row, (t, _) in enumerate(rows):
        targets[row, : len(t)] = torch.from_numpy(t)
    mask = padded([m for _, m in rows], width)
    grads = {}
    for name, options in (("gspo", {}), ("grpo", {"loss_agg": "seq-mean-token-mean"})):
        algorithm = algorithm_of(config_for(name, options))(local_sum)
        valid = np.ones(len(rows), bool)
        advantages = algorithm.advantages(batch, valid)
        logits = base.clone().requires_grad_(True)
        logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        inputs = LossInputs(
            logp=logp,
            old_logp=logp.detach(),
            rollout_logp=logp.detach(),
            advantages=padded([advantages[offsets[i] + 1 : offsets[i + 1]] for i in range(len(rows))], width),
            mask=mask,
            entropy=None,
            ref_logp=None,
            global_tokens=float(mask.sum()),
            global_sequences=float((mask.sum(-1) > 0).sum()),
        )
        loss, stats = algorithm.loss(inputs)
        loss.backward()
        assert stats["clip_frac"] == 0
        grads[name] = logits.grad
    assert grads["gspo"].abs().max() > 1e-3
    torch.testing.assert_close(grads["gspo"], grads["grpo"], rtol=1e-12, atol=1e-15)


def test_the_loss_is_told_the_schedulers_factor(tiny_model_dir):
    """`entropy_schedule: lr` scales the bonus by what the trainer passes as lr_scale: lr / peak lr, step by step."""
    config = config_for(
        "rloo",
        {"entropy_coef": 0.1, "entropy_schedule": "lr"},
        tiny_model_dir,
        optimizer={"lr": 1e-3},
        lr_scheduler={"warmup_steps": 2, "decay": "cosine"},
        steps=5,
    )
    trainer = policy_trainer(config, str(tiny_model_dir), "cpu")
    told, expected = [], []
    loss = trainer.algorithm.loss
    trainer.algorithm.loss = lambda inputs: (told.append(inputs.lr_scale), loss(inputs))[1]
    batch = make_batch()
    for _ in range(4):
        expected.append(trainer.scheduler.get_last_lr()[0] / 1e-3)
        trainer.train_step(batch)
    assert told == pytest.approx(expected)
    assert told[0] < told[1] and told[2] > told[3]  # the warm-up, then the decay


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_one_update_takes_the_old_policy_from_its_own_forward(tiny_model_dir, monkeypatch, shared_prefix):
    """With trainer.updates_per_step=1 a correction mode needs no forward of its own for pi_old: each micro-batch's
    forward is it. The step then trains exactly as with pi_old recomputed first; with mu (the rollout's log-probs,
    which differ here) taken as pi_old instead, it would not."""
    from agentrl.trainer.policy_trainer import PolicyTrainer

    options = {"correction": {"mode": "tis", "cap": 1.2}}
    sections = {"trainer": {"micro_batch_size": 4, "shared_prefix": shared_prefix}, "optimizer": {"lr": 1e-2}}
    config = config_for("grpo", options, tiny_model_dir, **sections)
    batch = make_batch()
    # mu far from the policy on some tokens: some tis weights capped, some not
    batch["logprobs"] = np.random.default_rng(3).uniform(-5.0, 0.0, len(batch["tokens"])).astype(np.float32)

    def step(old_policy: str):
        torch.manual_seed(0)
        trainer = policy_trainer(config, str(tiny_model_dir), "cpu")
        if old_policy == "recomputed":
            monkeypatch.setattr(PolicyTrainer, "_recomputes_old_logprobs", lambda self: True)
        elif old_policy == "rollout":  # the mistake the shortcut must not make
            monkeypatch.setattr(type(trainer.algorithm), "needs_old_logprobs", property(lambda self: False))
        before = [p.detach().clone() for p in trainer.params]
        forwards = []
        hook = capture(trainer.model.lm_head, forwards)
        try:
            metrics = trainer.train_step(batch)
        finally:
            hook.remove()
            monkeypatch.undo()
        moved = max(float((p.detach() - b).abs().max()) for p, b in zip(trainer.params, before, strict=True))
        no_grad_forwards = sum(not out.requires_grad for out in forwards)
        return [p.detach().clone() for p in trainer.params], no_grad_forwards, metrics, moved

    own, own_extra, own_metrics, moved = step("own forward")
    recomputed, recomputed_extra, _, _ = step("recomputed")
    assert own_extra == 0 and recomputed_extra == 2  # the recompute forwards both micro-batches once more
    assert moved > 1e-4 and own_metrics["train/correction_capped_tokens"] > 0
    for a, b in zip(own, recomputed, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    as_mu, _, _, _ = step("rollout")
    assert max(float((a - b).abs().max()) for a, b in zip(own, as_mu, strict=True)) > 1e-5
