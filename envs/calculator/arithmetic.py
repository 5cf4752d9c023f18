"""Safe arithmetic: + - * / and parentheses on numbers, parsed with `ast`; no names, calls or powers."""

from __future__ import annotations

import ast
import operator

MAX_EXPRESSION = 200
MAX_MAGNITUDE = 1e15
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
SIGNS = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; ValueError (with the reason) for anything else."""
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in SIGNS:
        return SIGNS[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        result = OPERATORS[type(node.op)](left, right)
        if abs(result) > MAX_MAGNITUDE:
            raise ValueError(f"result larger than {MAX_MAGNITUDE:g}")
        return result
    raise ValueError(f"only numbers, + - * / and parentheses are allowed; found {ast.unparse(node)!r}")


def format_number(value: int | float) -> str:
    """Integers without a decimal point; other values rounded to 6 places."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.6f}".rstrip("0")
