"""Shared by the chat format tests: one tokenizer per family (built once per process), the codec over it, and the
turns each family's models write, in the format's own markup."""

from __future__ import annotations

import functools

from agentrl.chat.codec import ChatCodec
from agentrl.chat.registry import resolve
from agentrl.chat.turn import ParsedTurn, ToolCall
from agentrl.models.families import FIXTURES, build_family_tokenizer

FAMILIES = tuple(FIXTURES)
CORPUS = [
    "What is 2 + 3? It is 5. Add them. The tool said 5. Let me check the weather in Paris.",
    "agentrl_add get_weather city days unit celsius",
]
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TOOLS = [ADD, WEATHER]


@functools.cache
def tokenizer(family: str):
    return build_family_tokenizer(family, CORPUS)


def codec(family: str, **template_kwargs) -> ChatCodec:
    return ChatCodec(tokenizer(family), resolve(family)(), template_kwargs)


def turn(content="", reasoning="", calls=(), errors=()) -> ParsedTurn:
    return ParsedTurn(calls=list(calls), errors=list(errors), content=content, reasoning=reasoning)


def call(name, arguments, call_id=None) -> ToolCall:
    return ToolCall(name, arguments, call_id)


# Turns as each family's models write them (the end-of-turn token dropped, as ChatCodec.turn_text drops it), with
# the turn they parse to. Several are written differently from what the test templates produce (the real models'
# own variations), so the parsers are not only checked against the templates.
WEATHER_CALL = call("get_weather", {"city": "Paris", "days": 2})
ADD_CALL = call("add", {"a": 2, "b": 3})
WRITTEN: dict[str, list[tuple[str, ParsedTurn]]] = {
    "hermes": [
        ("It is 5.", turn("It is 5.")),
        (
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
            "</tool_call>",
            turn("Let me check.", calls=[WEATHER_CALL]),
        ),
        (
            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
            turn(calls=[ADD_CALL, WEATHER_CALL]),
        ),
    ],
    "qwen3": [
        ("<think>\nAdd them.\n</think>\n\nIt is 5.", turn("It is 5.", "Add them.")),
        (
            '<think>\nI need the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "days": 2}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}'
            "\n</tool_call>",
            turn(reasoning="I need the weather.", calls=[WEATHER_CALL, ADD_CALL]),
        ),
        ("It is 5.", turn("It is 5.")),  # thinking off: the prompt held the empty think block
    ],
    "llama3": [
        ("It is 5.", turn("It is 5.")),
        ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', turn(calls=[WEATHER_CALL])),
        (
            '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}; '
            '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}',
            turn(calls=[ADD_CALL, WEATHER_CALL]),
        ),
        (
            '<|python_tag|>brave_search.call(query="weather in Paris")',
            turn(calls=[call("brave_search", {"query": "weather in Paris"})]),
        ),
        ("<|python_tag|>print(2 + 3)", turn(calls=[call("code_interpreter", {"code": "print(2 + 3)"})])),
        ("{curly} is a word.", turn("{curly} is a word.")),
    ],
    "mistral": [
        (" It is 5.", turn("It is 5.")),
        (
            '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}, "id": "a1b2c3d4e"}, '
            '{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "f5g6h7i8j"}]',
            turn(
                calls=[
                    call(WEATHER_CALL.name, WEATHER_CALL.arguments, "a1b2c3d4e"),
                    call("add", {"a": 2, "b": 3}, "f5g6h7i8j"),
                ]
            ),
        ),
        (
            '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris", "days": 2}'
            '[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}',
            turn(calls=[call("get_weather", {"city": "Paris", "days": 2}, "a1b2c3d4e"), ADD_CALL]),
        ),
        ("[THINK]Add them.[/THINK]It is 5.", turn("It is 5.", "Add them.")),
    ],
    "harmony": [
        (
            "<|channel|>analysis<|message|>Add them.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>It is 5.<|return|>",
            turn("It is 5.", "Add them."),
        ),
        (
            "<|channel|>analysis<|message|>I need the weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 2}<|call|>',
            turn(reasoning="I need the weather.", calls=[WEATHER_CALL]),
        ),
        (
            ' to=functions.add<|channel|>commentary json<|message|>{"a": 2, "b": 3}<|call|>',
            turn(calls=[ADD_CALL]),
        ),
        (
            "<|channel|>commentary<|message|>Checking two things.<|end|><|start|>assistant to=functions.add"
            '<|channel|>commentary json<|message|>{"a": 2, "b": 3}<|end|><|start|>assistant to=functions.get_weather'
            '<|channel|>commentary json<|message|>{"city": "Paris", "days": 2}<|call|>',
            turn("Checking two things.", calls=[ADD_CALL, WEATHER_CALL]),
        ),
    ],
    "deepseek_v3": [
        ("It is 5.", turn("It is 5.")),
        (
            "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
            '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n'
            '```json\n{"a": 2, "b": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
            turn("Let me check.", calls=[WEATHER_CALL, ADD_CALL]),
        ),
        (
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 2, "b": 3}'
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            turn(calls=[ADD_CALL]),
        ),
    ],
    "deepseek_r1": [
        ("<think>\nAdd them.\n</think>\n\nIt is 5.", turn("It is 5.", "Add them.")),
        (
            "<think>\nI need the weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
            '<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris", "days": 2}\n```'
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            turn(reasoning="I need the weather.", calls=[WEATHER_CALL]),
        ),
    ],
    "glm45": [
        ("\n<think>Add them.</think>\nIt is 5.", turn("It is 5.", "Add them.")),
        (
            "\n<think>I need the weather.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
            "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n<tool_call>add\n"
            "<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n<arg_key>b</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
            turn(reasoning="I need the weather.", calls=[WEATHER_CALL, ADD_CALL]),
        ),
        ("\n<think></think>\nIt is 5.", turn("It is 5.")),
    ],
}
# A turn with one malformed call per family, and words its error must hold.
MALFORMED: dict[str, tuple[str, str]] = {
    "hermes": ('<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call>', "not valid JSON"),
    "qwen3": ('<think>\nx\n</think>\n\n<tool_call>\n{"arguments": {"a": 2}}\n</tool_call>', 'no "name"'),
    "llama3": ('{"name": "add", "parameters": {"a": 2, "b": }}', "not valid JSON"),
    "mistral": ('[TOOL_CALLS] [{"name": "add", "arguments": [2, 3], "id": "a1b2c3d4e"}]', "must be a JSON object"),
    "harmony": (' to=functions.add<|channel|>commentary json<|message|>{"a": 2, "b"<|call|>', "not valid JSON"),
    "deepseek_v3": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{a: 2}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "not valid JSON",
    ),
    "deepseek_r1": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁call▁end｜>", "no <｜tool▁sep｜>"),
    "glm45": ("<tool_call>add\n<arg_key>a</arg_key>2</tool_call>", "<arg_key>name</arg_key><arg_value>value"),
}
