"""The one-turn digit task the side-by-side benchmarks train on: the prompt names a digit, the reply is graded.

    python -m benchmarks.tasks.digit OUT.jsonl [ROWS]     # rows {"id", "prompt", "answer"} for the qa env

Reward (`digit_reward`, used as the qa env's `reward_fn: benchmarks.tasks.digit:digit_reward`): 1 for the named
digit, 0.1 for any other digit, 0 for anything else. `digit_score` is the same reward with a success only for the
named digit (with `digit_reward` alone the qa env counts any reward above 0, any digit, a success).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def rows(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for index in range(count):
        digit = rng.randrange(10)
        out.append({"id": f"digit-{index:05d}", "prompt": f"Write the digit {WORDS[digit]}.", "answer": str(digit)})
    return out


def digit_reward(completion: str, answer: str | None, **_) -> float:
    text = completion.strip()
    if text == answer:
        return 1.0
    return 0.1 if len(text) == 1 and text.isdigit() else 0.0


def digit_score(completion: str, answer: str | None, **_) -> dict:
    return {"reward": digit_reward(completion, answer), "success": completion.strip() == answer}


def write(path: Path, count: int, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows(count, seed)))


if __name__ == "__main__":
    write(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 512)
