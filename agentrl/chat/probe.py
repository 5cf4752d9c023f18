"""Probe what a chat template does with a multi-turn tool conversation: whether it renders tools and parallel calls,
whether a turn's generated text (as the template writes it) parses back to the turn, and whether the history stays
a prefix (append-only) once tool results or a user message follow."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.chat.errors import ChatTemplateError, NotAppendOnly
from agentrl.chat.turn import ParsedTurn, ToolCall

PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "agentrl_add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


@dataclass
class TemplateProbe:
    """`keeps_generation`: the template writes each assistant turn right after its own generation prompt (R1's
    drops the prompt's `<think>`); `round_trip`: each turn, as the template writes it, parses back to that turn;
    `tokens_split_exactly`: prompt and turn tokenized apart give the ids of the two tokenized together;
    `append_only_after_tool` / `_after_user`: the history renders the same once tool results / a user message
    follow; `notes`: what differed, in words."""

    family: str
    thinking: bool
    renders_tools: bool
    renders_parallel_calls: bool
    keeps_generation: bool
    round_trip: bool
    tokens_split_exactly: bool
    append_only_after_tool: bool
    append_only_after_user: bool
    notes: list[str] = field(default_factory=list)

    @property
    def append_only(self) -> bool:
        """The ids an episode builds turn by turn equal the template's ids for the whole conversation."""
        return (
            self.keeps_generation
            and self.tokens_split_exactly
            and self.append_only_after_tool
            and self.append_only_after_user
        )


def sample_conversation(codec, thinking: bool) -> tuple[list[dict], list[ParsedTurn]]:
    """system, user, a tool-call turn, its result, an answer turn, a second user message, and the two turns."""
    family = codec.family
    call_turn = ParsedTurn(calls=[ToolCall("agentrl_add", {"a": 2, "b": 3})], reasoning="Add them." if thinking else "")
    answer_turn = ParsedTurn(content="It is 5.", reasoning="The tool said 5." if thinking else "")
    call_message = family.assistant_message(call_turn)
    call_id = call_message["tool_calls"][0]["id"]
    call_turn.calls[0].id = call_id
    messages = [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "What is 2 + 3?"},
        call_message,
        family.tool_message(call_id, "agentrl_add", "5"),
        family.assistant_message(answer_turn),
        {"role": "user", "content": "Thanks."},
    ]
    return messages, [call_turn, answer_turn]


def probe_template(codec) -> TemplateProbe:
    family, notes = codec.family, []
    tools = [PROBE_TOOL]
    user_only = [{"role": "user", "content": "u"}]
    thinking = _renders_reasoning(codec, user_only, tools)
    messages, turns = sample_conversation(codec, thinking)
    renders_tools = PROBE_TOOL["function"]["name"] in codec.render(user_only, tools, True)

    keeps, round_trip, split = True, True, True
    for index, turn in ((2, turns[0]), (4, turns[1])):
        try:
            text = codec.written_turn(messages, index, tools)
        except ChatTemplateError as error:
            keeps = False
            notes.append(str(error))
            continue
        prompt = codec.render(messages[:index], tools, True)
        if codec.encode(prompt) + codec.encode(text) != codec.encode(prompt + text):
            split = False
            notes.append(f"turn {index}: prompt and turn tokenized apart differ from the two tokenized together")
        parsed = family.parse(codec.without_end(text), tools=tools, in_reasoning=codec.ends_in_reasoning(prompt))
        if not same_turn(parsed, turn):
            round_trip = False
            notes.append(f"turn {index} as the template writes it, {text!r}, parses to {parsed}, not {turn}")

    after_tool = _append_only(codec, messages[:3], messages[3:4], tools, notes)
    after_user = _append_only(codec, messages[:5], messages[5:6], tools, notes)
    parallel = _renders_parallel_calls(codec, tools, notes)
    return TemplateProbe(
        family.name, thinking, renders_tools, parallel, keeps, round_trip, split, after_tool, after_user, notes
    )


def _renders_reasoning(codec, head: list[dict], tools) -> bool:
    """Whether turns carry reasoning the template writes back: the family has reasoning, the generation prompt does
    not close it (thinking off), and the template writes the last turn's reasoning."""
    family = codec.family
    if not family.reasoning_key:
        return False
    prompt_tail = codec.render(head, tools, True)[len(codec.render(head, tools, False)) :]
    if family.reasoning_close and family.reasoning_close in prompt_tail:
        return False
    turn = family.assistant_message(ParsedTurn(content="c", reasoning="agentrl reasoning probe"))
    return "agentrl reasoning probe" in codec.render([*head, turn], tools, False)


def _append_only(codec, history, new, tools, notes) -> bool:
    try:
        codec.continuation_ids(history, new, tools)
    except NotAppendOnly as error:
        notes.append(str(error))
        return False
    return True


def _renders_parallel_calls(codec, tools, notes) -> bool:
    family = codec.family
    turn = ParsedTurn(calls=[ToolCall("agentrl_add", {"a": 2, "b": 3}), ToolCall("agentrl_add", {"a": 40, "b": 2})])
    messages = [{"role": "user", "content": "Two sums."}, family.assistant_message(turn)]
    try:
        text = codec.render(messages, tools, False)
    except ChatTemplateError as error:
        notes.append(f"parallel calls: {error}")
        return False
    if "40" not in text:
        notes.append("parallel calls: the template writes only the first call of a turn")
        return False
    return True


def same_turn(parsed: ParsedTurn, expected: ParsedTurn) -> bool:
    """Same content, reasoning and calls (ids compared where the parse has one)."""
    if parsed.errors or parsed.content != expected.content or parsed.reasoning != expected.reasoning:
        return False
    if len(parsed.calls) != len(expected.calls):
        return False
    return all(
        a.name == b.name and a.arguments == b.arguments and (a.id is None or a.id == b.id)
        for a, b in zip(parsed.calls, expected.calls, strict=True)
    )
