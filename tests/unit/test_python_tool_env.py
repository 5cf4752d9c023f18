"""python_tool: seeded problems with independently checked answers, grading, and episodes through the sandbox."""

import json
import re
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np
import pytest

from agentrl.env.check import check_env
from agentrl.env.code_sandbox import SandboxUnavailable, available_backends, uncontained
from envs.python_tool.env import PythonToolEnv
from envs.python_tool.grading import is_correct, last_number
from envs.python_tool.problems import FAMILIES, Problem, generate

SMALL_LIMITS = {"cpu_seconds": 1.0, "wall_seconds": 3.0, "memory_mb": 256}


def call_python(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def integers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


# Reference solutions: each reads the problem's text and solves it another way than the generator.
def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 by the proleptic Gregorian calendar, with no datetime."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def solve_divisible_count(text):
    start, end, divisor, excluded = integers(text)
    return str(sum(1 for n in range(start, end + 1) if n % divisor == 0 and n % excluded != 0))


def solve_fibonacci(text):
    index = integers(text)[-1]
    sequence = [1, 1]
    while len(sequence) < index:
        sequence.append(sequence[-1] + sequence[-2])
    return str(sequence[index - 1])


def solve_nth_prime(text):
    index = integers(text)[0]
    primes, candidate = [], 1
    while len(primes) < index:
        candidate += 1
        if all(candidate % p for p in primes if p * p <= candidate):
            primes.append(candidate)
    return str(primes[-1])


def solve_compound_interest(text):
    principal = Decimal(re.search(r"\$(\d+)", text).group(1))
    rate = Decimal(re.search(r"([\d.]+)% annual", text).group(1)) / 100
    periods = {"yearly": 1, "quarterly": 4, "monthly": 12}[re.search(r"compounded (\w+)", text).group(1)]
    years = int(re.search(r"after (\d+) years", text).group(1))
    balance = principal * (1 + rate / periods) ** (periods * years)
    return str(balance.quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN))


def solve_digit_sum_of_power(text):
    base, exponent = integers(text)
    value, total = base**exponent, 0
    while value:
        value, digit = divmod(value, 10)
        total += digit
    return str(total)


def solve_median_of_list(text):
    numbers = sorted(integers(text.split(":", 1)[1]))
    middle = len(numbers) // 2
    if len(numbers) % 2:
        return str(numbers[middle])
    return str(Decimal(numbers[middle - 1] + numbers[middle]) / 2)


def solve_days_between(text):
    y1, m1, d1, y2, m2, d2 = integers(text)[:6]
    return str(days_from_civil(y2, m2, d2) - days_from_civil(y1, m1, d1))


def solve_weekday(text):
    year, month, day = integers(text)
    names = ["thursday", "friday", "saturday", "sunday", "monday", "tuesday", "wednesday"]  # 1970-01-01: Thursday
    return names[days_from_civil(year, month, day) % 7]


def solve_vowel_count(text):
    sentence = text.split('"')[1].lower()
    return str(sum(sentence.count(vowel) for vowel in "aeiou"))


REFERENCES = {name[len("solve_") :]: solver for name, solver in globals().items() if name.startswith("solve_")}


