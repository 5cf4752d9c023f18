"""Scripted demonstrations for SFT: a demonstrator that calls the tool on most problems and answers some in its head,
and the command line of the envs' demonstration scripts (envs/calculator, envs/python_tool, envs/search_qa: demos.py).

An env's script plays each transcript through the env itself and yields (transcript, kind, reward), kind "tool" or
"direct"; `write_demonstrations` writes them as `agentrl sft` reads them and says how good the demonstrator was.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import numpy as np

from agentrl.env.tool_calls import CLOSE, OPEN


@dataclass(frozen=True)
class Demonstrator:
    """How often the demonstrator skips the tool (more often on the problems in `easy`), and how often it is
    then right."""

    direct_easy: float = 0.6  # chance to answer an easy-looking problem without the tool
    direct_hard: float = 0.1  # ... and any other problem
    direct_correct: float = 0.5  # chance that an answer without the tool is right
    easy: frozenset = frozenset()  # the problem kinds (templates, families) that look easy

    def direct_rate(self, kind: Hashable) -> float:
        return self.direct_easy if kind in self.easy else self.direct_hard


def tool_call(name: str, arguments: dict) -> dict:
    """One call of an assistant message's `tool_calls`."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def call_text(name: str, arguments: dict) -> str:
    """The turn a model writes for this call (as agentrl.sft.transcripts renders `tool_calls`)."""
    return OPEN + json.dumps({"name": name, "arguments": arguments}) + CLOSE


def miss_by(rng: np.random.Generator) -> int:
    """How far off a number worked out in one's head is: mostly by a little, sometimes by ten or more."""
    return int(rng.choice([-10, -2, -1, 1, 2, 10, int(rng.integers(3, 30))]))


def tool_output(observation: str) -> str:
    """A single tool call's result from its observation (<tool_response>\nRESULT\n</tool_response>)."""
    return observation.split("<tool_response>\n", 1)[1].rsplit("\n</tool_response>", 1)[0]


def play(
    env, question: str, kind: str, calls: list[tuple[str, dict]], direct_answer, answer: str | None = None
) -> tuple[dict, float]:
    """Play one transcript through `env`, just reset to `question`: for kind "tool", `calls` (each a tool's name and
    arguments, one turn each), then `answer` (by default the last tool's result); for kind "direct",
    `direct_answer()` at once (called only then, so that its draws leave the demonstrator's other choices alone).
    The transcript and the env's reward for it."""
    messages = [{"role": "user", "content": question}]
    if kind == "tool":
        for name, arguments in calls:
            observation, reward, terminated, _, info = env.step(call_text(name, arguments))
            if terminated or reward != 0 or info.get("tool_errors"):
                raise ValueError(f"the demonstration's {name} call did not run cleanly: {observation}")
            result = tool_output(observation)
            messages += [
                {"role": "assistant", "content": "", "tool_calls": [tool_call(name, arguments)]},
                {"role": "tool", "name": name, "content": result},
            ]
        answer = result if answer is None else answer
    elif kind == "direct":
        answer = direct_answer()
    else:
        raise ValueError(f"kind must be 'tool' or 'direct', got {kind!r}")
    _, reward, terminated, _, _ = env.step(answer)
    if not terminated:
        raise ValueError(f"the env did not end the episode at the answer {answer!r}")
    messages.append({"role": "assistant", "content": answer})
    return {"messages": messages, **({"tools": env.tools} if env.tools else {})}, reward


def play_all(env, seeds, demonstrator: Demonstrator, kind_of, demonstrate, rng_for):
    """(transcript, kind, reward) for each env seed: the demonstrator draws from `rng_for(task seed)` whether it uses
    the tool on the problem (`kind_of(reset info)` says which kind of problem it is), then
    `demonstrate(env, task seed, kind, rng, direct_correct)` plays it."""
    for task_seed in seeds:
        rng = rng_for(task_seed)
        _, info = env.reset(seed=task_seed)
        kind = "direct" if rng.random() < demonstrator.direct_rate(kind_of(info)) else "tool"
        transcript, reward = demonstrate(env, task_seed, kind, rng, demonstrator.direct_correct)
        yield transcript, kind, reward


CALL_ID_CHARACTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def call_id(rng: np.random.Generator, number: int, random_ids: bool) -> str:
    """A 9-character call id (as Mistral's template requires): random characters, as Mistral's models write them,
    or the call's number in its transcript (`000000001`), which a tiny model learns at once."""
    return "".join(rng.choice(list(CALL_ID_CHARACTERS), 9)) if random_ids else f"{number:09d}"


