"""One engine in this process, as the server calls it: stop strings end a generation early, tokens stream out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agentrl.engine.base import GenerateOutput, SamplingParams
from agentrl.serve.protocol import APIError

# Tokens decoded past a stop string's length when looking for it in the newest text (a token is at least a byte).
STOP_LOOKBACK_TOKENS = 4

OnTokens = Callable[[list[int], list[float]], None]


@dataclass(frozen=True)
class Generation:
    """What one completion asks the engine for."""

    prompt_ids: list[int]
    sampling: SamplingParams
    stop: tuple[str, ...] = ()


class LocalBackend:
    """`generate(Generation, on_tokens)` on an engine of this process.

    With an engine that reports tokens as it samples them (`streams_tokens`: the continuous torch engine),
    `on_tokens` sees them step by step and a stop string ends the request at once; with others (the batch
    scheduler, SGLang) `on_tokens` gets the whole output at the end and the text is cut after the fact.
    """

    def __init__(self, engine, tokenizer):
        self.engine = engine
        self.tokenizer = tokenizer
        self.grammars = engine.allow_grammars(tokenizer)  # requests may carry an output grammar
        self.in_flight = 0
        self.served = 0
        self.dropped = 0  # generations cancelled before their end (their client went away)

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def health(self) -> dict:
        return {"in_flight": self.in_flight, "served": self.served, "dropped": self.dropped}

    async def generate(self, request: Generation, on_tokens: OnTokens | None = None) -> GenerateOutput:
        output = await self._generate(request, on_tokens)
        if "grammar_error" in output.meta:  # llguidance gave up mid-way (a resource limit): the output is not valid
            raise APIError(
                f"constrained decoding failed: {output.meta['grammar_error']}; simplify the schema or grammar",
                status=500,
                kind="server_error",
            )
        return output

    async def _generate(self, request: Generation, on_tokens: OnTokens | None) -> GenerateOutput:
        self.in_flight += 1
        try:
            if not getattr(self.engine, "streams_tokens", False):
                output = await self.engine.generate(request.prompt_ids, request.sampling)
                if on_tokens is not None and len(output.output_ids):
                    on_tokens(output.output_ids.tolist(), output.logprobs.tolist())
                return output
            if not request.stop and on_tokens is None:
                return await self.engine.generate(request.prompt_ids, request.sampling)
            return await self._watched(request, on_tokens)
        except asyncio.CancelledError:
            self.dropped += 1
            raise
        finally:
            self.in_flight -= 1
            self.served += 1

    async def _watched(self, request: Generation, on_tokens: OnTokens | None) -> GenerateOutput:
        ids: list[int] = []
        logprobs: list[float] = []
        stopped = asyncio.Event()
        lookback = max((len(s) for s in request.stop), default=0) + STOP_LOOKBACK_TOKENS

        def progress(tokens: list[int], token_logprobs: list[float]) -> None:
            if stopped.is_set():
                return
            ids.extend(tokens)
            logprobs.extend(token_logprobs)
            if on_tokens is not None:
                on_tokens(tokens, token_logprobs)
            if request.stop:
                tail = self.tokenizer.decode(ids[-lookback:], skip_special_tokens=True)
                if any(stop in tail for stop in request.stop):
                    stopped.set()

        engine_call = asyncio.ensure_future(self.engine.generate(request.prompt_ids, request.sampling, progress))
        stop_seen = asyncio.ensure_future(stopped.wait())
        try:
            await asyncio.wait((engine_call, stop_seen), return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when this call is cancelled (a client went away): the engine drops the request
            stop_seen.cancel()
            if not engine_call.done():
                engine_call.cancel()
        if engine_call.done() and not engine_call.cancelled() and not stopped.is_set():
            return engine_call.result()
        with contextlib.suppress(asyncio.CancelledError):
            await engine_call
        return GenerateOutput(
            output_ids=np.asarray(ids, dtype=np.int64),
            logprobs=np.asarray(logprobs, dtype=np.float32),
            finish_reason="stop",
            weight_version=self.engine.weight_version,
            meta={"prompt_tokens": len(request.prompt_ids), "completion_tokens": len(ids), "stop_string": True},
        )
