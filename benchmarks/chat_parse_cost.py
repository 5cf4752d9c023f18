"""What parsing a turn costs, per chat format family, against what generating it costs on the tiny engine.

    python benchmarks/chat_parse_cost.py                 # every family, batch 1 and 32, ~1 minute on 2 cores
    python benchmarks/chat_parse_cost.py --families qwen3 harmony --batches 1 64
    python benchmarks/chat_parse_cost.py --batches 32 --against /tmp/main   # and another checkout's, side by side

Per family, a turn as its template writes it (reasoning, a sentence of content, a tool call; ~150 tokens) is
parsed whole (µs per turn), streamed one token's text at a time through the family's scanner (µs per token), and
streamed from ids (µs per token, the incremental detokenizing `agentrl serve` would do included; "ids x4": four
ids a feed, as a stream that sends every fourth step would); and the
template's ids after the ninth message of a tool loop (`continuation_ids`: three renders of the conversation, ms),
what the agent loop pays per turn for the observation's ids. The engine side:
the continuous torch engine with the quickstart's model (Qwen2 shape, hidden 64, 2 layers) decoding `--batches`
rows at once, greedy, 128 tokens each; its step time is what one token of each row costs. The share is the parse
cost of a step's tokens (one per row, parsed one after another on the event loop) over the step's time:
batch x µs-per-streamed-token / step time, and for whole-turn parsing batch x µs-per-turn / (tokens x step time).
With `--against DIR` (another agentrl checkout, e.g. `git worktree add /tmp/main main`) each family's costs are
measured for both, in turns (`--rounds` each, the best kept), each in a process of its own, and DIR's row follows
this checkout's, marked `<`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REASONING = (
    "The user wants the sum of two numbers and then the weather in the city they named. I will call the add tool "
    "first, since its result is needed before I can say anything else, and check the arguments are integers. "
)
CONTENT = "Let me add these two numbers for you before I look at the weather."
TOOLS = [
    {
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
]


def best_of(repeats: int, function) -> float:
    """The fastest of `repeats` timings of `function()` (seconds): the least disturbed by other load."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def turn_text(chat) -> tuple[str, bool]:
    """A turn as the family's template writes it, and whether its prompt opened reasoning. Where the template
    never writes reasoning back (R1), the reasoning is put in front of the written turn, as the model writes it."""
    from agentrl.chat.codec import NotAppendOnly, common_prefix
    from agentrl.chat.turn import ParsedTurn, ToolCall

    turn = ParsedTurn(
        calls=[ToolCall("add", {"a": 1234, "b": 5678})],
        content="" if chat.family.name in ("llama3", "mistral", "harmony") else CONTENT,
        reasoning=REASONING * 2 if chat.probe().thinking else "",
    )
    messages = [{"role": "user", "content": "What is 1234 + 5678?"}, chat.assistant_message(turn)]
    prompt = chat.render(messages[:1], TOOLS, True)
    try:
        return chat.without_end(chat.written_turn(messages, 1, TOOLS)), chat.ends_in_reasoning(prompt)
    except NotAppendOnly:
        written = chat.without_end(chat.render(messages, TOOLS, False))
        body = written[common_prefix(prompt, written) :]
        return f"{REASONING * 2}\n{chat.family.reasoning_close}\n\n{body}", True


