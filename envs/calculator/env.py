"""Arithmetic word problems, generated from the seed, with a `calculator` tool.

The model may call the calculator any number of times (up to `max_steps` turns); a turn
without a tool call is its final answer: reward 1 when the last number in it is right.
"""

from __future__ import annotations

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


class CalculatorEnv(ToolEnv):
    def __init__(self, max_value: int = 99, max_steps: int = 6):
        super().__init__(max_steps=max_steps)
        if max_value < 4:
            raise ValueError(f"calculator needs max_value >= 4, got {max_value}")
        self.max_value = max_value
        self.target: float | None = None

    @tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses.

        Args:
            expression: the expression, for example "(12 + 3) * 4"
        """
        return format_number(evaluate(expression))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        text, expression = TEMPLATES[int(self.np_random.integers(len(TEMPLATES)))]
        rng = self.np_random
        b = int(rng.integers(2, 10))
        a = (
            b * int(rng.integers(2, self.max_value // b + 1))
            if "/" in expression
            else int(rng.integers(b, self.max_value + 1))
        )
        c = int(rng.integers(1, min(a // b, 10) + 1)) if "/" in expression else int(rng.integers(1, 10))
        fields = {"a": a, "b": b, "c": c}
        self.target = evaluate(expression.format(**fields))
        return text.format(**fields), {"answer": format_number(self.target)}

    def answer(self, text):
        guess = last_number(text)
        success = guess is not None and abs(float(guess) - self.target) < 1e-6
        return ("correct" if success else "wrong"), float(success), True, False, {"success": success}
