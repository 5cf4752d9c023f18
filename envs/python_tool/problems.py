"""Word problems whose answers are easiest to get by writing a little Python, drawn from a seeded generator.

Each family is a function `(rng, difficulty) -> Problem`; `difficulty` (1 to 3) widens the
ranges, so harder problems need bigger searches, longer lists or larger numbers.
"""

from __future__ import annotations

import datetime
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

MIN_DIFFICULTY, MAX_DIFFICULTY = 1, 3
VOWELS = "aeiou"
WORDS = (
    "apple",
    "river",
    "quiet",
    "banana",
    "orange",
    "mountain",
    "purple",
    "engine",
    "island",
    "window",
    "yellow",
    "cloud",
    "garden",
    "ocean",
    "tiger",
    "umbrella",
    "violin",
    "echo",
    "idea",
    "puzzle",
    "rocket",
    "silver",
    "autumn",
    "eagle",
    "forest",
    "harbor",
    "lemon",
    "marble",
    "noble",
    "onion",
    "piano",
    "quartz",
    "sunrise",
    "tunnel",
    "unicorn",
    "velvet",
)
FIRST_DATE, LAST_DATE = datetime.date(1900, 1, 1), datetime.date(2099, 12, 31)


@dataclass(frozen=True)
class Problem:
    """One task: the text the model reads and the answer it must give.

    `answer` is canonical: an integer's digits, a decimal, or lowercase words (kind "text").
    A numeric guess counts as right when it is within `tolerance` of the answer.
    """

    family: str
    text: str
    answer: str
    kind: Literal["number", "text"] = "number"
    tolerance: float = 0.0


def _draw(rng: np.random.Generator, low: int, high: int) -> int:
    """An integer from low to high, both included."""
    return int(rng.integers(low, high + 1))


def divisible_count(rng: np.random.Generator, difficulty: int) -> Problem:
    start = _draw(rng, 1, 100 * difficulty)
    end = start + _draw(rng, 50, 10 ** (difficulty + 2))
    divisor = _draw(rng, 2, 13)
    excluded = _draw(rng, 2, 13)
    while divisor % excluded == 0:  # every multiple of divisor would also be a multiple of excluded
        excluded = _draw(rng, 2, 13)

    def multiples(k: int) -> int:
        return end // k - (start - 1) // k

    count = multiples(divisor) - multiples(math.lcm(divisor, excluded))
    text = f"How many integers from {start} to {end} (both included) are divisible by {divisor} but not by {excluded}?"
    return Problem("divisible_count", text, str(count))


def fibonacci(rng: np.random.Generator, difficulty: int) -> Problem:
    index = _draw(rng, 20, 40 + 30 * difficulty)
    previous, current = 0, 1
    for _ in range(index - 1):
        previous, current = current, previous + current
    text = f"The Fibonacci numbers start 1, 1, 2, 3, 5, 8, ... with F(1) = F(2) = 1. What is F({index})?"
    return Problem("fibonacci", text, str(current))


def nth_prime(rng: np.random.Generator, difficulty: int) -> Problem:
    index = _draw(rng, 50, 500 * difficulty)
    # the n-th prime is below n (ln n + ln ln n) for n >= 6
    bound = int(index * (math.log(index) + math.log(math.log(index)))) + 1
    is_prime = np.ones(bound + 1, dtype=bool)
    is_prime[:2] = False
    for factor in range(2, math.isqrt(bound) + 1):
        if is_prime[factor]:
            is_prime[factor * factor :: factor] = False
    prime = int(np.flatnonzero(is_prime)[index - 1])
    text = f"What is the {_ordinal(index)} prime number? (The 1st prime is 2, the 2nd is 3.)"
    return Problem("nth_prime", text, str(prime))


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def compound_interest(rng: np.random.Generator, difficulty: int) -> Problem:
    principal = 50 * _draw(rng, 2, 200)
    rate = _draw(rng, 4, 40) / 4  # 1.00% to 10.00% in quarter points
    years = _draw(rng, 2, 10 * difficulty)
    periods, period_name = ((1, "yearly"), (4, "quarterly"), (12, "monthly"))[_draw(rng, 0, 2)]
    balance = principal * (1 + rate / 100 / periods) ** (periods * years)
    text = (
        f"You deposit ${principal} at {rate:g}% annual interest, compounded {period_name}. "
        f"What is the balance after {years} years, rounded to the cent?"
    )
    # one cent of slack: rounding a float that lies on a half cent may go either way
    return Problem("compound_interest", text, f"{balance:.2f}", tolerance=0.01)


