"""What `agentrl serve` pays to read a chat reply per family: the whole reply (`ReplyReader.read`, once per choice)
and a stream (`ReplyReader.feed`, once per token), against the per-token work the stream did before the families
(decode every id so far, then `streamable_prefix`).

    python benchmarks/serve_reply_cost.py                 # about 20 seconds

Each family's turn is its written call turn (tests/unit/chat_fixtures.WRITTEN: reasoning and calls where the
family has them) after a run of plain text, tokenized by the family's test tokenizer, about 300 tokens in all.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.serve.render import ChatRenderer, streamable_prefix
from agentrl.serve.reply import ReplyReader
from tests.unit.chat_fixtures import FAMILIES, TOOLS, WRITTEN, tokenizer

FILLER = "The tool said 5. Let me check the weather in Paris, then add them. " * 12
REPEATS = 5


def best_of(run, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def read_whole(renderer, prompt, ids) -> None:
    ReplyReader(renderer, prompt, TOOLS, True).read(ids)


def read_streamed(renderer, prompt, ids) -> None:
    reader = ReplyReader(renderer, prompt, TOOLS, True)
    for token in ids:
        reader.feed([token])
    reader.last_delta(reader.read(ids))


def stream_before(renderer, prompt, ids) -> None:
    """The stream's per-token work before the families: the text of every id so far, then what may be sent."""
    for count in range(1, len(ids) + 1):
        streamable_prefix(renderer.text(ids[:count]), (), final=False)


def main() -> None:
    print(f"{'family':<12} {'tokens':>6} {'whole µs':>9} {'stream µs/tok':>14} {'before µs/tok':>14}")
    for family in FAMILIES:
        renderer = ChatRenderer(tokenizer(family))
        text = next(text for text, turn in WRITTEN[family] if turn.calls)
        close = renderer.family.reasoning_close
        if close and close in text:
            head, _, tail = text.partition(close)
            text = head + " " + FILLER + close + tail
        else:
            text = FILLER + text
        ids = [*renderer.codec.encode(text), renderer.stop_ids[0]]
        prompt = renderer.codec.prompt_ids([{"role": "user", "content": "u"}], TOOLS)
        args = (renderer, prompt, ids)
        whole = best_of(lambda: read_whole(*args))  # noqa: B023 - called before the next iteration
        stream = best_of(lambda: read_streamed(*args))  # noqa: B023
        before = best_of(lambda: stream_before(*args), 2)  # noqa: B023
        n = len(ids)
        print(f"{family:<12} {n:>6} {whole * 1e6:>9.0f} {stream * 1e6 / n:>14.2f} {before * 1e6 / n:>14.2f}")
    print(f"(best of {REPEATS}; 'stream' includes the whole read at the end, as a stream's last chunk does)")


if __name__ == "__main__":
    main()
