"""Answer grading in the SQuAD style: normalised exact match, and token F1 for partial credit."""

from __future__ import annotations

import re
import string
from collections import Counter

ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """Lowercase, punctuation and the articles a/an/the removed, whitespace collapsed."""
    text = ARTICLES.sub(" ", text.lower().translate(PUNCTUATION))
    return " ".join(text.split())


def exact_match(prediction: str, answers: tuple[str, ...]) -> bool:
    guess = normalize(prediction)
    return any(guess == normalize(answer) for answer in answers)


def token_f1(prediction: str, answers: tuple[str, ...]) -> float:
    """The best F1 between the prediction's words and any answer's words (0 when nothing overlaps)."""
    guess = normalize(prediction).split()
    best = 0.0
    for answer in answers:
        gold = normalize(answer).split()
        common = sum((Counter(guess) & Counter(gold)).values())
        if common:
            precision, recall = common / len(guess), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best
