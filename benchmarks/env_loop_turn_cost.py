"""What the env agent loop's chat format costs a turn, per family (issue 51): parsing the turn, its assistant message,
and the ids of the tool result that follows, through the cached split (append-only templates) and through rendering.

    python benchmarks/env_loop_turn_cost.py          # about 20 seconds

Columns, microseconds a turn (median of repeats): `turn`: action text, parse, assistant message; `tool ids`: the
tool result's ids as the loop gets them (the cached split where the probe says append-only, its ids kept by the
result's text, else rendered); `new text`: a result not seen before (the split, tokenized); `rendered`: the same ids
rendered every time (`ChatCodec.continuation_ids` on a four-message history); `old`: Hermes' `observation_ids` (the
loop's only path before the families: the same result's ids, kept by its text), for reference.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.chat.turn import ParsedTurn, ToolCall
from agentrl.models.chat_format import ChatFormat
from tests.unit.chat_fixtures import TOOLS, tokenizer

FAMILIES = ["hermes", "qwen3", "llama3", "mistral", "harmony", "deepseek_v3", "glm45"]


def median_us(function, repeats: int = 200) -> float:
    function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def family_costs(family: str) -> tuple[float, float, float, float, float]:
    chat = ChatFormat(tokenizer(family), chat_format=family)
    calls = [ToolCall("add", {"a": 2, "b": 3}, "abcdefgh0" if family == "mistral" else None)]
    message = chat.codec.assistant_message(ParsedTurn(calls=calls, reasoning="Add." if chat.probe.thinking else ""))
    history = [*chat.prompt_messages("What is 2 + 3?"), message]
    placed, tools = chat.tools_placed(history, TOOLS)
    output = chat.codec.encode(chat.codec.written_turn(placed, len(placed) - 1, tools))
    new = [chat.family.tool_message(message["tool_calls"][0]["id"], "add", "5")]

    def turn():
        action = chat.action_text(output)
        chat.assistant_message(chat.parse(action, TOOLS), output)

    loop = median_us(lambda: chat.continuation_ids(history, new, TOOLS, output[-1]))
    results = iter(range(10**9))

    def unique():  # a result the loop has not seen: the cached split, tokenized
        chat.continuation_ids(history, [{**new[0], "content": str(next(results))}], TOOLS, output[-1])

    unseen = median_us(unique)
    rendered = median_us(lambda: chat.codec.continuation_ids(history, new, tools, output[-1], True), 50)
    old = median_us(lambda: chat.observation_ids("<tool_response>\n5\n</tool_response>")) if family == "hermes" else 0
    return median_us(turn), loop, unseen, rendered, old


def main() -> None:
    print(f"{'family':12} {'turn µs':>9} {'tool ids µs':>12} {'new text µs':>12} {'rendered µs':>12} {'old µs':>8}")
    for family in FAMILIES:
        turn, loop, unseen, rendered, old = family_costs(family)
        print(f"{family:12} {turn:9.1f} {loop:12.1f} {unseen:12.1f} {rendered:12.1f} {old:8.1f}")


if __name__ == "__main__":
    main()
