"""A session's model calls, exactly as served, turned into training samples.

Each call records the prompt ids the gateway rendered, the ids the engine generated, their logprobs
and the weight version. A call whose prompt starts with the previous call's prompt and completion,
token for token, continues the same sample: the tokens in between (the template's turn end and the
tool results or user message) enter with loss mask 0. Any other call starts a new sample, as when an
agent summarizes its history, drops its reasoning or runs a sub-agent. Every sample of a session
shares its episode's reward and group. With several policies (docs/multi-agent.md), each call names the policy that
generated it, and each policy's calls form samples of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SessionCall:
    """One model call of a session, as the engine saw it, and the reply's text as the agent got it."""

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    weight_version: int
    finish_reason: str = "stop"
    text: str = ""  # the reply's content (a completion's text)
    tool_calls: int = 0  # calls the reply made (in the chat format's tool-call markup)
    request: object = field(default=None, repr=False)  # the OpenAI request (its messages, for dumps)
    reply: dict | None = field(default=None, repr=False)  # chat: the assistant message the agent got
    policy: str | None = None  # the policy that generated it (a multi-policy gateway), else None


@dataclass
class Sample:
    """One token sequence to train on: mask 1 on generated tokens, with their logprobs and versions."""

    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    prompt_len: int = 0
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    call_indices: list[int] = field(default_factory=list)  # each turn's index among the session's calls
    calls: int = 0

    def extend(self, ids, mask: int, logprobs=None, version: int = -1) -> None:
        ids = [int(i) for i in ids]
        self.tokens.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend(np.zeros(len(ids)).tolist() if logprobs is None else [float(x) for x in logprobs])
        self.token_versions.extend([version] * len(ids))

    def add_call(self, call: SessionCall, context_ids, index: int) -> None:
        """`context_ids` (mask 0) then the call's completion (mask 1); `index`: the call's among the session's."""
        if not self.tokens:
            self.prompt_len = len(context_ids)
        self.extend(context_ids, mask=0)
        start = len(self.tokens)
        self.extend(call.output_ids, mask=1, logprobs=call.logprobs, version=call.weight_version)
        self.turn_spans.append((start, len(self.tokens)))
        self.call_indices.append(index)
        self.calls += 1


def samples_from_calls(calls: list[SessionCall], policy: str | None = None) -> list[Sample]:
    """The session's samples in call order: a call extends the open sample whose tokens its prompt starts with
    (the newest such sample, so interleaved sub-agents each keep theirs), else it opens a new one. With `policy`,
    only that policy's calls (each keeps its index among all the session's calls)."""
    samples: list[Sample] = []
    for index, call in enumerate(calls):
        if policy is not None and call.policy != policy:
            continue
        prompt = [int(i) for i in call.prompt_ids]
        target = next((s for s in reversed(samples) if _extends(prompt, s.tokens)), None)
        if target is None:
            target = Sample()
            samples.append(target)
        target.add_call(call, prompt[len(target.tokens) :], index)
    return samples


def _extends(prompt: list[int], tokens: list[int]) -> bool:
    return bool(tokens) and len(prompt) >= len(tokens) and prompt[: len(tokens)] == tokens