def test_every_family_has_a_reference_solution():
    assert set(REFERENCES) == set(FAMILIES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_stored_answers_match_a_reference_solution(family, difficulty):
    for seed in range(15):
        problem = generate(np.random.default_rng(seed), difficulty, [family])
        expected = REFERENCES[family](problem.text)
        if problem.kind == "text":
            assert problem.answer == expected, problem.text
        else:
            assert abs(Decimal(problem.answer) - Decimal(expected)) <= Decimal(str(problem.tolerance)), problem.text


def test_problems_are_reproducible_from_the_seed_and_vary_across_seeds():
    first = [PythonToolEnv().reset(seed=seed) for seed in range(40)]
    again = [PythonToolEnv().reset(seed=seed) for seed in range(40)]
    assert first == again
    assert len({obs for obs, _ in first}) == 40
    assert len({info["family"] for _, info in first}) == len(FAMILIES)


def test_difficulty_widens_the_ranges():
    def largest_fibonacci_index(difficulty):
        return max(integers(generate(np.random.default_rng(s), difficulty, ["fibonacci"]).text)[-1] for s in range(50))

    assert largest_fibonacci_index(3) > largest_fibonacci_index(1)


def test_grading_reads_the_last_number_or_the_last_words():
    number = Problem("x", "?", "1234")
    assert is_correct(number, "I computed 1,234")
    assert is_correct(number, "1234.0")
    assert not is_correct(number, "1234 or maybe 1235")
    assert not is_correct(number, "no idea")
    money = Problem("x", "?", "10.50", tolerance=0.01)
    assert is_correct(money, "$10.51") and not is_correct(money, "$10.52")
    day = Problem("x", "?", "tuesday", kind="text")
    assert is_correct(day, "It is Tuesday.") and is_correct(day, "TUESDAY")
    assert not is_correct(day, "Tuesday or Wednesday")
    assert last_number("x = -3.25 then 7") == Decimal(7)


def test_bad_constructor_arguments_say_what_to_use():
    with pytest.raises(ValueError, match=r"choose from .*fibonacci"):
        PythonToolEnv(families=["nope"])
    with pytest.raises(ValueError, match="difficulty must be from 1 to 3"):
        PythonToolEnv(difficulty=7)
    with pytest.raises(ValueError, match="unknown sandbox backend 'no-such-backend'; use one of bwrap, rlimit"):
        PythonToolEnv(sandbox_backend="no-such-backend")


def test_a_sandbox_that_does_not_contain_the_code_is_refused_unless_allowed():
    """Here: root with a mount namespace contains rlimit too; elsewhere rlimit is refused (test_code_sandbox.py
    checks the refusal as an unprivileged user)."""
    if "rlimit" not in available_backends():
        pytest.skip("the rlimit backend cannot run here")
    if uncontained("rlimit"):
        with pytest.raises(SandboxUnavailable, match=r"env.kwargs.allow_weak_sandbox=true"):
            PythonToolEnv(sandbox_backend="rlimit")
    else:
        PythonToolEnv(sandbox_backend="rlimit")
    env = PythonToolEnv(sandbox_backend="rlimit", allow_weak_sandbox=True, **SMALL_LIMITS)
    env.reset(seed=0)
    assert env.python("print(6 * 7)") == "42"


def test_a_correct_program_then_the_right_answer_earns_reward_one():
    env = PythonToolEnv(families=["divisible_count"], **SMALL_LIMITS)
    obs, info = env.reset(seed=3)
    start, end, divisor, excluded = integers(obs)
    program = f"print(sum(1 for n in range({start}, {end + 1}) if n % {divisor} == 0 and n % {excluded} != 0))"
    obs, reward, terminated, truncated, step_info = env.step(call_python(program))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert step_info["tool_calls"] == 1 and step_info["tool_errors"] == 0
    printed = re.search(r"\d+", obs.split("<tool_response>")[1]).group()
    assert printed == info["answer"]
    _, reward, terminated, _, step_info = env.step(f"The answer is {printed}.")
    assert reward == 1.0 and terminated and step_info["success"] is True


def test_a_wrong_answer_earns_nothing():
    env = PythonToolEnv(families=["fibonacci"], **SMALL_LIMITS)
    _, info = env.reset(seed=0)
    _, reward, terminated, _, step_info = env.step(str(int(info["answer"]) + 1))
    assert reward == 0.0 and terminated and step_info["success"] is False


def test_a_crashing_snippet_returns_the_traceback_and_the_episode_goes_on():
    env = PythonToolEnv(families=["weekday"], **SMALL_LIMITS)
    _, info = env.reset(seed=1)
    obs, reward, terminated, truncated, step_info = env.step(call_python("x = 1\nprint(x / 0)"))
    assert "ZeroDivisionError" in obs and "Traceback" in obs
    assert step_info["tool_errors"] == 1 and not (terminated or truncated) and reward == 0.0
    program = "import datetime\nprint(datetime.date.fromisoformat('2020-02-29').strftime('%A'))"
    obs, _, _, _, step_info = env.step(call_python(program))
    assert "Saturday" in obs and step_info["tool_errors"] == 0
    _, reward, terminated, _, _ = env.step(info["answer"].title())
    assert reward == 1.0 and terminated


def test_an_infinite_loop_ends_with_a_timeout_message():
    env = PythonToolEnv(**SMALL_LIMITS)
    env.reset(seed=0)
    obs, _, terminated, _, step_info = env.step(call_python("while True:\n    pass"))
    assert re.search(r"time(d)? ?out|time limit", obs, re.IGNORECASE), obs
    assert step_info["tool_errors"] == 1 and not terminated


def test_running_out_of_steps_truncates_and_stepping_after_the_end_raises():
    env = PythonToolEnv(max_steps=2, **SMALL_LIMITS)
    with pytest.raises(RuntimeError, match=r"reset\(\)"):
        env.step("1")
    env.reset(seed=0)
    env.step(call_python("print(1)"))
    _, reward, terminated, truncated, info = env.step(call_python("print(2)"))
    assert truncated and not terminated and reward == 0.0 and info["success"] is False
    with pytest.raises(RuntimeError, match=r"call reset\(\)"):
        env.step("42")
    env.reset(seed=1)
    _, _, terminated, _, _ = env.step("42")
    assert terminated
    with pytest.raises(RuntimeError, match=r"call reset\(\)"):
        env.step("42")


def test_check_env_passes():
    assert check_env("python_tool", SMALL_LIMITS) == []
