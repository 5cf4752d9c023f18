"""Write calculator transcripts in the Hugging Face messages format: a tool call with the problem's
expression, the tool's result, then the answer. The example data of launch/configs/sft_example.yaml.

    python examples/sft/make_calculator_transcripts.py examples/sft/calculator_train.jsonl --seeds 0:48
"""

from __future__ import annotations

import argparse
import json

from gymnasium.utils import seeding

from envs.calculator.arithmetic import evaluate, format_number
from envs.calculator.env import TEMPLATES, CalculatorEnv


def problem(seed: int, max_value: int) -> tuple[str, str]:
    """The question and the answer's expression for `seed`: CalculatorEnv.reset's draws, replayed."""
    rng, _ = seeding.np_random(seed)
    text, expression = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
    b = int(rng.integers(2, 10))
    a = b * int(rng.integers(2, max_value // b + 1)) if "/" in expression else int(rng.integers(b, max_value + 1))
    c = int(rng.integers(1, min(a // b, 10) + 1)) if "/" in expression else int(rng.integers(1, 10))
    fields = {"a": a, "b": b, "c": c}
    return text.format(**fields), expression.format(**fields)


def transcript(seed: int, max_value: int, tools: list[dict]) -> dict:
    question, expression = problem(seed, max_value)
    env = CalculatorEnv(max_value=max_value)
    observation, info = env.reset(seed=seed)
    assert observation == question, "the replayed draws no longer match CalculatorEnv.reset"
    result = format_number(evaluate(expression))
    assert result == info["answer"]
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
    return {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": result},
            {"role": "assistant", "content": f"The answer is {result}."},
        ],
        "tools": tools,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--seeds", default="0:48", help="START:STOP env seeds")
    parser.add_argument("--max-value", type=int, default=50)
    args = parser.parse_args()
    start, stop = map(int, args.seeds.split(":"))
    tools = CalculatorEnv().tools
    with open(args.out, "w") as out:
        for seed in range(start, stop):
            out.write(json.dumps(transcript(seed, args.max_value, tools)) + "\n")


if __name__ == "__main__":
    main()
