"""A judge's reply read as a reward: the score it wrote, checked against the rubric's range and scaled to [0, 1]."""

from __future__ import annotations

import json
import math
import re

from agentrl.scoring.score import ScoreFailed

SHOWN_CHARS = 200  # of a reply quoted in a failure


def judge_reward(reply: str, score_format: str, pattern: str, score_range: tuple[float, float]) -> float:
    """(score - low) / (high - low) for the score in `reply`; ScoreFailed naming what was wrong, quoting the reply."""
    score = _json_score(reply) if score_format == "json" else _regex_score(reply, pattern)
    low, high = score_range
    if not math.isfinite(score) or not low <= score <= high:
        raise ScoreFailed(
            f"the judge scored {score:g}, outside reward.judge.score_range [{low:g}, {high:g}]; say the range in the "
            f"rubric, or widen score_range.\nReply: {_quoted(reply)}"
        )
    return (score - low) / (high - low)


def _regex_score(reply: str, pattern: str) -> float:
    matches = list(re.finditer(pattern, reply))
    if not matches:
        raise ScoreFailed(
            f"no score in the judge's reply (reward.judge.score_pattern {pattern!r} did not match); have the rubric "
            f"ask for that format, or change score_pattern.\nReply: {_quoted(reply)}"
        )
    text = matches[-1][1]
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ScoreFailed(
            f"the judge's score {text!r} (score_pattern's first group) is not a number.\nReply: {_quoted(reply)}"
        ) from None


def _json_score(reply: str) -> float:
    try:
        value = json.loads(reply)
    except json.JSONDecodeError:
        value = None
    score = value.get("score") if isinstance(value, dict) else None
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise ScoreFailed(
            'the judge\'s reply is not a JSON object with a numeric "score" (reward.judge.score_format=json); ask '
            f"for it in the rubric, or constrain it with request_extra.response_format.\nReply: {_quoted(reply)}"
        )
    return float(score)


def _quoted(reply: str) -> str:
    return repr(reply if len(reply) <= SHOWN_CHARS else reply[:SHOWN_CHARS] + "...")


def reply_reward(reply, config, raised: str):
    """A judge's reply (or what asking for it raised) -> its reward, or the ScoreFailed its episode fails with;
    `raised` starts the message of an exception ("asking the judge raised")."""
    if isinstance(reply, ScoreFailed):
        return reply
    if isinstance(reply, BaseException):
        return ScoreFailed(f"{raised} {reply!r}")
    try:
        return judge_reward(reply, config.score_format, config.score_pattern, config.score_range)
    except ScoreFailed as failure:
        return failure
