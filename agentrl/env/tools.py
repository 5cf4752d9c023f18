"""Tool-using environments: methods marked `@tool` become tools the model calls.

    class Calc(ToolEnv):
        @tool
        def add(self, a: int, b: int) -> str:
            '''Add two integers.

            Args:
                a: the first addend
                b: the second addend
            '''
            return str(a + b)

        def reset(self, *, seed=None, options=None): ...
        def answer(self, text): ...   # a turn without a tool call is the final answer

The schema of each tool is built from the signature, the type hints and the docstring
(first paragraph: the description; an `Args:` section: the parameter descriptions).
`step` parses the turn's tool calls in the run's chat format (Hermes unless the env loop names
another: `use_chat_format`), validates and runs them, and returns their results as the
observation (<tool_response> blocks) and one by one in `info["tool_results"]`, from which the
agent loop builds the tool messages its chat template renders; malformed calls and tools that
raise become error messages the model reads, counted in `info["tool_errors"]`.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import types
import typing
from dataclasses import dataclass

from agentrl.chat.family import ChatFamily
from agentrl.chat.hermes import HermesFamily
from agentrl.env.api import TextEnv
from agentrl.env.tool_calls import ParsedTurn

JSON_TYPES: dict[type, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}
TOOL_MARK = "__agentrl_tool__"


@dataclass(frozen=True)
class Tool:
    """A tool as the model sees it: name, description and a JSON-schema object for its parameters."""

    name: str
    description: str
    parameters: dict

    def schema(self) -> dict:
        """The OpenAI/Hugging Face function format that chat templates take as `tools=`."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def tool(method):
    """Mark a ToolEnv method as a tool; it takes JSON-typed arguments and returns text."""
    setattr(method, TOOL_MARK, True)
    return method


def describe(function) -> Tool:
    """A Tool from a function's signature, type hints and docstring."""
    hints = typing.get_type_hints(function)
    summary, arg_docs = _parse_docstring(inspect.getdoc(function) or "")
    properties, required = {}, []
    for name, parameter in inspect.signature(function).parameters.items():
        if name == "self":
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"tool {function.__name__}: *args/**kwargs cannot be described; name every parameter")
        if name not in hints:
            raise TypeError(f"tool {function.__name__}: parameter {name!r} needs a type hint (str, int, float, ...)")
        spec = _json_type(hints[name], f"tool {function.__name__} parameter {name!r}")
        if name in arg_docs:
            spec["description"] = arg_docs[name]
        properties[name] = spec
        if parameter.default is parameter.empty:
            required.append(name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return Tool(function.__name__, summary, parameters)


def _json_type(hint, where: str) -> dict:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(options) == 1:
            return _json_type(options[0], where)
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(hint))}
    base = origin or hint
    if base in JSON_TYPES:
        return {"type": JSON_TYPES[base]}
    raise TypeError(f"{where}: type {hint!r} has no JSON-schema equivalent; use str, int, float, bool, list or dict")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    arg_docs: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
        elif in_args and (match := re.match(r"(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)", stripped)):
            arg_docs[match.group(1)] = match.group(2)
        elif in_args and not stripped:
            in_args = False
    return summary, arg_docs


def validate_arguments(tool_: Tool, arguments: dict) -> str | None:
    """None when `arguments` fit the tool's schema, else what is wrong (for the model to read)."""
    schema = tool_.parameters
    missing = [name for name in schema["required"] if name not in arguments]
    if missing:
        return f"tool {tool_.name!r} is missing required argument(s) {', '.join(missing)}"
    unknown = [name for name in arguments if name not in schema["properties"]]
    if unknown:
        known = ", ".join(schema["properties"]) or "none"
        return f"tool {tool_.name!r} has no argument(s) {', '.join(unknown)}; its arguments: {known}"
    for name, value in arguments.items():
        spec = schema["properties"][name]
        if "enum" in spec and value not in spec["enum"]:
            return f"tool {tool_.name!r} argument {name!r} must be one of {spec['enum']}, got {value!r}"
        if "type" in spec and not _has_json_type(value, spec["type"]):
            return f"tool {tool_.name!r} argument {name!r} must be a JSON {spec['type']}, got {json.dumps(value)}"
    return None


def _has_json_type(value, json_type: str) -> bool:
    if json_type == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if json_type == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    python = {"string": str, "boolean": bool, "array": list, "object": dict}[json_type]
    return isinstance(value, python)


@functools.cache
def class_tools(env_class: type) -> dict[str, Tool]:
    """The `@tool` methods of an env class, described once per class (not per episode's instance)."""
    return {
        name: describe(member)
        for name, member in inspect.getmembers(env_class, inspect.isfunction)
        if getattr(member, TOOL_MARK, False)
    }


