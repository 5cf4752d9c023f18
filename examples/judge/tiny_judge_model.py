"""A tiny random judge model for examples/judge/served_judge.yaml: a Qwen2-shaped causal LM whose tokenizer knows
every printable character, so `agentrl serve` can hold it to a JSON score schema (response_format).

    python examples/judge/tiny_judge_model.py runs/tiny-judge-model
    agentrl serve runs/tiny-judge-model --port 8124 --model-name tiny-judge
"""

from __future__ import annotations

import string
import sys

from agentrl.models.tiny import TinyShape, build_tiny_model

TEXTS = [string.printable, 'Rate the reply from 0 to 9. Reply: 5 {"score": 7}']

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "runs/tiny-judge-model"
    print(build_tiny_model(out, TEXTS, TinyShape(hidden_size=32, num_layers=2, num_heads=4, vocab_size=160)))
