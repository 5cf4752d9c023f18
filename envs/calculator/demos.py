"""Demonstrations of the calculator env for SFT: Hugging Face messages transcripts, some of them imperfect.

A demonstration is played through the env itself (reset from a seed, the tool call and the answer
sent with `step`), so every tool result and reward is the env's own. Two kinds:

- `tool`: call the calculator with the problem's expression, whose numbers are the question's,
  verbatim and in order; then answer with the tool's result alone. Always right (reward 1).
- `direct`: answer at once, without the tool, as a demonstrator doing the sum in their head:
  right with probability `direct_correct`, else a near miss.

The demonstrator skips the tool more often on the problems that look easy (no product of two drawn
numbers: templates in EASY_TEMPLATES), so a model that imitates it answers those in its head and
gets many wrong; RL with the env's reward has to learn to call the tool there too.

    python -m envs.calculator.demos launch/data/calculator_sft_train.jsonl --seeds 0:3000 --no-tool-list
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import numpy as np

from agentrl.env.tool_calls import CLOSE, OPEN
from envs.calculator.env import CalculatorEnv

EASY_TEMPLATES = frozenset({0, 4, 5})  # a - b + c, (a - b) * 2, a / b - c


@dataclass(frozen=True)
class Demonstrator:
    direct_easy: float = 0.6  # chance to answer an easy-looking problem without the tool
    direct_hard: float = 0.1  # ... and any other problem
    direct_correct: float = 0.5  # chance that an answer without the tool is right

    def direct_rate(self, template: int) -> float:
        return self.direct_easy if template in EASY_TEMPLATES else self.direct_hard


def tool_call(expression: str) -> dict:
    return {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}


def call_text(expression: str) -> str:
    """The turn a model writes for this call (as agentrl.sft.transcripts renders `tool_calls`)."""
    return OPEN + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + CLOSE


def near_miss(answer: str, rng: np.random.Generator) -> str:
    """A wrong answer close to the right one, as mental arithmetic gets it wrong."""
    value = int(float(answer))
    offset = int(rng.choice([-10, -2, -1, 1, 2, 10, int(rng.integers(3, 30))]))
    return str(value + offset)


def demonstration(env: CalculatorEnv, seed: int, kind: str, rng: np.random.Generator, direct_correct: float = 0.5):
    """One transcript of `kind` ("tool" or "direct") for the env's task of `seed`, and its reward."""
    question, info = env.reset(seed=seed)
    messages = [{"role": "user", "content": question}]
    if kind == "tool":
        observation, reward, terminated, _, _ = env.step(call_text(info["expression"]))
        assert not terminated and reward == 0, observation
        result = observation.split("\n")[1]  # <tool_response>\nRESULT\n</tool_response>
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [tool_call(info["expression"])]},
            {"role": "tool", "name": "calculator", "content": result},
        ]
        answer = result
    elif kind == "direct":
        answer = info["answer"] if rng.random() < direct_correct else near_miss(info["answer"], rng)
    else:
        raise ValueError(f"kind must be 'tool' or 'direct', got {kind!r}")
    _, reward, terminated, _, _ = env.step(answer)
    assert terminated
    messages.append({"role": "assistant", "content": answer})
    return {"messages": messages, **({"tools": env.tools} if env.tools else {})}, reward


def demonstrations(seeds, demonstrator: Demonstrator, env_kwargs: dict, seed: int = 0):
    """(transcript, kind, reward) for each env seed; the demonstrator's choices drawn from `seed`."""
    env = CalculatorEnv(**env_kwargs)
    rng = np.random.default_rng(seed)
    for task_seed in seeds:
        _, info = env.reset(seed=task_seed)
        kind = "direct" if rng.random() < demonstrator.direct_rate(info["template"]) else "tool"
        transcript, reward = demonstration(env, task_seed, kind, rng, demonstrator.direct_correct)
        yield transcript, kind, reward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="JSONL file to write")
    parser.add_argument("--seeds", default="0:4000", help="START:STOP env seeds (keep them out of heldout_seeds)")
    parser.add_argument("--max-value", type=int, default=99)
    parser.add_argument("--heldout-every", type=int, default=10)
    parser.add_argument("--direct-easy", type=float, default=Demonstrator.direct_easy)
    parser.add_argument("--direct-hard", type=float, default=Demonstrator.direct_hard)
    parser.add_argument("--direct-correct", type=float, default=Demonstrator.direct_correct)
    parser.add_argument("--no-tool-list", action="store_true", help="env kwarg list_tools=false: no tools in prompts")
    parser.add_argument("--only-tool", action="store_true", help="correct tool-using transcripts only")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demonstrator's choices")
    args = parser.parse_args()
    start, stop = map(int, args.seeds.split(":"))
    demonstrator = Demonstrator(
        0.0 if args.only_tool else args.direct_easy, 0.0 if args.only_tool else args.direct_hard, args.direct_correct
    )
    env_kwargs = {"max_value": args.max_value, "heldout_every": args.heldout_every}
    if args.no_tool_list:
        env_kwargs["list_tools"] = False
    counts = {"tool": 0, "direct": 0, "direct_right": 0}
    with open(args.out, "w") as out:
        for transcript, kind, reward in demonstrations(range(start, stop), demonstrator, env_kwargs, args.seed):
            out.write(json.dumps(transcript) + "\n")
            counts[kind] += 1
            counts["direct_right"] += int(kind == "direct" and reward == 1)
    total = counts["tool"] + counts["direct"]
    print(
        f"{args.out}: {total} transcripts, {counts['tool']} with the tool, {counts['direct']} without "
        f"({counts['direct_right']} of those right); demonstrator success "
        f"{(counts['tool'] + counts['direct_right']) / max(total, 1):.2f}"
    )


if __name__ == "__main__":
    main()
