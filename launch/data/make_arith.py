"""Writes the tiny example datasets of launch/configs/qa_arith.yaml: arith_train.jsonl and arith_val.jsonl.

    python launch/data/make_arith.py            # rewrites both files, the same every time (seeded)

Two kinds of rows, told apart by `data_source` so the qa env grades each its own way: `sum` rows
("What is 23 + 8?", graded by number_match) and `compare` rows ("Is 23 larger than 8? Answer yes or
no.", graded by exact_match).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
SIZES = {"train": 320, "val": 64}


def make_row(rng: random.Random, split: str, index: int) -> dict:
    a, b = rng.randint(1, 50), rng.randint(1, 50)
    if rng.random() < 0.75:
        op = rng.choice(["+", "-", "*"])
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return {
            "id": f"{split}-{index:04d}",
            "prompt": f"What is {a} {op} {b}?",
            "answer": str(value),
            "data_source": "sum",
        }
    answer = "yes" if a > b else "no"
    prompt = f"Is {a} larger than {b}? Answer yes or no."
    return {"id": f"{split}-{index:04d}", "prompt": prompt, "answer": answer, "data_source": "compare"}


def main() -> None:
    for seed, (split, size) in enumerate(SIZES.items()):
        rng = random.Random(seed)
        rows = [make_row(rng, split, index) for index in range(size)]
        path = HERE / f"arith_{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
