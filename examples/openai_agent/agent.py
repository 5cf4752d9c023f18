"""A calculator agent written only against the `openai` SDK, with function calling: no agentrl import.

agentrl starts it once per episode (agent.command). It reads its task, a row like
{"question": "...", "answer": 42}, as JSON on stdin; OPENAI_BASE_URL and OPENAI_API_KEY point it at
its session of the policy under training. It prints its reward as its last line.

    echo '{"question": "What is 6 * 7?", "answer": 42}' | OPENAI_BASE_URL=... OPENAI_API_KEY=... python agent.py
"""

import ast
import json
import operator
import os
import re
import sys

from openai import OpenAI

MODEL = os.environ.get("AGENT_MODEL", "policy")
MAX_TURNS = int(os.environ.get("AGENT_MAX_TURNS", "3"))
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (12 - 4) * 2"}},
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
        raise ValueError(f"not arithmetic: {ast.unparse(node)}")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as error:
        return f"error: {error}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6f}".rstrip("0")


def last_number(text: str) -> float | None:
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text or "")
    return float(numbers[-1]) if numbers else None


def solve(client: OpenAI, question: str) -> str:
    """The agent's final answer: call the model, run the calculator when it asks, until it answers."""
    messages = [{"role": "user", "content": question}]
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR]).choices[0].message
        if not reply.tool_calls:
            return reply.content or ""
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls:
            arguments = json.loads(call.function.arguments or "{}")
            known = call.function.name == "calculator"
            result = calculate(str(arguments.get("expression", ""))) if known else "no such tool"
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": result})
    return ""


def main() -> None:
    task = json.load(sys.stdin)
    answer = solve(OpenAI(), task["question"])
    guess = last_number(answer)
    correct = guess is not None and abs(guess - float(task["answer"])) < 1e-6
    print(json.dumps({"reward": 1.0 if correct else 0.0, "success": correct}))


if __name__ == "__main__":
    main()
