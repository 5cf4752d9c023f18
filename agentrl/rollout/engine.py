"""The rollout engine interface: SGLang's shape, token ids in and out.

Every backend (the built-in torch engine, SGLang) implements `Engine`. The agent loop
only ever awaits `generate`; concurrent calls are how a backend gets to batch.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (the subset SGLang and the torch engine share)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k filter
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class GenerateOutput:
    """One finished request.

    `output_ids` holds every generated token, the stop token included when one ended
    the turn. `logprobs[i]` is the log-probability of `output_ids[i]` under
    softmax(logits / temperature), not renormalised for top-p/top-k (as SGLang reports).
    """

    output_ids: np.ndarray  # int64, shape (n,)
    logprobs: np.ndarray  # float32, shape (n,)
    finish_reason: FinishReason
    weight_version: int = -1
    meta: dict = field(default_factory=dict)


class Engine(abc.ABC):
    """Async generation over token ids; weights can be replaced between batches."""

    weight_version: int = -1
    busy_seconds: float = 0.0  # wall time spent generating, for the time/generate metric

    @abc.abstractmethod
    async def generate(self, input_ids: list[int] | np.ndarray, sampling: SamplingParams) -> GenerateOutput:
        """Generate one completion for `input_ids`."""

    @abc.abstractmethod
    def load_weights(self, named_tensors, version: int) -> None:
        """Replace the model weights with `named_tensors` (name -> tensor) and set the version."""

    def abort_all(self) -> None:  # noqa: B027 - optional for backends without in-flight work
        """Finish every in-flight request with finish_reason 'abort'."""

    def shutdown(self) -> None:  # noqa: B027
        """Release the engine's resources."""
