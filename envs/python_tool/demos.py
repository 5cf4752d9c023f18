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

import dataclasses
import itertools
import multiprocessing
import re

import numpy as np

from agentrl.sft import demos
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


@dataclasses.dataclass(frozen=True)
class Demonstrator(demos.Demonstrator):
    direct_correct: float = 0.3
    easy: frozenset = EASY_FAMILIES


def near_miss(answer: str, rng: np.random.Generator) -> str:
    """A wrong answer close to the right one, as working it out in one's head gets it wrong."""
    if answer in DAYS:
        return DAYS[(DAYS.index(answer) + int(rng.integers(1, 7))) % 7]
    offset = demos.miss_by(rng)
    if "." in answer:
        return f"{float(answer) + offset:.2f}"
    return str(int(answer) + offset)


def demonstration(env: PythonToolEnv, seed: int, kind: str, rng: np.random.Generator, direct_correct: float = 0.3):
    """One transcript of `kind` ("tool" or "direct") for the env's task of `seed`, and its reward."""
    question, info = env.reset(seed=seed)

    def direct() -> str:
        return info["answer"] if rng.random() < direct_correct else near_miss(info["answer"], rng)

    return demos.play(env, question, kind, [("python", {"code": PROGRAMS[info["family"]](question)})], direct)


def demonstrations(seeds, demonstrator: Demonstrator, env_kwargs: dict, seed: int = 0):
    """(transcript, kind, reward) for each env seed; the demonstrator's choices for a task drawn from (`seed`, the
    task's seed), so any slice of the seeds gives the same transcripts as the whole run."""
    env = PythonToolEnv(**env_kwargs)

    def rng_for(task_seed: int) -> np.random.Generator:
        return np.random.default_rng([seed, task_seed])

    yield from demos.play_all(env, seeds, demonstrator, lambda info: info["family"], demonstration, rng_for)


def _chunk(task) -> list[tuple[dict, str, float]]:
    seeds, demonstrator, env_kwargs, seed = task
    return list(demonstrations(seeds, demonstrator, env_kwargs, seed))


def main() -> None:
    parser = demos.demonstration_parser(__doc__, "0:3000", Demonstrator())
    parser.add_argument("--difficulty", type=int, default=1)
    parser.add_argument("--heldout-every", type=int, default=10)
    parser.add_argument("--workers", type=int, default=8, help="processes playing demonstrations side by side")
    args = parser.parse_args()
    demonstrator = demos.demonstrator_from(args, EASY_FAMILIES)
    env_kwargs = demos.env_kwargs_from(args, difficulty=args.difficulty, heldout_every=args.heldout_every)
    seeds = demos.seed_range(args)
    # a sandbox run mostly waits for its namespaces: several processes overlap the waits
    chunks = [(seeds[i : i + 50], demonstrator, env_kwargs, args.seed) for i in range(0, len(seeds), 50)]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        rows = itertools.chain.from_iterable(pool.imap(_chunk, chunks))
        print(demos.write_demonstrations(args.out, rows))


if __name__ == "__main__":
    main()
