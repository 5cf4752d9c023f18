"""Chat transcripts that teach a tiny model to judge like examples/judge/scripted_judge.py (the largest digit in
the reply is its score), for examples/judge/judge_sft.yaml. The replies are every token the policy can write (one
token a turn in examples/judge/served_judge.yaml), read from the policy's tokenizer, so the judge has seen each.

    python examples/judge/make_judge_transcripts.py runs/judge-bandit-model runs/judge-sft-data.jsonl
"""

from __future__ import annotations

import json
import sys

from scripted_judge import score_of
from transformers import AutoTokenizer

RUBRIC = "Rate the reply from 0 to 9.\nReply: {completion}"  # as served_judge.yaml's reward.judge.rubric
# Copies of each reply: a reply with a digit (9 of the policy's 97 tokens) 12 times as often as one without, so
# about half the transcripts teach a score above 0. With 8 copies of each, the judge learnt to answer 0 always.
COPIES, DIGIT_COPIES = 4, 48


def transcripts(policy_path: str) -> list[dict]:
    tokenizer = AutoTokenizer.from_pretrained(policy_path)
    replies = sorted({tokenizer.decode([token]) for token in range(len(tokenizer))} - {""})
    rows = []
    for reply in replies:
        prompt = RUBRIC.replace("{completion}", reply)
        score = score_of(prompt)
        row = {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": f"Score: {score}"}]}
        rows += [row] * (DIGIT_COPIES if score else COPIES)
    return rows


if __name__ == "__main__":
    policy, out = sys.argv[1], sys.argv[2]
    rows = transcripts(policy)
    with open(out, "w") as file:
        file.writelines(json.dumps(row) + "\n" for row in rows)
    print(f"{len(rows)} transcripts -> {out}")
