"""A synthetic GRPO batch the trainer-equivalence scripts share (imported via PYTHONPATH=repo root)."""

import numpy as np

from agentrl.trajectory import Episode, pack


def synthetic_batch(step: int, groups: range, vocab: int) -> dict:
    """8 groups x 4 episodes of random tokens and rewards for `step`, packed; only the groups in `groups`."""
    rng = np.random.default_rng(step)
    episodes = []
    for group in range(8):
        for _ in range(4):
            length = int(rng.integers(12, 30))
            e = Episode(group=group, task_seed=0, reward=float(rng.random() < 0.5))
            e.extend(rng.integers(3, vocab, size=6), mask=0)
            e.extend(rng.integers(3, vocab, size=length - 6), mask=1, logprobs=-rng.random(length - 6) * 3)
            episodes.append(e)
    return pack([e for e in episodes if e.group in groups])
