"""Tools the qa env attaches by name (`env.kwargs.tools: [calculator, python, search]`), each a plain function.

Options per tool come from `env.kwargs.tool_options.NAME`:
    calculator  none
    python      cpu_seconds, wall_seconds, memory_mb, sandbox_backend, allow_weak_sandbox (see envs/python_tool)
    search      corpus_seed, num_documents, k, snippet_chars, k1, b: BM25 over the search_qa world (envs/search_qa)
"""

from __future__ import annotations

from collections.abc import Callable

TOOL_NAMES = ("calculator", "python", "search")


class CodeFailed(Exception):
    """The model's code did not run to a clean exit; the message is what the model reads."""


def make_tool(name: str, options: dict) -> Callable:
    builders = {"calculator": _calculator, "python": _python, "search": _search}
    if name not in builders:
        raise ValueError(f"qa env: unknown tool {name!r} in env.kwargs.tools; the tools: {', '.join(TOOL_NAMES)}")
    try:
        return builders[name](**options)
    except TypeError as error:
        raise ValueError(f"qa env: env.kwargs.tool_options.{name} does not fit the {name} tool: {error}") from None


def _calculator() -> Callable:
    from envs.calculator.arithmetic import evaluate, format_number

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses.

        Args:
            expression: the expression, for example "(12 + 3) * 4"
        """
        return format_number(evaluate(expression))

    return calculator


def _python(
    cpu_seconds: float = 5.0,
    wall_seconds: float = 10.0,
    memory_mb: int = 512,
    sandbox_backend: str = "auto",
    allow_weak_sandbox: bool = False,
) -> Callable:
    from agentrl.env.code_sandbox import SandboxLimits, choose_backend, require_contained, run_python

    backend = choose_backend(sandbox_backend)  # fail now, naming the fix, rather than in every call
    require_contained(backend, allow_weak_sandbox, allow_field="env.kwargs.tool_options.python.allow_weak_sandbox")
    limits = SandboxLimits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=memory_mb)

    def python(code: str) -> str:
        """Run a Python 3 program and return what it prints. Use print() to see results.

        Args:
            code: the program, for example "print(sum(range(10)))"
        """
        result = run_python(code, limits=limits, backend=sandbox_backend)
        if result.error is not None:
            raise CodeFailed(result.as_observation())
        return result.as_observation()

    return python


def _search(
    corpus_seed: int = 0,
    num_documents: int = 300,
    k: int = 3,
    snippet_chars: int = 200,
    k1: float = 1.2,
    b: float = 0.75,
) -> Callable:
    from envs.search_qa.library import load_library

    library = load_library(corpus_seed, num_documents, float(k1), float(b))
    default_k = k

    def search(query: str, k: int | None = None) -> str:
        """Search the encyclopedia and return the best-matching passages, each with its title.

        Args:
            query: keywords to look for, for example a name from the question
            k: how many passages to return, from 1 to 10
        """
        k = default_k if k is None else k
        if not 1 <= k <= 10:
            raise ValueError(f"k must be between 1 and 10, got {k}")
        hits = library.search(query, k)
        if not hits:
            return f"no passage matches {query!r}; search for names or other words from the question"
        shown = []
        for rank, (document, _) in enumerate(hits, 1):
            text = document.text
            text = text if len(text) <= snippet_chars else text[: snippet_chars - 3].rstrip() + "..."
            shown.append(f"[{rank}] {document.title}\n{text}")
        return "\n".join(shown)

    return search