class ToolEnv(TextEnv):
    """A TextEnv whose `@tool` methods the model calls; subclasses implement `reset` and `answer`.

    `answer(text)` grades a turn without tool calls (the final answer) and returns the
    step tuple `(obs, reward, terminated, truncated, info)`. With `max_steps`, the episode
    is truncated (success False) after that many turns. `step` before `reset` or after
    the episode ended raises, asking for `reset()`. Subclasses call
    `super().reset(seed=seed)` first in their `reset`.
    """

    def __init__(self, max_steps: int | None = None):
        super().__init__()
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 (or None for no limit), got {max_steps}")
        self.max_steps = max_steps
        self.turns: int | None = None  # None until the first reset
        self.over = False
        self._tools = dict(class_tools(type(self)))
        self.tools: list[dict] = [t.schema() for t in self._tools.values()]
        self.chat_family: ChatFamily = HermesFamily()

    def use_chat_format(self, name: str) -> None:
        """Parse turns in the chat format family `name` (agentrl.chat; the run's chat.format, set by the env host)."""
        self.chat_family = chat_family(name)

    def add_tool(self, function) -> None:
        """Give this instance one more tool: a plain function (JSON-typed arguments, text result), described from
        its name, signature and docstring like a `@tool` method."""
        described = describe(function)
        if described.name in self._tools:
            raise ValueError(f"{type(self).__name__} already has a tool named {described.name!r}")
        self._tools[described.name] = described
        setattr(self, described.name, function)
        self.tools = [t.schema() for t in self._tools.values()]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.turns, self.over = 0, False

    def answer(self, text: str):
        raise NotImplementedError(f"{type(self).__name__} must implement answer(text) to grade final answers")

    def step(self, action: str):
        if self.turns is None:
            raise RuntimeError("step() called before reset(); call reset() to start an episode")
        if self.over:
            raise RuntimeError("step() called after the episode ended; call reset() to start a new one")
        self.turns += 1
        turn = self.chat_family.parse(action, tools=self.tools)
        if turn.has_calls:
            results = self.tool_results(turn)
            obs = "\n".join(f"<tool_response>\n{result['content']}\n</tool_response>" for result in results)
            reward, terminated, truncated = 0.0, False, False
            errors = sum(not result["ok"] for result in results)
            info = {"tool_calls": len(results), "tool_errors": errors, "tool_results": results}
        else:  # the final answer: the turn's text, or its content where markup (reasoning, channels) surrounds it
            obs, reward, terminated, truncated, info = self.answer(
                action if turn.content == action.strip() else turn.content
            )
        if not (terminated or truncated) and self.max_steps is not None and self.turns >= self.max_steps:
            truncated, info = True, {**info, "success": False}
        self.over = terminated or truncated
        return obs, reward, terminated, truncated, info

    def run_tools(self, turn: ParsedTurn) -> tuple[str, int]:
        """Each call's result or error in a <tool_response> block (parse errors first), and the error count."""
        results = self.tool_results(turn)
        responses = "\n".join(f"<tool_response>\n{result['content']}\n</tool_response>" for result in results)
        return responses, sum(not result["ok"] for result in results)

    def tool_results(self, turn: ParsedTurn) -> list[dict]:
        """One result per parse error (first; `name` and `id` None) and per call, in order: {"id": the call's id
        where the format writes one, "name", "content": the result or the error's text, "ok"}."""
        results = [{"id": None, "name": None, "content": f"error: {error}", "ok": False} for error in turn.errors]
        for call in turn.calls:
            content, ok = self._call(call.name, call.arguments)
            results.append({"id": call.id, "name": call.name, "content": content, "ok": ok})
        return results

    def _call(self, name: str, arguments: dict) -> tuple[str, bool]:
        tool_ = self._tools.get(name)
        if tool_ is None:
            return f"error: unknown tool {name!r}; available tools: {', '.join(self._tools) or 'none'}", False
        problem = validate_arguments(tool_, arguments)
        if problem:
            return f"error: {problem}", False
        try:
            result = getattr(self, name)(**arguments)
        except Exception as error:  # tool code is user code: the model sees the error, the episode goes on
            return f"error: tool {name!r} raised {type(error).__name__}: {error}", False
        return (result if isinstance(result, str) else json.dumps(result)), True


@functools.cache
def chat_family(name: str) -> ChatFamily:
    """The parser of the chat format family `name`, one per process."""
    from agentrl.chat.registry import resolve

    return resolve(name)()
