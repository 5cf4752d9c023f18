"""The rollout engine interface: SGLang's shape, token ids in and out.

Every backend (the built-in torch engine, SGLang) implements `Engine`. The agent loop
only ever awaits `generate`; concurrent calls are how a backend gets to batch.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from agentrl.engine.grammar import Grammar

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
    # The output must match this grammar (constrained decoding: agentrl/engine/grammar.py); it then ends on one
    # of stop_token_ids once complete, so it needs at least one.
    grammar: Grammar | None = None
    # The LoRA adapter this request runs with, on an engine that holds several on one base (engine/shared_lora.py);
    # None: the engine's own weights.
    adapter: str | None = None
    # No later turn continues this request's conversation (the caller knows: its episode's last turn). An engine that
    # keeps a finished request's KV cache for the next turn (the continuous torch engine) skips keeping this one's.
    last_turn: bool = False


@dataclass
class GenerateOutput:
    """One finished request.

    `output_ids` holds every generated token, the stop token included when one ended
    the turn. `logprobs[i]` is the log-probability of `output_ids[i]` under
    softmax(logits / temperature), not renormalised for top-p/top-k (as SGLang reports), nor for
    an output grammar (the distribution the trainer recomputes). `meta["grammar_error"]`, where
    present, says why a constrained output stopped following its grammar.
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

    def allow_grammars(self, tokenizer) -> bool:
        """Take requests with `SamplingParams.grammar` from now on, their outputs in `tokenizer`'s tokens; False
        where this engine cannot constrain its outputs (it must then be given none)."""
        return False

    @abc.abstractmethod
    def load_weights(self, named_tensors, version: int) -> None:
        """Replace the model weights with `named_tensors` (name -> tensor) and set the version."""

    def abort_all(self) -> None:  # noqa: B027 - optional for backends without in-flight work
        """Finish every in-flight request with finish_reason 'abort'."""

    def shutdown(self) -> None:  # noqa: B027
        """Release the engine's resources."""

    def rng_state(self):
        """The state of the engine's own sampling stream, or None when this process cannot restore it (SGLang).

        Evaluation saves it and puts it back (`set_rng_state`), so training draws as if no evaluation ran."""
        return None

    def set_rng_state(self, state) -> None:  # noqa: B027
        """Put back a state `rng_state` returned."""

    def drop_cached_prefixes(self) -> None:  # noqa: B027
        """Forget KV caches kept for later requests to reuse, so evaluation's episodes leave none for training's."""

    # ---- optional: GPU weight sync (agentrl/weights/nccl.py) and colocation --------------

    weight_group_size: int = 1  # processes this engine adds to a weight broadcast group

    @property
    def event_loop(self):
        """The asyncio loop `generate` must be awaited on, or None when any loop will do."""
        return None

    def watch_batches(self, hook: Callable[[], None] | None) -> bool:
        """Call `hook` on the running event loop before each batch starts and when no batch is left to run (None
        removes it); False where this engine has no such point, its batches running on a loop or thread of its own.
        A rank running ahead takes new weights there, so it need not look for them on a timer while batches run."""
        return False

    def running_batches(self) -> bool:
        """Whether a batch runs or waits on the running event loop (after which `watch_batches`' hook is called)."""
        return False

    def join_weight_group(
        self, address: str, port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> None:
        """Join the trainer's broadcast group as ranks rank_offset .. rank_offset + weight_group_size - 1."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot receive weights over a process group; use weights.transport=mpi"
        )

    def begin_weight_update(self) -> None:  # noqa: B027
        """A bucketed update starts: the buckets that follow together replace every weight."""

    def receive_weight_bucket(self, specs: list[tuple[str, tuple[int, ...], str]], group_name: str) -> None:
        """Receive one flat bucket (tensors `specs`: name, shape, dtype) broadcast from group rank 0, and load it."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot receive weights over a process group; use weights.transport=mpi"
        )

    def load_weight_bucket(self, named_tensors: list) -> None:
        """Load some of the weights (one bucket of an update begun with begin_weight_update)."""
        raise NotImplementedError(f"{type(self).__name__} cannot load weights bucket by bucket")

    def end_weight_update(self, version: int) -> None:
        """Every bucket has arrived: finish the update and set the version."""
        raise NotImplementedError(f"{type(self).__name__} cannot load weights bucket by bucket")

    def map_weights(self, named_tensors: list, version: int) -> bool:
        """Use `named_tensors` as the weights themselves, without copying them (they live in memory the caller
        keeps unchanged until the next version: a shared-memory window). False, changing nothing, where this
        engine cannot: the caller then loads them by copy."""
        return False

    def own_weights(self) -> None:  # noqa: B027
        """Weights taken by `map_weights` move into memory of the engine's own (before the caller frees theirs)."""

    def sleep(self) -> None:  # noqa: B027
        """Colocated: give the GPU memory back while the trainer trains (a no-op where nothing is held)."""

    def wake(self) -> None:  # noqa: B027
        """Colocated: take the GPU memory back before loading weights and generating."""
