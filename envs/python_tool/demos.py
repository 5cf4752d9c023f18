"""Demonstrations of the python_tool env for SFT: Hugging Face messages transcripts, some of them imperfect.

A demonstration is played through the env itself (reset from a seed, the tool call and the answer sent with
`step`), so every program output and reward is the env's own, from the sandbox. Two kinds:

- `tool`: run a short program for the problem's family, with the problem's numbers, dates or words copied in
  verbatim (`PROGRAMS`), then answer with the program's output alone. Always right (reward 1).
- `direct`: answer at once, without the tool, as a demonstrator working it out in their head: right with
  probability `direct_correct`, else a near miss (a number off by a little, another day of the week).

The demonstrator skips the tool more often on the families that look easy (EASY_FAMILIES: counting vowels, a
median, a weekday), so a model that imitates it answers those in its head and gets many wrong; RL with the env's
reward has to learn to run code there too.

    python -m envs.python_tool.demos launch/data/python_tool_sft_train.jsonl --seeds 0:3000 --no-tool-list
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import re
from dataclasses import dataclass

import numpy as np

from agentrl.env.tool_calls import CLOSE, OPEN
from envs.python_tool.env import PythonToolEnv

EASY_FAMILIES = frozenset({"vowel_count", "median_of_list", "weekday"})
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
NUMBER = re.compile(r"\d+(?:\.\d+)?")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
PERIODS = {"yearly": 1, "quarterly": 4, "monthly": 12}


def _divisible_count(text: str) -> str:
    start, end, divisor, excluded = NUMBER.findall(text)
    return f"print(sum(1 for n in range({start}, {end} + 1) if n % {divisor} == 0 and n % {excluded} != 0))"


def _fibonacci(text: str) -> str:
    index = NUMBER.findall(text)[-1]
    return f"a, b = 0, 1\nfor _ in range({index}):\n    a, b = b, a + b\nprint(a)"


def _nth_prime(text: str) -> str:
    index = NUMBER.findall(text)[0]
    return (
        f"primes = []\nk = 1\nwhile len(primes) < {index}:\n    k += 1\n"
        "    if all(k % p for p in primes):\n        primes.append(k)\nprint(k)"
    )


def _compound_interest(text: str) -> str:
    principal, rate, years = NUMBER.findall(text)
    periods = next(count for name, count in PERIODS.items() if name in text)
    return f"print(round({principal} * (1 + {rate} / 100 / {periods}) ** ({periods} * {years}), 2))"


def _digit_sum_of_power(text: str) -> str:
    base, exponent = NUMBER.findall(text)
    return f"print(sum(map(int, str({base} ** {exponent}))))"


def _median_of_list(text: str) -> str:
    numbers = text.partition(":")[2].strip().rstrip("?")
    return f"import statistics\nprint(statistics.median([{numbers}]))"


def _days_between(text: str) -> str:
    start, end = DATE.findall(text)
    return f'from datetime import date\nprint((date.fromisoformat("{end}") - date.fromisoformat("{start}")).days)'


def _weekday(text: str) -> str:
    (day,) = DATE.findall(text)
    return f'from datetime import date\nprint(date.fromisoformat("{day}").strftime("%A"))'


def _vowel_count(text: str) -> str:
    sentence = text.split('"')[1]
    return f'print(sum(c in "aeiou" for c in "{sentence}".lower()))'


# family -> the program a careful demonstrator writes for a problem's text
PROGRAMS = {
    "divisible_count": _divisible_count,
    "fibonacci": _fibonacci,
    "nth_prime": _nth_prime,
    "compound_interest": _compound_interest,
    "digit_sum_of_power": _digit_sum_of_power,
    "median_of_list": _median_of_list,
    "days_between": _days_between,
    "weekday": _weekday,
    "vowel_count": _vowel_count,
}


@dataclass(frozen=True)
class Demonstrator:
    direct_easy: float = 0.6  # chance to answer an easy-looking problem without the tool
    direct_hard: float = 0.1  # ... and any other problem
    direct_correct: float = 0.3  # chance that an answer without the tool is right

    def direct_rate(self, family: str) -> float:
        return self.direct_easy if family in EASY_FAMILIES else self.direct_hard


def tool_call(code: str) -> dict:
    return {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}


def call_text(code: str) -> str:
    """The turn a model writes for this call (as agentrl.sft.transcripts renders `tool_calls`)."""
    return OPEN + json.dumps({"name": "python", "arguments": {"code": code}}) + CLOSE


def near_miss(answer: str, rng: np.random.Generator) -> str:
    """A wrong answer close to the right one, as working it out in one's head gets it wrong."""
    if answer in DAYS:
        return DAYS[(DAYS.index(answer) + int(rng.integers(1, 7))) % 7]
    offset = int(rng.choice([-10, -2, -1, 1, 2, 10, int(rng.integers(3, 30))]))
    if "." in answer:
        return f"{float(answer) + offset:.2f}"
    return str(int(answer) + offset)


