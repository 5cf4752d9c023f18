"""Read a discrete action out of a model's text: an action name or its index number."""

from __future__ import annotations

import re

NUMBER = r"\d+"


def parse_action(text: str, names: tuple[str, ...], count: int | None = None) -> int | None:
    """The index of the first action mentioned in `text`, or None when it mentions none.

    A mention is an action name (whole word, case-insensitive) or an index number below
    `count` (default: the number of names); numbers out of range are not mentions, so
    "7 then left" is "left" in a game of four actions.
    """
    count = len(names) if count is None else count
    by_name = {name.lower(): index for index, name in enumerate(names)}
    alternatives = [re.escape(name) for name in sorted(by_name, key=len, reverse=True)] + [NUMBER]
    pattern = re.compile(r"\b(" + "|".join(alternatives) + r")\b", re.IGNORECASE)
    for match in pattern.finditer(text):
        word = match.group().lower()
        if word in by_name:
            return by_name[word]
        if int(word) < count:
            return int(word)
    return None


def describe_actions(names: tuple[str, ...], count: int) -> str:
    """ "left, down, right, up (or 0-3)" when actions have names, "0-5" when they have only numbers."""
    numbers = f"{0}-{count - 1}" if count > 1 else "0"
    return f"{', '.join(names)} (or {numbers})" if names else numbers
