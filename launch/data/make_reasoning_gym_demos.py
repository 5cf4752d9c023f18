"""Writes imperfect demonstrations of reasoning_gym:basic_arithmetic for launch/configs/reasoning_gym_sft.yaml.

    python launch/data/make_reasoning_gym_demos.py      # rewrites reasoning_gym_sft_{train,val}.jsonl (seeded)

Each transcript is played through the adapter: reset from an env seed (train: 0..2999, the training side of the
held-out split; val: the held-out seeds 1000000..1000127), then an answer sent with `step`, so the kept reward is
reasoning-gym's own score. The demonstrator answers right `RIGHT` of the time, else a near miss (off by 1 or 2):
RL then has something to fix.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).parent
ENV_ID = "reasoning_gym:basic_arithmetic"
ENV_KWARGS = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
    "answer_tag": None,
    "heldout_every": 10,
}
RIGHT = 0.6
SPLITS = {"train": range(0, 3000), "val": range(1_000_000, 1_000_128)}


def demonstration(env, seed: int, rng: random.Random) -> tuple[dict, float]:
    """One transcript for env seed `seed` and the reward the env gave its answer."""
    question, info = env.reset(seed=seed)
    answer = int(info["answer"])
    if rng.random() >= RIGHT:
        answer += rng.choice([-2, -1, 1, 2])
    _, reward, terminated, _, _ = env.step(str(answer))
    assert terminated, "a basic_arithmetic episode ends with its one answer"
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": str(answer)}]
    return {"messages": messages}, reward


def main() -> None:
    sys.path.insert(0, str(HERE.parents[1]))
    from agentrl.env import make

    env = make(ENV_ID, **ENV_KWARGS)
    for index, (split, seeds) in enumerate(SPLITS.items()):
        rng = random.Random(index)
        rows, rewards = [], []
        for seed in seeds:
            row, reward = demonstration(env, seed, rng)
            rows.append(row)
            rewards.append(reward)
        path = HERE / f"reasoning_gym_sft_{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        success = sum(reward >= 1 for reward in rewards) / len(rows)
        print(f"wrote {len(rows)} transcripts to {path}: demonstrator success {success:.2f}")


if __name__ == "__main__":
    main()
