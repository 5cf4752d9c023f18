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
    python -m envs.calculator.demos launch/data/calculator_chat_sft_train.jsonl --seeds 0:3000 --no-tool-list \
        --call-ids --reasoning        # for the model families' formats (docs/chat-formats.md)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agentrl.sft import demos
from envs.calculator.env import CalculatorEnv

EASY_TEMPLATES = frozenset({0, 4, 5})  # a - b + c, (a - b) * 2, a / b - c


@dataclasses.dataclass(frozen=True)
class Demonstrator(demos.Demonstrator):
    easy: frozenset = EASY_TEMPLATES


def call_text(expression: str) -> str:
    """The turn a model writes to call the calculator."""
    return demos.call_text("calculator", {"expression": expression})


def near_miss(answer: str, rng: np.random.Generator) -> str:
    """A wrong answer close to the right one, as mental arithmetic gets it wrong."""
    return str(int(float(answer)) + demos.miss_by(rng))


def demonstration(env: CalculatorEnv, seed: int, kind: str, rng: np.random.Generator, direct_correct: float = 0.5):
    """One transcript of `kind` ("tool" or "direct") for the env's task of `seed`, and its reward."""
    question, info = env.reset(seed=seed)

    def direct() -> str:
        return info["answer"] if rng.random() < direct_correct else near_miss(info["answer"], rng)

    return demos.play(env, question, kind, [("calculator", {"expression": info["expression"]})], direct)


def demonstrations(seeds, demonstrator: Demonstrator, env_kwargs: dict, seed: int = 0):
    """(transcript, kind, reward) for each env seed; the demonstrator's choices drawn from `seed`."""
    env = CalculatorEnv(**env_kwargs)
    rng = np.random.default_rng(seed)
    yield from demos.play_all(env, seeds, demonstrator, lambda info: info["template"], demonstration, lambda _: rng)


def main() -> None:
    parser = demos.demonstration_parser(__doc__, "0:4000", Demonstrator())
    parser.add_argument("--max-value", type=int, default=99)
    parser.add_argument("--heldout-every", type=int, default=10)
    args = parser.parse_args()
    demonstrator = demos.demonstrator_from(args, EASY_TEMPLATES)
    env_kwargs = demos.env_kwargs_from(args, max_value=args.max_value, heldout_every=args.heldout_every)
    rows = demonstrations(demos.seed_range(args), demonstrator, env_kwargs, args.seed)
    print(demos.write_demonstrations(args.out, demos.dressed(rows, args)))


if __name__ == "__main__":
    main()
