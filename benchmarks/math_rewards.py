"""number_match against math_verify (agentrl/rewards.py) on answers a math model writes: which grades each case
right, and the median cost of one call: first seen (math-verify's parse caches cleared before each call, as for a
new completion in training) and repeated (cached).

    python benchmarks/math_rewards.py               # the table of docs/ecosystems.md#math-verify
    python benchmarks/math_rewards.py --repeats 21
"""

from __future__ import annotations

import argparse
import statistics
import time

from agentrl.rewards import math_verify, number_match

# (completion, reference answer, whether a careful grader accepts it)
CASES = [
    ("the answer is 42", "42", True),
    ("It costs $1,200.50", "1200.5", True),
    ("#### 18", "18", True),
    ("3.0", "3", True),
    ("41.9999999", "42", False),
    ("12", "1200", False),
    ("I think it is 5, no wait, 6", "6", True),
    ("so x = \\frac{1}{2}", "0.5", True),
    ("the answer is 1/2", "0.5", True),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
    ("50%", "0.5", True),
    ("\\boxed{42} (checked in 3 steps)", "42", True),
    ("The answer is 42. I used 6 * 7.", "42", True),
    ("1000", "10^3", True),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
    ("\\boxed{(x+1)^2}", "x^2+2x+1", True),
    ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}", True),
    ("\\boxed{1e3}", "1000", True),
]


def median_ms(grader, completion: str, answer: str, repeats: int, cold: bool = False) -> float:
    times = []
    for _ in range(repeats):
        if cold:
            clear_math_verify_caches()
        started = time.perf_counter()
        grader(completion, answer)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def clear_math_verify_caches() -> None:
    from math_verify.parser import parse_expr_cached, parse_latex_cached

    parse_latex_cached.cache_clear()
    parse_expr_cached.cache_clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=11, help="timed calls per case and grader (the median)")
    args = parser.parse_args()
    print(
        "| completion | answer | correct | number_match | math_verify | number_match ms | math_verify ms, first seen "
        "| math_verify ms, cached |"
    )
    print("|---|---|---|---|---|---:|---:|---:|")
    right = {"number_match": 0, "math_verify": 0}
    costs = {"number_match": [], "math_verify": [], "math_verify first seen": []}
    for completion, answer, correct in CASES:
        row = []
        for name, grader in (("number_match", number_match), ("math_verify", math_verify)):
            grader(completion, answer)  # warm: math-verify caches parses, sympy imports lazily
            success = grader(completion, answer)["success"]
            right[name] += success == correct
            row.append("right" if success == correct else "**wrong**")
            costs[name].append(median_ms(grader, completion, answer, args.repeats))
        costs["math_verify first seen"].append(median_ms(math_verify, completion, answer, args.repeats, cold=True))
        shown = completion.replace("|", "\\|")
        print(
            f"| `{shown}` | `{answer}` | {'yes' if correct else 'no'} | {row[0]} | {row[1]} "
            f"| {costs['number_match'][-1]:.3f} | {costs['math_verify first seen'][-1]:.2f} "
            f"| {costs['math_verify'][-1]:.2f} |"
        )
    for name in right:
        print(f"{name}: {right[name]} of {len(CASES)} right")
    for name, times in costs.items():
        print(f"{name}: median per call {statistics.median(times):.3f} ms, slowest case {max(times):.2f} ms")


if __name__ == "__main__":
    main()