def digit_sum_of_power(rng: np.random.Generator, difficulty: int) -> Problem:
    base = _draw(rng, 2, 99)
    exponent = _draw(rng, 20, 150 * difficulty)
    total = sum(int(digit) for digit in str(base**exponent))
    text = f"What is the sum of the decimal digits of {base} raised to the power {exponent}?"
    return Problem("digit_sum_of_power", text, str(total))


def median_of_list(rng: np.random.Generator, difficulty: int) -> Problem:
    numbers = [_draw(rng, 1, 100 * difficulty) for _ in range(_draw(rng, 7, 6 + 6 * difficulty))]
    median = statistics.median(numbers)
    text = f"What is the median of these numbers: {', '.join(map(str, numbers))}?"
    return Problem("median_of_list", text, _format_decimal(median))


def _format_decimal(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6f}".rstrip("0")


def _random_date(rng: np.random.Generator) -> datetime.date:
    return FIRST_DATE + datetime.timedelta(days=_draw(rng, 0, (LAST_DATE - FIRST_DATE).days))


def days_between(rng: np.random.Generator, difficulty: int) -> Problem:
    start = _random_date(rng)
    end = start + datetime.timedelta(days=_draw(rng, 30, 3650 * difficulty))
    text = f"How many days are there from {start.isoformat()} to {end.isoformat()}? (From one day to the next is 1.)"
    return Problem("days_between", text, str((end - start).days))


def weekday(rng: np.random.Generator, difficulty: int) -> Problem:
    date = _random_date(rng)
    text = f"What day of the week is {date.isoformat()}? Answer with the name of the day."
    return Problem("weekday", text, date.strftime("%A").lower(), kind="text")


def vowel_count(rng: np.random.Generator, difficulty: int) -> Problem:
    words = [WORDS[_draw(rng, 0, len(WORDS) - 1)] for _ in range(_draw(rng, 5, 4 + 4 * difficulty))]
    sentence = " ".join(words).capitalize() + "."
    count = sum(letter in VOWELS for letter in sentence.lower())
    text = f'How many vowels (a, e, i, o, u) are in this sentence: "{sentence}"'
    return Problem("vowel_count", text, str(count))


FAMILIES: dict[str, Callable[[np.random.Generator, int], Problem]] = {
    family.__name__: family
    for family in (
        divisible_count,
        fibonacci,
        nth_prime,
        compound_interest,
        digit_sum_of_power,
        median_of_list,
        days_between,
        weekday,
        vowel_count,
    )
}


def generate(rng: np.random.Generator, difficulty: int = 1, families: list[str] | None = None) -> Problem:
    """A problem from one of `families` (all of them when None), chosen and filled in from `rng`."""
    names = check_families(families)
    check_difficulty(difficulty)
    family = FAMILIES[names[_draw(rng, 0, len(names) - 1)]]
    return family(rng, difficulty)


def check_families(families: list[str] | None) -> list[str]:
    """The family names to draw from; ValueError naming the known ones for an unknown or empty list."""
    if families is None:
        return list(FAMILIES)
    unknown = [name for name in families if name not in FAMILIES]
    if unknown or not families:
        raise ValueError(f"unknown problem families {unknown or '(empty list)'}; choose from {', '.join(FAMILIES)}")
    return list(families)


def check_difficulty(difficulty: int) -> None:
    if not MIN_DIFFICULTY <= difficulty <= MAX_DIFFICULTY:
        raise ValueError(f"difficulty must be from {MIN_DIFFICULTY} to {MAX_DIFFICULTY}, got {difficulty}")
