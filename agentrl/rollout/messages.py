"""An episode's conversation as Hugging Face chat messages (for episode dumps and SFT data).

    {"role": "assistant", "content": "Let me compute.", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}}]}
    {"role": "tool", "name": "calculator", "content": "5"}

An assistant turn whose tool calls all parse gets them as `tool_calls` and its remaining text as
`content`; a turn with a malformed call keeps its whole text as `content`, without `tool_calls`.
The observation after a turn with tool calls becomes one `tool` message per `<tool_response>`
block (the ToolEnv format); any other observation is a `user` message.
"""

from __future__ import annotations

import re

from agentrl.env.tool_calls import CALL, parse_tool_calls

RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def assistant_message(text: str) -> dict:
    turn = parse_tool_calls(text)
    if not turn.calls or turn.errors:
        return {"role": "assistant", "content": text}
    calls = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in turn.calls]
    return {"role": "assistant", "content": CALL.sub("", text).strip(), "tool_calls": calls}


def observation_messages(observation: str, after: dict) -> list[dict]:
    """The message(s) an observation becomes, given the assistant message `after` which it follows."""
    calls = after.get("tool_calls", [])
    responses = RESPONSE.findall(observation)
    if calls and responses and "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in responses) == observation:
        names = [c["function"]["name"] for c in calls] if len(calls) == len(responses) else None
        return [
            {"role": "tool", **({"name": names[i]} if names else {}), "content": response}
            for i, response in enumerate(responses)
        ]
    return [{"role": "user", "content": observation}]