def tool_output(observation: str) -> str:
    """The program's output from the tool's observation (<tool_response>\\nOUTPUT\\n</tool_response>)."""
    return observation.split("<tool_response>\n", 1)[1].rsplit("\n</tool_response>", 1)[0]


def demonstration(env: PythonToolEnv, seed: int, kind: str, rng: np.random.Generator, direct_correct: float = 0.3):
    """One transcript of `kind` ("tool" or "direct") for the env's task of `seed`, and its reward."""
    question, info = env.reset(seed=seed)
    messages = [{"role": "user", "content": question}]
    if kind == "tool":
        code = PROGRAMS[info["family"]](question)
        observation, reward, terminated, _, step_info = env.step(call_text(code))
        assert not terminated and reward == 0 and not step_info.get("tool_errors"), observation
        answer = tool_output(observation)
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [tool_call(code)]},
            {"role": "tool", "name": "python", "content": answer},
        ]
    elif kind == "direct":
        answer = info["answer"] if rng.random() < direct_correct else near_miss(info["answer"], rng)
    else:
        raise ValueError(f"kind must be 'tool' or 'direct', got {kind!r}")
    _, reward, terminated, _, _ = env.step(answer)
    assert terminated
    messages.append({"role": "assistant", "content": answer})
    return {"messages": messages, **({"tools": env.tools} if env.tools else {})}, reward


def demonstrations(seeds, demonstrator: Demonstrator, env_kwargs: dict, seed: int = 0):
    """(transcript, kind, reward) for each env seed; the demonstrator's choices for a task drawn from (`seed`, the
    task's seed), so any slice of the seeds gives the same transcripts as the whole run."""
    env = PythonToolEnv(**env_kwargs)
    for task_seed in seeds:
        rng = np.random.default_rng([seed, task_seed])
        _, info = env.reset(seed=task_seed)
        kind = "direct" if rng.random() < demonstrator.direct_rate(info["family"]) else "tool"
        transcript, reward = demonstration(env, task_seed, kind, rng, demonstrator.direct_correct)
        yield transcript, kind, reward


def _chunk(task) -> list[tuple[dict, str, float]]:
    seeds, demonstrator, env_kwargs, seed = task
    return list(demonstrations(seeds, demonstrator, env_kwargs, seed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="JSONL file to write")
    parser.add_argument("--seeds", default="0:3000", help="START:STOP env seeds (keep them out of heldout_seeds)")
    parser.add_argument("--difficulty", type=int, default=1)
    parser.add_argument("--heldout-every", type=int, default=10)
    parser.add_argument("--direct-easy", type=float, default=Demonstrator.direct_easy)
    parser.add_argument("--direct-hard", type=float, default=Demonstrator.direct_hard)
    parser.add_argument("--direct-correct", type=float, default=Demonstrator.direct_correct)
    parser.add_argument("--no-tool-list", action="store_true", help="env kwarg list_tools=false: no tools in prompts")
    parser.add_argument("--only-tool", action="store_true", help="correct tool-using transcripts only")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demonstrator's choices")
    parser.add_argument("--workers", type=int, default=8, help="processes playing demonstrations side by side")
    args = parser.parse_args()
    start, stop = map(int, args.seeds.split(":"))
    demonstrator = Demonstrator(
        0.0 if args.only_tool else args.direct_easy, 0.0 if args.only_tool else args.direct_hard, args.direct_correct
    )
    env_kwargs = {"difficulty": args.difficulty, "heldout_every": args.heldout_every}
    if args.no_tool_list:
        env_kwargs["list_tools"] = False
    counts = {"tool": 0, "direct": 0, "direct_right": 0}
    # a sandbox run mostly waits for its namespaces: several processes overlap the waits
    slices = [range(first, min(first + 50, stop)) for first in range(start, stop, 50)]
    chunks = [(seeds, demonstrator, env_kwargs, args.seed) for seeds in slices]
    with open(args.out, "w") as out, multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        for transcript, kind, reward in itertools.chain.from_iterable(pool.imap(_chunk, chunks)):
            out.write(json.dumps(transcript) + "\n")
            counts[kind] += 1
            counts["direct_right"] += int(kind == "direct" and reward == 1)
    total = counts["tool"] + counts["direct"]
    print(
        f"{args.out}: {total} transcripts, {counts['tool']} with the tool, {counts['direct']} without "
        f"({counts['direct_right']} of those right); demonstrator success "
        f"{(counts['tool'] + counts['direct_right']) / max(total, 1):.2f}"
    )


if __name__ == "__main__":
    main()
