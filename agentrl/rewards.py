"""Answer grading shared by envs, and ready-made reward functions for `env.reward_fn`.

    env:
      id: calculator
      reward_fn: agentrl.rewards:number_match     # or exact_match, token_f1, contains, math_verify

The reward functions read the episode's last turn (`completion`) and reset info's
`"answer"` (see agentrl/rollout/reward_hook.py for every argument they may take); an env
without an answer scores 0. Each returns {"reward": ..., "success": ...}.
"""

from __future__ import annotations

import re
import string
import threading
from collections import Counter
from decimal import Decimal

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}\b)")
ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = str.maketrans("", "", string.punctuation)


def last_number(text: str) -> Decimal | None:
    """The last number written in `text` ("1,234.5" reads as 1234.5), exactly; None when there is none."""
    numbers = NUMBER.findall(THOUSANDS_SEPARATOR.sub("", text))
    return Decimal(numbers[-1]) if numbers else None


def normalize(text: str) -> str:
    """SQuAD's normalisation: lowercase, punctuation and the articles a/an/the removed, whitespace collapsed."""
    text = ARTICLES.sub(" ", text.lower().translate(PUNCTUATION))
    return " ".join(text.split())


def exact_match_score(prediction: str, answers) -> bool:
    """Whether the normalised prediction equals any normalised answer (`answers`: a string or several)."""
    guess = normalize(prediction)
    return any(guess == normalize(answer) for answer in _as_tuple(answers))


def token_f1_score(prediction: str, answers) -> float:
    """The best F1 between the prediction's words and any answer's words (0 when nothing overlaps)."""
    guess = normalize(prediction).split()
    best = 0.0
    for answer in _as_tuple(answers):
        gold = normalize(answer).split()
        common = sum((Counter(guess) & Counter(gold)).values())
        if common:
            precision, recall = common / len(guess), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def number_match_score(prediction: str, answer, tolerance: float = 1e-6) -> bool:
    """Whether the last number in the prediction is within `tolerance` of the answer."""
    guess = last_number(prediction)
    if guess is None or answer is None:
        return False
    try:
        target = Decimal(str(answer).replace(",", ""))
    except ArithmeticError:
        return False
    return abs(guess - target) <= Decimal(str(tolerance))


def exact_match(completion: str, answer) -> dict:
    success = answer is not None and exact_match_score(completion, answer)
    return {"reward": float(success), "success": success}


def token_f1(completion: str, answer) -> dict:
    """Partial credit: token F1 against the answer; success only for an exact match."""
    if answer is None:
        return {"reward": 0.0, "success": False}
    return {"reward": token_f1_score(completion, answer), "success": exact_match_score(completion, answer)}


def number_match(completion: str, answer) -> dict:
    success = number_match_score(completion, answer)
    return {"reward": float(success), "success": success}


def math_verify_score(prediction: str, answer, timeout_s: int | None = 5) -> bool:
    """Whether the prediction's final answer (its last \\boxed{}, LaTeX or plain expression) equals the answer
    (a number, a LaTeX string, or several accepted ones) by Hugging Face's math-verify: fractions, percents,
    sets, symbolic expressions. Its `timeout_s` uses SIGALRM, so it applies in the main thread only; elsewhere
    the caller's own limit (the env host's runtime.env_step_timeout_s) bounds a slow comparison."""
    math_verify = _math_verify()
    timeout = timeout_s if threading.current_thread() is threading.main_thread() else None
    guess = math_verify.parse(prediction, parsing_timeout=timeout)
    if not guess:
        return False
    for accepted in _as_tuple(answer):
        gold = math_verify.parse(_latex(accepted), parsing_timeout=timeout)
        if gold and math_verify.verify(gold, guess, timeout_seconds=timeout):
            return True
    return False


def math_verify(completion: str, answer) -> dict:
    """Math answers by math-verify (`pip install 'agentrl[math]'`): \\frac{1}{2} = 0.5 = 1/2, 50% = 0.5, the
    boxed answer even when numbers follow it. Slower than number_match (milliseconds against microseconds a call;
    docs/ecosystems.md#math-verify has the table)."""
    success = answer is not None and math_verify_score(completion, answer)
    return {"reward": float(success), "success": success}


def _math_verify():
    try:
        import math_verify
    except ImportError:
        raise ImportError(
            "agentrl.rewards:math_verify needs the math-verify package: pip install 'agentrl[math]'"
        ) from None
    return math_verify


def _latex(answer: str) -> str:
    """A reference answer as math-verify reads a gold answer: inside $...$ unless it already has delimiters."""
    text = answer.strip()
    return text if text.startswith("$") or "\\boxed" in text else f"${text}$"


def contains_score(prediction: str, answers) -> bool:
    """Whether any normalised answer appears, as whole words, in the normalised prediction."""
    guess = f" {normalize(prediction)} "
    return any(normalize(answer) and f" {normalize(answer)} " in guess for answer in _as_tuple(answers))


def contains(completion: str, answer) -> dict:
    success = answer is not None and contains_score(completion, answer)
    return {"reward": float(success), "success": success}


def _as_tuple(answers) -> tuple[str, ...]:
    if isinstance(answers, str | int | float):
        return (str(answers),)
    return tuple(str(answer) for answer in answers)
