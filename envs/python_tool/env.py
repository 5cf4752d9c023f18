"""Word problems solved with a `python` tool that runs the model's code in the sandbox.

The model may run code any number of times (up to `max_steps` turns); each run's output
(or its traceback, or the reason it was stopped) comes back as the tool response. A turn
without a tool call is the final answer: reward 1 when it matches the problem's answer.
A snippet that fails (exception, non-zero exit, timeout, memory limit) counts in
`info["tool_errors"]` like any other failed tool call.

`heldout_every: N` holds out one problem in N for evaluation (agentrl.env.heldout: env seeds from 1000000 draw only
those, every other seed never does); `list_tools: false` leaves the tool's description out of the prompt (the tool
still runs), for a model that learnt the call from demonstrations (envs/python_tool/demos.py).
"""

from __future__ import annotations

import functools

from agentrl.env.code_sandbox import SandboxLimits, choose_backend, require_contained, run_python
from agentrl.env.heldout import DEFAULT_SEEDS, HeldoutSplit
from agentrl.env.tools import ToolEnv, tool
from envs.python_tool.grading import is_correct
from envs.python_tool.problems import Problem, check_difficulty, check_families, generate


class CodeFailed(Exception):
    """The model's code did not run to a clean exit; the message is what the model reads."""


class PythonToolEnv(ToolEnv):
    def __init__(
        self,
        difficulty: int = 1,
        families: list[str] | None = None,
        max_steps: int = 4,
        cpu_seconds: float = 5.0,
        wall_seconds: float = 10.0,
        memory_mb: int = 512,
        sandbox_backend: str = "auto",
        allow_weak_sandbox: bool = False,
        heldout_every: int = 0,
        heldout_seeds: tuple[int, int] | list[int] = DEFAULT_SEEDS,
        list_tools: bool = True,
    ):
        super().__init__(max_steps=max_steps)
        self.split = HeldoutSplit(heldout_every, heldout_seeds)
        check_families(families)
        check_difficulty(difficulty)
        # fail now, naming the fix, rather than in every tool call
        backend = choose_backend(sandbox_backend)
        require_contained(backend, allow_weak_sandbox, allow_field="env.kwargs.allow_weak_sandbox")
        self.difficulty, self.families = difficulty, families
        self.limits = SandboxLimits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=memory_mb)
        self.sandbox_backend = sandbox_backend
        self.problem: Problem | None = None
        if not list_tools:
            self.tools = []

    @tool
    def python(self, code: str) -> str:
        """Run a Python 3 program and return what it prints. Use print() to see results.

        Args:
            code: the program, for example "print(sum(range(10)))"
        """
        result = run_python(code, limits=self.limits, backend=self.sandbox_backend)
        if result.error is not None:  # an exception, a non-zero exit, or a limit hit
            raise CodeFailed(result.as_observation())
        return result.as_observation()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        draw = functools.partial(generate, self.np_random, self.difficulty, self.families)
        self.problem = self.split.draw(seed, draw, text_of=lambda problem: problem.text)
        return self.problem.text, {"answer": self.problem.answer, "family": self.problem.family}

    def answer(self, text):
        success = is_correct(self.problem, text)
        return ("correct" if success else "wrong"), float(success), True, False, {"success": success}
