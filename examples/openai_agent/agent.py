"""A calculator agent written only against the `openai` SDK, with function calling: no agentrl import.

Run once per episode (agent.command), it reads its task, a row like {"question": "...", "answer": "42"},
as JSON on stdin; OPENAI_BASE_URL and OPENAI_API_KEY point it at its session of the policy under
training, and it prints its reward as its last line. service.py runs the same `solve` for many
sessions at once, as a long-lived service.

    echo '{"question": "What is 6 * 7?", "answer": "42"}' | OPENAI_BASE_URL=... OPENAI_API_KEY=... python agent.py
"""

import ast
import asyncio
import json
import operator
import os
import re
import sys

from openai import AsyncOpenAI

MODEL = os.environ.get("AGENT_MODEL", "policy")
MAX_CALLS = int(os.environ.get("AGENT_MAX_CALLS", "3"))
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": 'the expression, for example "(12 + 3) * 4"'}
            },
            "required": ["expression"],
        },
    },
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"only numbers, + - * / and parentheses are allowed: {expression!r}")

    try:
        result = value(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as error:
        return f"error: {error}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6f}".rstrip("0")


async def solve(client: AsyncOpenAI, question: str) -> tuple[str, int]:
    """The final answer and the number of tool calls: call the model, run the calculator when asked, repeat."""
    messages = [{"role": "user", "content": question}]
    calls = 0
    for _ in range(MAX_CALLS):
        response = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR])
        reply = response.choices[0].message
        if not reply.tool_calls:
            return reply.content or "", calls
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls:
            calls += 1
            try:
                expression = str(json.loads(call.function.arguments or "{}").get("expression", ""))
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            result = calculate(expression) if call.function.name == "calculator" else "error: no such tool"
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": result})
    return "", calls


def score(answer: str, expected) -> bool:
    """Right when the last number in the answer is the expected one."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer or "")
    return bool(numbers) and abs(float(numbers[-1]) - float(expected)) < 1e-6


async def main() -> None:
    task = json.load(sys.stdin)
    answer, _ = await solve(AsyncOpenAI(max_retries=2), task["question"])
    correct = score(answer, task["answer"])
    print(json.dumps({"reward": 1.0 if correct else 0.0, "success": correct}))


if __name__ == "__main__":
    asyncio.run(main())