def dress(transcript: dict, rng: np.random.Generator, call_ids: str | None, reasoning: bool) -> dict:
    """`transcript` for chat formats that want more than Hermes: `call_ids` ("counter" or "random", see `call_id`)
    gives each call a 9-character id and its result the same `tool_call_id`; `reasoning` gives each assistant turn
    a short `reasoning_content` (what it is about to do), for formats that think first (Qwen3)."""
    if call_ids not in (None, "counter", "random"):
        raise ValueError(f"call_ids must be None, 'counter' or 'random', got {call_ids!r}")
    messages, pending, last_result, made = [], [], None, 0
    for message in transcript["messages"]:
        message = dict(message)
        if message["role"] == "assistant":
            calls = message.get("tool_calls") or []
            if call_ids and calls:
                numbers = range(made + 1, made + 1 + len(calls))
                calls = [
                    {**call, "id": call_id(rng, n, call_ids == "random")}
                    for call, n in zip(calls, numbers, strict=True)
                ]
                message["tool_calls"], pending, made = calls, [call["id"] for call in calls], made + len(calls)
            if reasoning:
                if calls:
                    names = " and ".join(call["function"]["name"] for call in calls)
                    message["reasoning_content"] = f"I will call {names}."
                elif last_result is not None:
                    message["reasoning_content"] = f"The tool returned {last_result}."
                else:
                    message["reasoning_content"] = "I will answer without a tool."
        elif message["role"] == "tool":
            last_result = message["content"]
            if call_ids:
                message["tool_call_id"] = pending.pop(0)
        messages.append(message)
    return {**transcript, "messages": messages}


def dressed(rows: Iterable[tuple[dict, str, float]], args: argparse.Namespace):
    """`rows` with `dress` applied as the script's --call-ids and --reasoning ask."""
    rng = np.random.default_rng([args.seed, 1])
    for transcript, kind, reward in rows:
        yield dress(transcript, rng, args.call_ids, args.reasoning), kind, reward


def demonstration_parser(doc: str, seeds: str, demonstrator: Demonstrator) -> argparse.ArgumentParser:
    """The options every demonstration script takes; the env's own ones are added by the caller."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="JSONL file to write")
    parser.add_argument("--seeds", default=seeds, help="START:STOP env seeds (keep them out of heldout_seeds)")
    parser.add_argument("--direct-easy", type=float, default=demonstrator.direct_easy)
    parser.add_argument("--direct-hard", type=float, default=demonstrator.direct_hard)
    parser.add_argument("--direct-correct", type=float, default=demonstrator.direct_correct)
    parser.add_argument("--no-tool-list", action="store_true", help="env kwarg list_tools=false: no tools in prompts")
    parser.add_argument("--only-tool", action="store_true", help="correct tool-using transcripts only")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demonstrator's choices")
    parser.add_argument(
        "--call-ids",
        choices=["counter", "random"],
        help="9-character tool call ids (Mistral's template): each call's number, or random characters",
    )
    parser.add_argument("--reasoning", action="store_true", help="a short reasoning_content per turn (Qwen3)")
    return parser


def demonstrator_from(args: argparse.Namespace, easy: frozenset) -> Demonstrator:
    if args.only_tool:
        return Demonstrator(0.0, 0.0, args.direct_correct, easy)
    return Demonstrator(args.direct_easy, args.direct_hard, args.direct_correct, easy)


def env_kwargs_from(args: argparse.Namespace, **kwargs) -> dict:
    """The env's own `kwargs`, and `list_tools: false` with --no-tool-list."""
    if args.no_tool_list:
        kwargs["list_tools"] = False
    return kwargs


def seed_range(args: argparse.Namespace) -> range:
    start, stop = map(int, args.seeds.split(":"))
    return range(start, stop)


def write_demonstrations(path: str, rows: Iterable[tuple[dict, str, float]]) -> str:
    """Write each transcript as one JSON line; the summary: how many, with the tool or not, the demonstrator's
    success."""
    counts = {"tool": 0, "direct": 0, "direct_right": 0}
    with open(path, "w") as out:
        for transcript, kind, reward in rows:
            out.write(json.dumps(transcript) + "\n")
            counts[kind] += 1
            counts["direct_right"] += int(kind == "direct" and reward == 1)
    total = counts["tool"] + counts["direct"]
    return (
        f"{path}: {total} transcripts, {counts['tool']} with the tool, {counts['direct']} without "
        f"({counts['direct_right']} of those right); demonstrator success "
        f"{(counts['tool'] + counts['direct_right']) / max(total, 1):.2f}"
    )
