"""Arithmetic word problems, generated from the seed, with a `calculator` tool.

The model may call the calculator any number of times (up to `max_steps` turns); a turn
without a tool call is its final answer: reward 1 when the last number in it is right.

Held-out problems: with `heldout_every = N > 0`, one problem in N (by a hash of its template
and numbers) is held out. Seeds in `heldout_seeds` (first seed, count; the default is
`eval.seeds`' default range) draw only held-out problems, every other seed only the rest, so a
training run never sees a problem its evaluation asks.

`list_tools: false` leaves the tool list out of the prompt (the calculator still answers calls):
for a model that learnt the call format from demonstrations, it halves the prompt.
"""

from __future__ import annotations

from agentrl.env.heldout import DEFAULT_SEEDS, HeldoutSplit
from agentrl.env.tools import ToolEnv, tool
from agentrl.rewards import last_number
from envs.calculator.arithmetic import evaluate, format_number

# (problem text, expression of the answer); fields a, b, c are drawn per episode
TEMPLATES = [
    (
        "A shop has {a} apples. It sells {b} and then receives {c} more. How many apples does it have?",
        "{a} - {b} + {c}",
    ),
    ("A box holds {a} pens. How many pens are in {b} boxes, plus {c} loose pens?", "{a} * {b} + {c}"),
    ("{a} students share {b} sweets each, and the teacher adds {c}. How many sweets in total?", "{a} * {b} + {c}"),
    ("A train travels {a} km on each of {b} days, then {c} km more. How far does it go?", "{a} * {b} + {c}"),
    ("You have {a} coins, give away {b}, then double what is left. How many coins now?", "({a} - {b}) * 2"),
    (
        "A rope of {a} m is cut into pieces of {b} m, then {c} pieces are used. How many pieces remain?",
        "{a} / {b} - {c}",
    ),
]
HELDOUT_SEEDS = DEFAULT_SEEDS


class CalculatorEnv(ToolEnv):
    reusable = True  # reset draws the problem; ToolEnv's sets the turn count

    def __init__(
        self,
        max_value: int = 99,
        max_steps: int = 6,
        heldout_every: int = 0,
        heldout_seeds: tuple[int, int] | list[int] = HELDOUT_SEEDS,
        list_tools: bool = True,
    ):
        super().__init__(max_steps=max_steps)
        if max_value < 4:
            raise ValueError(f"calculator needs max_value >= 4, got {max_value}")
        self.split = HeldoutSplit(heldout_every, heldout_seeds)
        self.max_value = max_value
        self.target: float | None = None
        if not list_tools:  # the tool still works; the prompt just does not describe it (a model taught by demos)
            self.tools = []

    @tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses.

        Args:
            expression: the expression, for example "(12 + 3) * 4"
        """
        return format_number(evaluate(expression))

    def is_heldout(self, question: str) -> bool:
        """True for the problems held out for evaluation (none when heldout_every is 0)."""
        return self.split.is_heldout(question)

    def _draw(self) -> tuple[str, str, int]:
        rng = self.np_random
        template = int(rng.integers(len(TEMPLATES)))
        text, expression = TEMPLATES[template]
        b = int(rng.integers(2, 10))
        a = (
            b * int(rng.integers(2, self.max_value // b + 1))
            if "/" in expression
            else int(rng.integers(b, self.max_value + 1))
        )
        c = int(rng.integers(1, min(a // b, 10) + 1)) if "/" in expression else int(rng.integers(1, 10))
        fields = {"a": a, "b": b, "c": c}
        return text.format(**fields), expression.format(**fields), template

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        question, expression, template = self.split.draw(seed, self._draw, text_of=lambda drawn: drawn[0])
        self.target = evaluate(expression)
        return question, {"answer": format_number(self.target), "expression": expression, "template": template}

    def answer(self, text):
        guess = last_number(text)
        success = guess is not None and abs(float(guess) - self.target) < 1e-6
        return ("correct" if success else "wrong"), float(success), True, False, {"success": success}
