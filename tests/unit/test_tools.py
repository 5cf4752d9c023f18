"""Tool calls: the parser's malformed cases, schemas from signatures, and ToolEnv's error observations."""

import pytest

from agentrl.env.tool_calls import parse_tool_calls
from agentrl.env.tools import ToolEnv, describe, tool


def call(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


def test_parses_several_calls_and_string_arguments():
    turn = parse_tool_calls(
        "thinking...\n"
        + call('{"name": "add", "arguments": {"a": 1, "b": 2}}')
        + "\n"
        + call('{"name": "echo", "arguments": "{\\"text\\": \\"hi\\"}"}')
    )
    assert [(c.name, c.arguments) for c in turn.calls] == [("add", {"a": 1, "b": 2}), ("echo", {"text": "hi"})]
    assert turn.errors == []


def test_plain_text_has_no_calls():
    turn = parse_tool_calls("The answer is 42.")
    assert not turn.has_calls


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (call('{"name": "add", "arguments": {"a": 1'), "not valid JSON"),
        (call('["add"]'), "must be a JSON object"),
        (call('{"arguments": {}}'), 'no "name"'),
        (call('{"name": "add", "arguments": [1, 2]}'), '"arguments" must be a JSON object'),
        (call('{"name": "add", "arguments": "a=1"}'), "is a string that is not JSON"),
        ('<tool_call>{"name": "add", "arguments": {}}', "was not closed"),
    ],
)
def test_malformed_calls_become_errors(text, message):
    turn = parse_tool_calls(text)
    assert turn.has_calls and not turn.calls
    assert len(turn.errors) == 1 and message in turn.errors[0]


class Adder(ToolEnv):
    @tool
    def add(self, a: int, b: int, note: str = "") -> str:
        """Add two integers.

        Args:
            a: the first addend
            b: the second addend
        """
        return str(a + b)

    @tool
    def explode(self) -> str:
        """Always fails."""
        raise RuntimeError("boom")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "add things", {}

    def answer(self, text):
        return "done", float(text.strip() == "3"), True, False, {"success": text.strip() == "3"}


def test_schema_from_signature_and_docstring():
    schema = describe(Adder.add)
    assert schema.description == "Add two integers."
    assert schema.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "the first addend"},
            "b": {"type": "integer", "description": "the second addend"},
            "note": {"type": "string"},
        },
        "required": ["a", "b"],
    }
    names = [t["function"]["name"] for t in Adder().tools]
    assert names == ["add", "explode"]


def test_tool_env_runs_calls_and_grades_plain_answers():
    env = Adder()
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(call('{"name": "add", "arguments": {"a": 1, "b": 2}}'))
    assert obs == "<tool_response>\n3\n</tool_response>" and reward == 0.0 and not terminated
    assert info == {
        "tool_calls": 1,
        "tool_errors": 0,
        "tool_results": [{"id": None, "name": "add", "content": "3", "ok": True}],
    }
    assert env.step("3")[1:4] == (1.0, True, False)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"name": "mul", "arguments": {}}', "unknown tool 'mul'; available tools: add, explode"),
        ('{"name": "add", "arguments": {"a": 1}}', "missing required argument(s) b"),
        ('{"name": "add", "arguments": {"a": 1, "b": "2"}}', "argument 'b' must be a JSON integer"),
        ('{"name": "add", "arguments": {"a": true, "b": 2}}', "argument 'a' must be a JSON integer"),
        ('{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}', "no argument(s) c"),
        ('{"name": "explode", "arguments": {}}', "raised RuntimeError: boom"),
        ('{"name": "add", "arguments": {', "not valid JSON"),
    ],
)
def test_bad_calls_become_error_observations_and_are_counted(body, message):
    env = Adder()
    env.reset(seed=0)
    good = call('{"name": "add", "arguments": {"a": 2, "b": 2}}')
    obs, _, terminated, truncated, info = env.step(call(body) + good)
    assert message in obs and "<tool_response>\n4\n</tool_response>" in obs
    assert not (terminated or truncated)
    assert (info["tool_calls"], info["tool_errors"]) == (2, 1)
    bad, good_result = info["tool_results"]
    assert not bad["ok"] and message in bad["content"]
    assert good_result == {"id": None, "name": "add", "content": "4", "ok": True}


def test_untyped_tool_parameters_are_refused_with_a_fix():
    def bad(self, x):
        """No hints."""

    with pytest.raises(TypeError, match="needs a type hint"):
        describe(bad)


def test_check_tools_flags_duplicates_and_bad_parameters():
    from agentrl.env.check import check_env, check_tools

    good = Adder().tools
    assert check_tools(good) == []
    bad = [*good, good[0], {"type": "function", "function": {"name": "x", "parameters": {"type": "string"}}}]
    problems = check_tools(bad)
    assert any("'add' is used twice" in p for p in problems)
    assert any("'x': parameters must be a JSON-schema object" in p for p in problems)
    assert check_env("calculator", {}) == []


class LimitedAdder(Adder):
    def __init__(self):
        super().__init__(max_steps=2)


def test_tool_env_keeps_turn_limits_and_refuses_steps_outside_an_episode():
    env = LimitedAdder()
    with pytest.raises(RuntimeError, match=r"before reset\(\); call reset"):
        env.step("3")
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    for _ in range(2):  # two episodes: reset starts the turn count again
        env.reset(seed=0)
        _, _, terminated, truncated, info = env.step(call)
        assert not (terminated or truncated) and (info["tool_calls"], info["tool_errors"]) == (1, 0)
        _, _, terminated, truncated, info = env.step(call)
        assert truncated and not terminated and info["success"] is False
        with pytest.raises(RuntimeError, match=r"after the episode ended; call reset"):
            env.step("3")
    env.reset(seed=0)
    assert env.step("3")[2]  # an answer within the limit terminates as answer() says
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        Adder(max_steps=0)
