"""The output grammar a chat request asks for: tool_choice required or named, response_format json_object or
json_schema. The engine holds its output to it (agentrl/engine/grammar.py); a request it cannot honour is refused.

Tool calls are the Hermes calls (the `hermes` and `qwen3` chat formats), one JSON object per call with the tool's
name and arguments following the tool's parameter schema:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

JSON is written as `json.dumps` writes it (", " and ": ", no other whitespace): the way chat templates show the
model its own calls, and no room for a weak model to pad with spaces until max_tokens. Other families write calls
in markup of their own, so their tool_choice required or named is refused; so is any grammar where the turn opens
with markup (harmony's channel header) or the prompt opens the model's reasoning (DeepSeek R1).
"""

from __future__ import annotations

import json

from agentrl.chat import ChatFamily
from agentrl.chat.hermes import HermesFamily
from agentrl.engine.grammar import INSTALL_HINT, Grammar, GrammarUnavailable, check_grammar
from agentrl.env.tool_calls import CLOSE, OPEN
from agentrl.serve.protocol import APIError, ChatCompletionRequest

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT = {"type": "object"}
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def output_grammar(request: ChatCompletionRequest, backend, family: ChatFamily | None = None) -> Grammar | None:
    """The grammar `request`'s output must match (None: no constraint), checked; an APIError naming the option
    where it is malformed, contradicts the tools, `backend` cannot constrain its engine's outputs, or the chat
    format `family` (None: Hermes) writes its turns in a way the grammar does not."""
    calls = _forced_calls(request)
    answer = _answer_schema(request)
    if calls is None and answer is None:
        return None
    option = "tool_choice" if calls is not None else "response_format"
    if family is not None:
        _check_family(family, option, calls is not None or request.tools_offered())
    if request.ignore_eos:
        raise APIError(
            f"ignore_eos cannot be combined with {option}: the output must end where it is complete",
            param="ignore_eos",
        )
    if not getattr(backend, "grammars", False):
        raise APIError(
            f"{option} needs constrained decoding, which this server's engine cannot do (the torch engines can; "
            "agentrl runs SGLang without its tokenizer); leave it unset",
            param=option,
            code="unsupported_parameter",
        )
    many = request.parallel_tool_calls and request.tool_choice_name() is None
    if calls is not None:  # the reply is tool calls only: a response_format has no text to shape
        grammar = Grammar(lark=_lark(calls, many, None))
    elif request.tools_offered():  # auto: tool calls, or an answer in the format
        grammar = Grammar(lark=_lark(_tools(request), many, answer))
    else:
        grammar = Grammar(json_schema=json.dumps(json_styled(answer)))
    try:
        problem = check_grammar(grammar)
    except GrammarUnavailable:
        raise APIError(
            f"{option} needs constrained decoding, and llguidance is not installed on the server; {INSTALL_HINT}",
            param=option,
            code="unsupported_parameter",
        ) from None
    if problem:
        where = "response_format.json_schema.schema" if calls is None else "tools"
        raise APIError(f"{where}: the schema cannot be followed: {problem.strip()}", param=option)
    return grammar


def _check_family(family: ChatFamily, option: str, with_calls: bool) -> None:
    """An APIError where `family`'s turns cannot follow the grammar: calls in markup other than Hermes', or a turn
    that opens with markup of its own (a capture mode first: harmony's channel header)."""
    if with_calls and not isinstance(family, HermesFamily):
        raise APIError(
            f"{option} with tools needs constrained decoding of tool calls, which agentrl writes as Hermes "
            f"<tool_call> JSON, not as the {family.name} chat format writes them; use tool_choice auto (or leave "
            f"{option} unset)",
            param=option,
            code="unsupported_parameter",
        )
    if family.modes[family.start].channel is None:
        raise APIError(
            f"{option} needs constrained decoding from the reply's first token, where the {family.name} chat format "
            "writes markup of its own; leave it unset",
            param=option,
            code="unsupported_parameter",
        )


def grammar_in_reasoning(request: ChatCompletionRequest, family_name: str) -> APIError:
    """The error for a grammar (tool_choice required or named, response_format) on a prompt that opens the model's
    reasoning: constrained from its first token, the reply would be reasoning only."""
    option = "tool_choice" if _forced_calls(request) is not None else "response_format"
    return APIError(
        f"{option} needs constrained decoding from the reply's first token, and this {family_name} prompt opens the "
        "model's reasoning there; leave it unset",
        param=option,
        code="unsupported_parameter",
    )


def _tools(request: ChatCompletionRequest) -> list[tuple[str, dict]]:
    """(name, parameter schema) of every tool offered."""
    tools = []
    for i, tool in enumerate(request.tools or []):
        function = (
            tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
        )
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise APIError(
                f'tools.{i}: a tool is {{"type": "function", "function": {{"name": ..., "parameters": {{...}}}}}}',
                param="tools",
            )
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise APIError(f"tools.{i}.function.parameters must be a JSON schema object", param="tools")
        tools.append((name, parameters if parameters is not None else NO_PARAMETERS))
    return tools


def _forced_calls(request: ChatCompletionRequest) -> list[tuple[str, dict]] | None:
    """The tools a reply must call one of (tool_choice required or named), or None where it need not call any."""
    name = request.tool_choice_name()
    if request.tool_choice != "required" and name is None:
        return None
    if not request.tools:
        raise APIError(
            "tool_choice required or a named function needs tools; add the tools or drop tool_choice",
            param="tool_choice",
        )
    tools = _tools(request)
    if name is None:
        return tools
    chosen = [tool for tool in tools if tool[0] == name]
    if not chosen:
        offered = ", ".join(tool_name for tool_name, _ in tools)
        raise APIError(
            f"tool_choice names the function {name!r}, which is not among the tools ({offered})",
            param="tool_choice",
        )
    return chosen[:1]


def _answer_schema(request: ChatCompletionRequest) -> dict | None:
    """The JSON schema a text reply follows (response_format), or None for free text."""
    form = request.response_format
    if form is None or form.type == "text":
        return None
    if form.type == "json_object" or form.json_schema.schema_ is None:
        return ANY_OBJECT
    return form.json_schema.schema_


def json_styled(schema: dict) -> dict:
    """`schema` as the root of a JSON grammar, written with JSON_STYLE."""
    return {**schema, "x-guidance": JSON_STYLE}


def _call_schema(name: str, parameters: dict) -> dict:
    """One call's JSON: the name, then the arguments. The parameters' own definitions move to this root, where
    their `#/$defs/...` references then point."""
    definitions = {key: parameters[key] for key in ("$defs", "definitions") if key in parameters}
    arguments = {key: value for key, value in parameters.items() if key not in definitions}
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
        **definitions,
    }


def _lark(tools: list[tuple[str, dict]], many: bool, answer: dict | None) -> str:
    """A Lark grammar (llguidance's dialect) for Hermes calls of `tools`, one or (`many`) more; with an `answer`
    schema, that JSON is the other choice (tool_choice auto with a response_format)."""
    lines = [
        "start: " + ('call ("\\n" call)*' if many else "call") + (" | answer" if answer is not None else ""),
        "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
    ]
    opening, closing = json.dumps(OPEN + "\n"), json.dumps("\n" + CLOSE)
    for i, (name, parameters) in enumerate(tools):
        lines.append(f"call_{i}: {opening} %json {json.dumps(json_styled(_call_schema(name, parameters)))} {closing}")
    if answer is not None:
        lines.append(f"answer: %json {json.dumps(json_styled(answer))}")
    return "\n".join(lines) + "\n"