def parse_costs(family: str, repeats: int) -> dict:
    from agentrl.chat.codec import ChatCodec
    from agentrl.chat.registry import resolve
    from agentrl.chat.turn import ParsedTurn, ToolCall
    from agentrl.models.families import build_family_tokenizer

    chat = ChatCodec(build_family_tokenizer(family, [REASONING, CONTENT]), resolve(family)())
    text, in_reasoning = turn_text(chat)
    ids = chat.encode(text)
    pieces = [chat.decode([i]) for i in ids]
    parser = chat.family
    prompt = chat.encode("<think>\n") if in_reasoning else None

    def stream_text():
        scanner = parser.stream(tools=TOOLS, in_reasoning=in_reasoning)
        for piece in pieces:
            scanner.feed(piece)
        scanner.finish()

    def stream_ids(every: int = 1):
        stream = chat.stream(prompt_ids=prompt, tools=TOOLS)
        for at in range(0, len(ids), every):
            stream.feed(ids[at : at + every])
        stream.finish()

    history = [{"role": "user", "content": "Add 1234 and 5678, eight times."}]
    thinking = "Add them." if chat.probe().thinking else ""
    for n in range(8):  # eight call turns and their results: the template's ids after the last one
        reply = chat.assistant_message(ParsedTurn(calls=[ToolCall("add", {"a": n, "b": 5678})], reasoning=thinking))
        history += [reply, chat.family.tool_message(reply["tool_calls"][0]["id"], "add", str(n + 5678))]
    continuation = best_of(repeats // 4 or 1, lambda: chat.continuation_ids(history[:-1], history[-1:], TOOLS))

    turn = parser.parse(text, tools=TOOLS, in_reasoning=in_reasoning)
    assert turn.calls and not turn.errors, (family, text, turn)
    whole = best_of(repeats, lambda: [parser.parse(text, tools=TOOLS, in_reasoning=in_reasoning) for _ in range(20)])
    whole /= 20
    return {
        "family": family,
        "tokens": len(ids),
        "parse_us": whole * 1e6,
        "stream_us_per_token": best_of(repeats, stream_text) / len(ids) * 1e6,
        "stream_ids_us_per_token": best_of(repeats, stream_ids) / len(ids) * 1e6,
        "stream_ids4_us_per_token": best_of(repeats, lambda: stream_ids(4)) / len(ids) * 1e6,
        "continuation_ms": continuation * 1e3,
    }


def step_seconds(batch: int, tokens: int = 128) -> float:
    """Seconds per decode step of the continuous engine with `batch` rows (the quickstart model, greedy)."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.engine.base import SamplingParams
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.models.tiny import TinyShape, build_tiny_model

    with tempfile.TemporaryDirectory() as folder:
        texts = ["guess the number between 1 and 100"]
        path = build_tiny_model(Path(folder) / "m", texts, TinyShape(hidden_size=64, vocab_size=128))
        model = AutoModelForCausalLM.from_pretrained(path).eval()
    engine = ContinuousTorchEngine(model, pad_token_id=0, seed=0)
    sampling = SamplingParams(max_new_tokens=tokens, temperature=0.0)

    async def run():
        await asyncio.gather(*(engine.generate([1 + (i % 50), 2, 3, 4], sampling) for i in range(batch)))

    try:
        asyncio.run(run())  # warm up
        torch.manual_seed(0)
        seconds = best_of(3, lambda: asyncio.run(run()))
    finally:
        engine.shutdown()
    return seconds / tokens


def costs_in(root: Path, family: str, repeats: int) -> dict:
    """`parse_costs` of the agentrl checkout at `root`, in a process of its own."""
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1] + '/benchmarks'); import chat_parse_cost as bench; "
        "print(json.dumps(bench.parse_costs(sys.argv[2], int(sys.argv[3]))))"
    )
    command = [sys.executable, "-c", script, str(root), family, str(repeats)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=root)
    return json.loads(done.stdout.strip().splitlines()[-1])


def side_by_side(roots: list[Path], family: str, repeats: int, rounds: int) -> list[dict]:
    """Each checkout's costs, measured in turns, `rounds` times each; the fastest of each column kept."""
    best: list[dict | None] = [None] * len(roots)
    for _ in range(rounds):
        for index, root in enumerate(roots):
            cost, kept = costs_in(root, family, repeats), best[index]
            if kept is not None:
                cost = {key: min(value, kept[key]) if key != "family" else value for key, value in cost.items()}
            best[index] = cost
    return best


def main() -> int:
    from agentrl.models.families import FIXTURES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="*", default=list(FIXTURES))
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 32])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--against", type=Path, help="another agentrl checkout, measured side by side")
    parser.add_argument("--rounds", type=int, default=2, help="with --against: turns of each checkout per family")
    args = parser.parse_args()

    steps = {batch: step_seconds(batch) for batch in args.batches}
    print("engine: " + ", ".join(f"batch {b}: {s * 1e3:.2f} ms/step" for b, s in steps.items()))
    header = f"{'family':<12} {'tokens':>6} {'parse µs':>9} {'stream µs/tok':>14} {'ids µs/tok':>11} {'ids x4':>7}"
    header += f" {'cont. ms':>8}"
    header += "".join(f" {f'share b{b} (stream / whole)':>27}" for b in args.batches)
    print(header + (f"   (< : {args.against})" if args.against else ""))
    here = Path(__file__).resolve().parents[1]
    for family in args.families:
        if args.against is None:
            print(row(family, parse_costs(family, args.repeats), steps))
            continue
        mine, theirs = side_by_side([here, args.against.resolve()], family, args.repeats, args.rounds)
        print(row(family, mine, steps))
        print(row(f"{family} <", theirs, steps))
    return 0


def row(label: str, cost: dict, steps: dict[int, float]) -> str:
    line = f"{label:<12} {cost['tokens']:>6} {cost['parse_us']:>9.1f} {cost['stream_us_per_token']:>14.2f}"
    line += f" {cost['stream_ids_us_per_token']:>11.2f} {cost['stream_ids4_us_per_token']:>7.2f}"
    line += f" {cost['continuation_ms']:>8.2f}"
    for batch, step in steps.items():
        streamed = batch * cost["stream_ids_us_per_token"] * 1e-6 / step
        whole = batch * cost["parse_us"] * 1e-6 / (cost["tokens"] * step)
        line += f" {f'{streamed:.2%} / {whole:.3%}':>27}"
    return line


if __name__ == "__main__":
    raise SystemExit(main())
