"""Bias and variance of per-turn advantage estimators, exactly, on random small MDPs whose length the policy picks.

    python -m benchmarks.per_turn_variance [--mdps 40] [--turns 3] [--group-sizes 2 4] [--seed 0]

Each MDP: at turn t (0 .. turns-1) the agent stops (action 0, the episode ends) or goes on (action 1); the last turn
ends it either way. Rewards per (turn, action) are drawn at random (0 half the time, else 1 or a normal draw); the
policy is tabular, pi(go | t) = sigmoid(theta_t), theta drawn from N(0, 1). For a group of K episodes of one MDP,
every outcome is enumerated, so the mean and the variance of each estimator of the policy gradient
(1/K) sum_i sum_t A_it grad log pi(a_it) are exact: no sampling noise. Printed per group size: each estimator's
largest error of its mean against the exact gradient over the MDPs (0 up to rounding: unbiased), and the median
over the MDPs of its variance (trace of the covariance) relative to the episode-level RLOO's, with the share of MDPs
where it is lower.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

from agentrl.algorithms.advantages import rloo_advantages
from agentrl.algorithms.turn_rloo import turn_loo_advantages, turn_returns


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def trajectories(theta: np.ndarray) -> list[tuple[float, list[int]]]:
    """(probability, actions) of every episode: go on k times, then stop (or run out of turns)."""
    go = sigmoid(theta)
    turns = len(theta)
    out = []
    for k in range(turns):
        actions = [1] * k + [0]
        out.append((float(np.prod(go[:k]) * (1 - go[k])), actions))
    out.append((float(np.prod(go)), [1] * turns))
    return out


def score(theta: np.ndarray, t: int, action: int) -> np.ndarray:
    grad = np.zeros(len(theta))
    grad[t] = action - sigmoid(theta[t])
    return grad


def exact_gradient(theta, reward) -> np.ndarray:
    return sum(
        p * sum(reward[t, a] for t, a in enumerate(acts)) * sum(score(theta, t, a) for t, a in enumerate(acts))
        for p, acts in trajectories(theta)
    )


def rloo(k, episode, position, reward):
    totals = np.bincount(episode, weights=reward, minlength=k)
    return rloo_advantages(totals, np.zeros(k, int))[episode]


def turn_reached(k, episode, position, reward):
    return turn_loo_advantages(np.zeros(k, int), None, episode, position, reward, baseline="reached")


def turn_padded(k, episode, position, reward):
    return turn_loo_advantages(np.zeros(k, int), None, episode, position, reward, baseline="padded")


def turn_self_included(k, episode, position, reward):
    """Biased on purpose: each position's baseline is the mean of ALL episodes there, the episode's own included."""
    returns = turn_returns(episode, position, reward, 1.0)
    means = {t: returns[position == t].mean() for t in np.unique(position)}
    return returns - np.array([means[t] for t in position])


ESTIMATORS = {
    "rloo (episode level)": (rloo, False),
    "turn_rloo baseline=reached": (turn_reached, False),
    "turn_rloo baseline=padded": (turn_padded, False),
    "turn_rloo, own length mean": (turn_reached, True),  # each episode's terms divided by its number of turns
    "self-included position mean": (turn_self_included, False),
}


def moments(theta, reward, k: int, advantages_of, per_length: bool) -> tuple[np.ndarray, float]:
    """Exact mean and variance (trace) of the estimator over every group of k episodes."""
    first, second = np.zeros(len(theta)), 0.0
    for group in itertools.product(trajectories(theta), repeat=k):
        p = np.prod([prob for prob, _ in group])
        episode = np.array([i for i, (_, acts) in enumerate(group) for _ in acts])
        position = np.array([t for _, acts in group for t in range(len(acts))])
        actions = [a for _, acts in group for a in acts]
        rewards = np.array([reward[t, a] for t, a in zip(position, actions, strict=True)])
        advantages = advantages_of(k, episode, position, rewards)
        lengths = np.bincount(episode, minlength=k)
        estimate = np.zeros(len(theta))
        for m, i in enumerate(episode):
            weight = 1.0 / lengths[i] if per_length else 1.0
            estimate += weight * advantages[m] * score(theta, position[m], actions[m])
        estimate /= k
        first += p * estimate
        second += p * float(estimate @ estimate)
    return first, second - float(first @ first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mdps", type=int, default=40)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--group-sizes", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    mdps = []
    for _ in range(args.mdps):
        theta = rng.normal(0, 1, args.turns)
        draws = {(t, a): float(rng.choice([0.0, 0.0, 1.0, rng.normal()])) for t in range(args.turns) for a in (0, 1)}
        mdps.append((theta, draws))
    print(f"{args.mdps} random MDPs, up to {args.turns} turns, seed {args.seed}")
    for k in args.group_sizes:
        print(f"\ngroup size {k}")
        print("| estimator | largest error of the mean | variance vs rloo, median | lower than rloo's |")
        print("|---|---|---|---|")
        base, rows = None, {}
        for name, (advantages_of, per_length) in ESTIMATORS.items():
            errors, variances = [], []
            for theta, reward in mdps:
                mean, variance = moments(theta, reward, k, advantages_of, per_length)
                errors.append(np.abs(mean - exact_gradient(theta, reward)).max())
                variances.append(variance)
            variances = np.array(variances)
            base = variances if base is None else base
            rows[name] = (max(errors), np.median(variances / base), float((variances < base - 1e-12).mean()))
        for name, (error, ratio, lower) in rows.items():
            print(f"| {name} | {error:.1e} | {ratio:.2f} | {lower:.0%} |")


if __name__ == "__main__":
    main()
