"""The rules of Wordle, free of any RL: the shipped word list and the colour of each letter of a guess."""

from __future__ import annotations

from collections import Counter
from importlib.resources import files

GREEN, YELLOW, GREY = "G", "Y", "."


def shipped_words() -> list[str]:
    """The word list packaged with agentrl_wordle (words.txt), in file order."""
    text = files("agentrl_wordle").joinpath("words.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def check_word_list(words: list[str]) -> list[str]:
    """The list lower-cased, after checking that it holds at least two distinct words of one length, letters only."""
    cleaned = [word.strip().lower() for word in words]
    if len(set(cleaned)) < 2:
        raise ValueError(f"wordle needs at least two distinct words, got {words!r}")
    if len(set(cleaned)) != len(cleaned):
        raise ValueError(f"wordle words must be distinct; remove the repeats from {words!r}")
    lengths = {len(word) for word in cleaned}
    if len(lengths) != 1:
        raise ValueError(f"wordle words must all have one length, got lengths {sorted(lengths)}; pick words alike")
    bad = [word for word in cleaned if not word.isascii() or not word.isalpha()]
    if bad:
        raise ValueError(f"wordle words must be ASCII letters only; fix {bad!r}")
    return cleaned


def score(guess: str, secret: str) -> str:
    """One mark per letter: G (right place), Y (in the secret elsewhere), . (not in it, or used up).

    Repeated letters are coloured as in Wordle: greens first, then yellows while the
    secret still has unmatched copies of that letter.
    """
    if len(guess) != len(secret):
        raise ValueError(f"guess {guess!r} and secret {secret!r} differ in length")
    marks = [GREEN if g == s else GREY for g, s in zip(guess, secret, strict=True)]
    unmatched = Counter(s for s, mark in zip(secret, marks, strict=True) if mark != GREEN)
    for index, letter in enumerate(guess):
        if marks[index] == GREY and unmatched[letter] > 0:
            marks[index] = YELLOW
            unmatched[letter] -= 1
    return "".join(marks)


def matches(word: str, pattern: str, excluded: str) -> bool:
    """True when `word` fits `pattern` ("?" for any letter) and contains none of the `excluded` letters."""
    if len(word) != len(pattern):
        return False
    fits = all(p in ("?", w) for p, w in zip(pattern.lower(), word, strict=True))
    return fits and not set(excluded.lower()) & set(word)
