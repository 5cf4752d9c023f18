"""The torch engine with continuous batching and KV reuse across an episode's turns.

One worker thread runs a decode loop (or, with `steps_on_loop`, the event loop that awaits the
requests runs its steps between its own callbacks). At every step it

1. samples one token for every running row (the same sampler as `TorchEngine`);
2. lets finished rows leave: their results go back to their event loop at once and their
   KV cache (minus the last sampled token, which was never fed) goes to the store;
3. feeds, in one pass through the model, the sampled tokens of the rows still running and
   the requests that arrived since the last step: each of these takes the stored KV cache
   of its longest token prefix, if any (`kv_sessions.KVSessionStore`), and only the rest
   of its prompt is prefilled; they then join the running batch, to be sampled at the
   next step.

Rows of different lengths share one KV tensor per layer, each row right-aligned, with an
explicit attention mask and position ids; columns no row uses any more are trimmed.

A new weight version makes every cached key and value stale: the store is emptied and the
running rows are prefilled again (prompt and output so far) under the new weights. A
row's `weight_version` is the version it was admitted under, the oldest that shaped it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from agentrl.engine.base import FinishReason, GenerateOutput, SamplingParams
from agentrl.engine.decode_graphs import DecodeGraphs
from agentrl.engine.grammar import grammar_error
from agentrl.engine.kv_sessions import KVSessionStore, RowsKV
from agentrl.engine.lean_decoder import COLUMN_HEADROOM, FAMILIES, Feed, LeanDecoder
from agentrl.engine.running_batch import RunningBatch
from agentrl.engine.sampling import RowSampling, sample_tokens, seeded_generator
from agentrl.engine.shared_prompts import SharedPrompts
from agentrl.engine.slot_batch import SlotBatch
from agentrl.engine.torch_engine import TorchEngine, _LoopQueue
from agentrl.errors import UserError

# Waiting requests are admitted once they are this fraction of the running rows, or have
# waited this many decode steps (measured in docs/engine.md).
ADMIT_FRACTION = 0.25
ADMIT_WAIT_STEPS = 2


@dataclass(eq=False)
class _Row:
    """One request, from `generate` until its result is delivered."""

    prompt: list[int]
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    abort_epoch: int
    stop_ids: frozenset[int] = frozenset()
    generator: torch.Generator | None = None
    progress: Callable[[list[int], list[float]], None] | None = None  # called on `loop` with each step's tokens
    matcher: object = None  # the output grammar's matcher, for a constrained request
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version: int | None = None
    cached_tokens: int = 0

    @property
    def sequence(self) -> list[int]:
        return self.prompt + self.output


@dataclass
class _Admission:
    """Rows joining the running batch: their new tokens (rows, width), mask over kept + new columns,
    positions, and a cache holding their stored KV."""

    ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    cache: DynamicCache
    sharing: SharedPrompts | None = None  # rows with the same tokens: only their leaders are prefilled


class ContinuousTorchEngine(TorchEngine):
    """Serve a Hugging Face causal LM with continuous batching and KV reuse across turns.

    `generate(..., progress=callback)` reports each step's tokens as they are sampled (`agentrl serve` streams
    them); a request whose awaiting task is cancelled leaves the running batch at the next step."""

    streams_tokens = True

    def __init__(
        self,
        model,
        *,
        pad_token_id: int,
        max_batch_size: int = 256,
        seed: int = 0,
        kv_cache_bytes: int = 256 << 20,
        cuda_graphs: bool | str = "auto",
        share_prompts: bool = True,
        steps_on_loop: bool = False,
    ):
        layer_types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"} or getattr(model.config, "use_sliding_window", False):
            architecture = getattr(model.config, "model_type", None) or type(model).__name__
            raise UserError(
                f"the continuous torch engine cannot serve {architecture} ({type(model).__name__}): it needs full "
                f"attention in every layer, the model has {sorted(layer_types)}; set rollout.engine.scheduler=batch"
            )
        super().__init__(
            model,
            pad_token_id=pad_token_id,
            max_batch_size=max_batch_size,
            seed=seed,
            share_prompts=share_prompts,
            steps_on_loop=steps_on_loop,
        )
        self.sessions = KVSessionStore(kv_cache_bytes)
        self.decoder = LeanDecoder.for_model(model)  # None: decode steps run the model's forward
        self.stats.update(steps=0, prefills=0, prefill_tokens=0, reused_tokens=0, evictions=0)
        self._inbox: list[_Row] = []
        self._steps_waited = 0  # decode steps the waiting requests have waited to be admitted
        self._outbox: list[tuple[_Row, GenerateOutput | BaseException]] = []
        self._progress: list[tuple[_Row, int, float]] = []  # this step's tokens for rows with a progress callback
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._stepping_loop: asyncio.AbstractEventLoop | None = None  # steps_on_loop: the loop stepping now
        self.graphs = self._decode_graphs(cuda_graphs)  # None: decode steps in the lean decoder or the forward
        self._batch = RunningBatch() if self.graphs is None else self._slot_batch()
        self._host = _HostCopy(self.device, self.max_batch_size) if self.graphs is not None else None
        self._kv_version = self.weight_version

    def _decode_graphs(self, choice: bool | str) -> DecodeGraphs | None:
        """`cuda_graphs`: `auto` captures decode steps on CUDA where the lean decoder serves the model; `true` asks
        for the fixed-shape steps anywhere (on CPU they run eagerly: how tests check them); `false` never."""
        if choice not in ("auto", True, False):
            raise UserError(f"cuda_graphs must be auto, true or false, not {choice!r}")
        on_cuda = self.device.type == "cuda"
        if choice is False or (choice == "auto" and not on_cuda):
            return None
        if self.decoder is None or not self.decoder.rotary.static:
            if choice == "auto":
                return None
            raise UserError(
                f"rollout.engine.cuda_graphs=true needs a model the lean decoder serves ({', '.join(FAMILIES)} with "
                "SDPA attention and a fixed rotary table); set rollout.engine.cuda_graphs=auto or false"
            )
        return DecodeGraphs(self.decoder, capture=on_cuda)

    def _slot_batch(self) -> SlotBatch:
        decoder = self.decoder
        dtype = next(self.model.parameters()).dtype
        layers = len(decoder.layers)
        return SlotBatch(layers, decoder.kv_heads, decoder.head_dim, dtype, self.device, self.max_batch_size)

    # ---- requests (event loop side) ----------------------------------------------------

    async def generate(
        self,
        input_ids: list[int] | np.ndarray,
        sampling: SamplingParams,
        progress: Callable[[list[int], list[float]], None] | None = None,
    ) -> GenerateOutput:
        """`progress(tokens, logprobs)`, if given, is called on this loop with the tokens each step adds."""
        prompt = self._prompt(input_ids)
        if sampling.max_new_tokens <= 0:
            return self._empty_output("length")
        if self._closed:
            return self._empty_output("abort")
        matcher = await self._matcher(sampling) if sampling.grammar is not None else None
        loop = asyncio.get_running_loop()
        if self.steps_on_loop and self._stepping_loop not in (None, loop):  # one loop steps the batch, unlocked
            raise RuntimeError(
                "this continuous torch engine runs its steps on the event loop awaiting them "
                "(rollout.engine.steps_on=loop), and another loop's requests are running; build it with "
                "steps_on_loop=False to serve several event loops at once"
            )
        row = _Row(
            prompt,
            sampling,
            loop,
            loop.create_future(),
            self._abort_epoch,
            stop_ids=frozenset(sampling.stop_token_ids),
            generator=seeded_generator(sampling.seed, self.device) if sampling.seed is not None else None,
            progress=progress,
            matcher=matcher,
        )
        self._enqueue(row, self._hand_over)
        return await row.future

    def watch_batches(self, hook) -> bool:
        return False  # rows join the running batch at any step, on the engine's own thread

    async def _hand_over(self, queue: _LoopQueue) -> None:
        """Pass the requests of one burst (all the coroutines woken together) to the worker at once."""
        if self.steps_on_loop:
            await self._steps_here(queue)
            return
        try:
            while queue.pending:
                await self._wait_for_quiet(queue)
                rows = self._taken(queue)
                with self._wake:
                    self._inbox.extend(rows)
                    if self._thread is None:
                        self._thread = threading.Thread(target=self._serve, name="torch-engine", daemon=True)
                        self._thread.start()
                    self._wake.notify()
        finally:
            queue.scheduler = None

    async def _steps_here(self, queue: _LoopQueue) -> None:
        """The decode loop on this event loop, until no row runs or waits: a step, then, where rows finished or
        requests wait, yields until the burst is in (the finished rows' next requests, or their ends), which joins at
        the next step; else once, for the loop's timers and I/O."""
        batch = self._batch
        self._stepping_loop = asyncio.get_running_loop()
        burst = True  # the requests that started this loop
        try:
            while queue.pending or self._inbox or batch.rows:
                if burst or queue.pending:
                    await self._wait_for_quiet(queue)
                else:
                    await asyncio.sleep(0)
                self._inbox += self._taken(queue)
                if self._closed:
                    self._abort_everything(batch)
                    return
                burst = self._run_step(batch, self._admit(len(batch.rows)))
        finally:
            queue.scheduler = None
            self._stepping_loop = None

    @staticmethod
    def _taken(queue: _LoopQueue) -> list[_Row]:
        """The requests waiting on `queue`, taken from it, less those whose callers stopped waiting."""
        rows, queue.pending = queue.pending, []
        return [row for row in rows if not row.future.done()]

    def drop_cached_prefixes(self) -> None:
        with self._model_lock:
            self.sessions.clear()

    def shutdown(self) -> None:
        self.abort_all()
        with self._wake:
            self._closed = True
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        self._worker.shutdown(wait=True)

    # ---- weights: a new version makes cached KV stale -----------------------------------

    def load_weights(self, named_tensors, version: int) -> None:
        super().load_weights(named_tensors, version)
        with self._model_lock:
            self.sessions.clear()

    def end_weight_update(self, version: int) -> None:
        super().end_weight_update(version)
        with self._model_lock:
            self.sessions.clear()

    def map_weights(self, named_tensors: list, version: int) -> bool:
        mapped = super().map_weights(named_tensors, version)
        if mapped:
            with self._model_lock:
                self.sessions.clear()
        return mapped

    def own_weights(self) -> None:
        mapped = self.weights_mapped
        super().own_weights()
        with self._model_lock:
            if mapped and self.decoder is not None:  # its fused projections still view the memory given away
                self.decoder.refresh()
                if self.graphs is not None:
                    self.graphs.check_weights()

    # ---- the decode loop (worker thread) ------------------------------------------------

    def _serve(self) -> None:
        torch.set_num_threads(self.threads)  # this thread's own OpenMP count (see TorchEngine.__init__)
        batch = self._batch
        while True:
            with self._wake:
                while not self._inbox and not batch.rows and not self._closed:
                    self._wake.wait()
                if self._closed:
                    self._abort_everything(batch)
                    return
                admitted = self._admit(len(batch.rows))
            self._run_step(batch, admitted)

    def _abort_everything(self, batch) -> None:
        admitted, self._inbox = self._inbox, []
        for row in admitted + batch.rows:
            self._deliver(row, "abort")
        batch.clear()
        self._send_results()

    def _admit(self, running: int) -> list[_Row]:
        """The waiting rows that join at this step (see `_should_admit`), taken from the inbox."""
        if not self._should_admit(running):
            self._steps_waited += 1
            return []
        room = self.max_batch_size - running
        admitted, self._inbox = self._inbox[:room], self._inbox[room:]
        self._steps_waited = 0
        return admitted

    def _run_step(self, batch, admitted: list[_Row]) -> bool:
        """One step; whether a row finished in it."""
        started = time.perf_counter()
        try:
            with self._model_lock, torch.inference_mode():
                self._step(batch, admitted)
        except Exception as exc:  # the rows in flight fail in their callers; the loop goes on
            self._outbox += [(row, exc) for row in admitted + batch.rows]
            batch.clear()
        finished = bool(self._outbox)
        self._send_results()
        self.busy_seconds += time.perf_counter() - started
        return finished

    def _should_admit(self, running: int) -> bool:
        """Admit the waiting requests now, or let them gather for a step or two.

        Each admission costs one prefill pass, about as long as a decode step for small
        models; a few late turns wait until they are a sizeable group (ADMIT_FRACTION of
        the running rows) or have waited ADMIT_WAIT_STEPS steps.
        """
        waiting = len(self._inbox)
        return waiting > 0 and (
            running == 0 or waiting >= running * ADMIT_FRACTION or self._steps_waited >= ADMIT_WAIT_STEPS
        )

    def _step(self, batch: RunningBatch, admitted: list[_Row]) -> None:
        if self._kv_version != self.weight_version:
            self.sessions.clear()
            admitted = batch.rows + admitted  # prefilled again under the new weights
            batch.clear()
            self._kv_version = self.weight_version
            if self.decoder is not None:
                self.decoder.refresh()
            if self.graphs is not None:
                self.graphs.check_weights()
        epoch = self._abort_epoch
        for row in admitted:
            if row.abort_epoch != epoch:
                self._deliver(row, "abort")
        admitted = [row for row in admitted if row.abort_epoch == epoch and not row.future.done()]
        if any(row.abort_epoch != epoch for row in batch.rows):
            self._leave(batch, [row.abort_epoch != epoch for row in batch.rows], "abort")
        if self.graphs is not None:
            self._step_on_slots(batch, admitted)
            return
        tokens = self._sample_running(batch) if batch.rows else None
        if tokens is not None or admitted:
            self._feed(batch, tokens, admitted)

    def _step_on_slots(self, batch: SlotBatch, admitted: list[_Row]) -> None:
        """A step with the decode at fixed shapes: sample, feed every running row its token (a graph replay on
        CUDA), and only then read the tokens on the host, while the GPU runs the decode: no host sync per token
        stalls the GPU. A row that finished this step was fed its last token too, which costs nothing but the
        slot's column; its logits are dropped when it leaves."""
        if batch.rows:
            self.stats["steps"] += 1
            tokens, logprobs = sample_tokens(batch.logits, batch.sampling, self.generator)
            ready = self._host.start(tokens, logprobs)
            batch.tokens_in[: len(batch.rows)] = tokens
            batch.logits = self.graphs.decode(batch)
            batch.advance()
            finished, reasons = self._record_tokens(batch, *self._host.finish(ready, len(batch.rows)))
            if any(finished):
                self._leave(batch, finished, reasons)
        if admitted:
            lengths = [len(row.sequence) for row in admitted]
            batch.join(admitted, lengths, self._prefill_slots(batch, admitted), self._row_sampling(admitted))
            self.stats["largest_batch"] = max(self.stats["largest_batch"], len(batch.rows))

    def _prefill_slots(self, batch: SlotBatch, admitted: list[_Row]) -> torch.Tensor:
        """Prefill `admitted` into the slots after the batch's last row, each after its stored KV, if any; their
        logits. Rows with the same tokens as another (`_sharing`) take that row's slot contents and logits."""
        entries = self._take_stored(admitted)
        sharing = self._sharing(admitted, entries)
        leaders = range(len(admitted)) if sharing is None else sharing.leaders
        past = [0 if entries[i] is None else len(entries[i].tokens) for i in leaders]
        new = [admitted[i].sequence[n:] for i, n in zip(leaders, past, strict=True)]
        stored = [None if entries[i] is None else entries[i].kv for i in leaders]
        first = len(batch.rows)
        batch.reserve(first + len(admitted), 1)  # the copies' slots too: prefill sizes the slots by its leaders only
        logits = self.graphs.prefill(batch, stored, new, slots=[first + i for i in leaders])
        self._count_admission(admitted, past, new, sharing)
        if sharing is None:
            return logits
        followers = sharing.followers()
        columns = max(len(admitted[row].sequence) for row, _ in followers)
        batch.copy_slots([first + leader for _, leader in followers], [first + row for row, _ in followers], columns)
        return logits[sharing.copy_index(self.device)]

    def _record_tokens(self, batch, tokens: list[int], logprobs: list[float]) -> tuple[list[bool], list[str]]:
        """Append each running row's sampled token; which rows finished with it, and why (a row whose caller
        stopped waiting, its future cancelled, leaves as 'abort')."""
        finished, reasons = [], []
        for row, token, logprob in zip(batch.rows, tokens, logprobs, strict=True):
            row.output.append(token)
            row.logprobs.append(logprob)
            if row.progress is not None:
                self._progress.append((row, token, logprob))
            stopped = token in row.stop_ids
            cancelled = row.future.cancelled()
            finished.append(stopped or cancelled or len(row.output) >= row.sampling.max_new_tokens)
            reasons.append("abort" if cancelled else "stop" if stopped else "length")
        self.stats["generated_tokens"] += len(batch.rows)
        return finished, reasons

    def _join(self, batch: RunningBatch, admitted: list[_Row], admission: _Admission, logits: torch.Tensor) -> None:
        mask, positions = admission.mask, admission.positions[:, -1] + 1
        if admission.sharing is not None:  # every row takes its leader's cache and logits
            copies = admission.sharing.copy_index(self.device)
            for layer in admission.cache.layers:
                layer.keys, layer.values = layer.keys[copies], layer.values[copies]
            mask, positions, logits = mask[copies], positions[copies], logits[copies]
        batch.join(admitted, admission.cache, mask, positions, logits, self._row_sampling(admitted))
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(batch.rows))

    def _row_sampling(self, rows: list[_Row]) -> RowSampling:
        return RowSampling(
            [row.sampling for row in rows],
            self.vocab_size,
            self.device,
            generators=[row.generator for row in rows],
            matchers=[row.matcher for row in rows],
            grammars=self.grammars,
        )

    def _sample_running(self, batch: RunningBatch) -> torch.Tensor | None:
        """Sample a token for every running row and let finished rows leave; the tokens of the rows left."""
        self.stats["steps"] += 1
        tokens, logprobs = sample_tokens(batch.logits, batch.sampling, self.generator)
        finished, reasons = self._record_tokens(batch, tokens.tolist(), logprobs.tolist())
        if not any(finished):
            return tokens
        keep = self._leave(batch, finished, reasons)
        return None if keep is None else tokens[keep]

    def _feed(self, batch: RunningBatch, tokens: torch.Tensor | None, admitted: list[_Row]) -> None:
        """One pass through the model: the running rows' sampled `tokens` and the admitted rows' prompts
        (each after its stored KV, if any); the admitted rows then join the running batch."""
        if tokens is not None:
            batch.mask = F.pad(batch.mask, (0, 1), value=True)
        admission = self._admission(admitted) if admitted else None
        if self.decoder is not None:
            feeds = [Feed.decode(tokens, batch.mask, batch.positions, batch.cache)] if tokens is not None else []
            if admission is not None:
                feeds.append(Feed.prefill(admission.ids, admission.mask, admission.positions, admission.cache))
            logits = self.decoder.forward(feeds)
        else:
            logits = []
            if tokens is not None:
                mask = batch.mask[:, None, None, :] if self._takes_ready_masks else batch.mask.long()
                logits.append(self._last_logits(tokens[:, None], mask, batch.positions[:, None], batch.cache))
            if admission is not None:
                logits.append(self._last_logits(admission.ids, admission.mask, admission.positions, admission.cache))
        if tokens is not None:
            batch.logits = logits[0]
            batch.positions += 1
        if admission is not None:
            self._join(batch, admitted, admission, logits[-1])

    def _leave(self, batch: RunningBatch, finished: list[bool], reasons) -> torch.Tensor | None:
        """Deliver the finished rows, keep their KV for a next turn (not a caller's last turn); return which old row
        each row left is."""
        keeping = []
        for index, (row, done) in enumerate(zip(batch.rows, finished, strict=True)):
            if not done:
                continue
            reason = reasons if isinstance(reasons, str) else reasons[index]
            if reason != "abort" and not row.sampling.last_turn:
                keeping.append(index)
            self._deliver(row, reason)
        if keeping and self.sessions.budget_bytes > 0:
            self._store(batch, keeping)
        return batch.leave(finished)

    def _store(self, batch: RunningBatch | SlotBatch, indices: list[int]) -> None:
        """Keep rows `indices`' KV in the store with one copy: of as many of the last rows as its budget holds."""
        rows = [batch.rows[index] for index in indices]
        tokens = [len(row.prompt) + len(row.output) - 1 for row in rows]  # the last sampled token is fed next turn
        sizes = batch.tail_block_bytes(indices, tokens)
        first = next((i for i, size in enumerate(sizes) if size <= self.sessions.budget_bytes), len(rows))
        if first == len(rows):
            return
        block = batch.stored_kvs(indices[first:], tokens[first:])
        evictions = self.sessions.evictions
        self.sessions.put_block([row.sequence[:-1] for row in rows[first:]], block, self._kv_version)
        self.stats["evictions"] += self.sessions.evictions - evictions

    def _take_stored(self, rows: list[_Row]) -> list:
        """Each row's stored KV of its longest stored token prefix, taken from the store, or None."""
        return [self.sessions.take(row.sequence, self._kv_version) if len(self.sessions) else None for row in rows]

    def _sharing(self, rows: list[_Row], entries: list) -> SharedPrompts | None:
        """Rows of one admission with the same tokens (a group's copies of a prompt) share one prefill, led by the row
        with the longest stored KV; the others' stored KV, taken from the store, goes unused."""
        if not self.share_prompts or len(rows) < 2:
            return None
        keys = [(tuple(row.sequence), row.sampling.adapter) for row in rows]
        return SharedPrompts.of(keys, rank=[0 if entry is None else len(entry.tokens) for entry in entries])

    def _admission(self, rows: list[_Row]) -> _Admission:
        """What prefilling `rows` needs: each row's stored KV, if any, and the rest of its tokens, right-aligned;
        rows with the same tokens as another row (`_sharing`) are left out, to take that row's prefill."""
        entries = self._take_stored(rows)
        sharing = self._sharing(rows, entries)
        if sharing is not None:
            entries = [entries[i] for i in sharing.leaders]
        prefilled = rows if sharing is None else [rows[i] for i in sharing.leaders]
        past = [len(entry.tokens) if entry is not None else 0 for entry in entries]
        new = [row.sequence[n:] for row, n in zip(prefilled, past, strict=True)]
        new_width = max(map(len, new))
        ids = np.full((len(prefilled), new_width), self.pad_token_id, dtype=np.int64)
        new_mask = np.zeros((len(prefilled), new_width), dtype=np.int64)
        positions = np.zeros((len(prefilled), new_width), dtype=np.int64)
        for i, (tokens, n) in enumerate(zip(new, past, strict=True)):
            ids[i, new_width - len(tokens) :] = tokens
            new_mask[i, new_width - len(tokens) :] = 1
            positions[i, new_width - len(tokens) :] = np.arange(n, n + len(tokens))
        ids, new_mask, positions = (torch.from_numpy(array).to(self.device) for array in (ids, new_mask, positions))

        cache = DynamicCache(config=self.model.config)
        if any(past):  # with room for the new columns, which the lean prefill then writes in place
            layers, past_mask = _stored_rows(entries, room=new_width + COLUMN_HEADROOM)
            _fill_cache(cache, layers)
            mask = torch.cat([past_mask.long(), new_mask], dim=1)
        else:
            mask = new_mask
        self._count_admission(rows, past, new, sharing)
        return _Admission(ids, mask, positions, cache, sharing)

    def _count_admission(
        self, rows: list[_Row], past: list[int], new: list[list[int]], sharing: SharedPrompts | None = None
    ) -> None:
        """Stats of a prefill of `rows`, and the rows' versions: the rows prefilled (all, or `sharing.leaders`) each
        fed `new` tokens after `past` stored ones; a row sharing its leader's prefill counts as the leader's past."""
        copies = range(len(rows)) if sharing is None else sharing.copies
        for row, prefilled in zip(rows, copies, strict=True):
            row.cached_tokens = row.cached_tokens or past[prefilled]
            if row.version is None:
                row.version = self._kv_version
        self.stats["prefills"] += 1
        self.stats["batches"] += 1
        self.stats["requests"] += sum(1 for row in rows if not row.output)
        self.stats["prompt_tokens"] += sum(len(row.prompt) for row in rows if not row.output)
        self.stats["prefill_tokens"] += sum(map(len, new))
        self.stats["reused_tokens"] += sum(past)
        if sharing is not None:
            self.stats["shared_tokens"] += sum(len(rows[row].sequence) for row, _ in sharing.followers())

    def _deliver(self, row: _Row, reason: FinishReason) -> None:
        error = grammar_error(row.matcher)
        output = GenerateOutput(
            output_ids=np.asarray(row.output, dtype=np.int64),
            logprobs=np.asarray(row.logprobs, dtype=np.float32),
            finish_reason=reason,
            weight_version=self.weight_version if row.version is None else row.version,
            meta={
                "prompt_tokens": len(row.prompt),
                "completion_tokens": len(row.output),
                "cached_tokens": row.cached_tokens,
                **({"grammar_error": error} if error is not None else {}),
            },
        )
        self._outbox.append((row, output))

    def _send_results(self) -> None:
        """Report the step's tokens, then resolve its finished rows, with one callback per event loop each, so
        their callers wake together and see every token before the result."""
        if self._progress:
            reports: dict[asyncio.AbstractEventLoop, dict[_Row, tuple[list[int], list[float]]]] = {}
            for row, token, logprob in self._progress:
                tokens, logprobs = reports.setdefault(row.loop, {}).setdefault(row, ([], []))
                tokens.append(token)
                logprobs.append(logprob)
            self._progress = []
            for loop, rows in reports.items():
                calls = [(row.progress, tokens, logprobs) for row, (tokens, logprobs) in rows.items()]
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_report_all, calls)
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for row, result in self._outbox:
            by_loop.setdefault(row.loop, []).append((row.future, result))
        self._outbox = []
        for loop, results in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for these rows
                loop.call_soon_threadsafe(_resolve_all, results)


def _report_all(calls: list[tuple[Callable, list[int], list[float]]]) -> None:
    for progress, tokens, logprobs in calls:
        progress(tokens, logprobs)


def _resolve_all(results: list[tuple[asyncio.Future, GenerateOutput | BaseException]]) -> None:
    for future, result in results:
        if future.done():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


def _stored_rows(entries, room: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """Per layer, the stored keys and values of every admitted row (entries in the running batch's layout,
    `RowsKV`), right-aligned to the widest block's columns, in buffers with `room` more columns after them; and
    their mask (rows, columns): one copy per tensor and block the rows come from."""
    by_block: dict[int, tuple[RowsKV, list[int], list[int]]] = {}
    for row, entry in enumerate(entries):
        if entry is not None:
            stored, rows, sources = by_block.setdefault(id(entry.block), (entry.block.rows, [], []))
            rows.append(row)
            sources.append(entry.start)
    parts = list(by_block.values())
    width = max(stored.mask.shape[1] for stored, _, _ in parts)
    template = parts[0][0]
    device = template.mask.device
    mask = torch.zeros((len(entries), width), dtype=torch.bool, device=device)
    layers = [
        tuple(
            tensor.new_zeros((len(entries), tensor.shape[1], width + room, tensor.shape[3]))[:, :, :width]
            for tensor in pair
        )
        for pair in template.layers
    ]
    for stored, rows, sources in parts:
        columns = stored.mask.shape[1]
        into = torch.tensor(rows, device=device)
        every = len(sources) == stored.mask.shape[0] and sources == list(range(len(sources)))
        take = slice(None) if every else torch.tensor(sources, device=device)
        mask[:, width - columns :].index_copy_(0, into, stored.mask[take])
        for pair, stored_pair in zip(layers, stored.layers, strict=True):
            for tensor, kept in zip(pair, stored_pair, strict=True):
                tensor[:, :, width - columns :].index_copy_(0, into, kept[take])
    return layers, mask


def _fill_cache(cache: DynamicCache, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for cache_layer, (keys, values) in zip(cache.layers, layers, strict=True):
        cache_layer.lazy_initialization(keys, values)
        cache_layer.keys, cache_layer.values = keys, values


class _HostCopy:
    """A step's sampled tokens and logprobs on their way to the host: copied into pinned memory behind an event on
    CUDA, so the host waits for the sampling and not for the decode queued after it."""

    def __init__(self, device: torch.device, rows: int):
        self.cuda = device.type == "cuda"
        self.tokens = torch.zeros(rows, dtype=torch.long, pin_memory=self.cuda)
        self.logprobs = torch.zeros(rows, dtype=torch.float32, pin_memory=self.cuda)

    def start(self, tokens: torch.Tensor, logprobs: torch.Tensor):
        count = tokens.shape[0]
        self.tokens[:count].copy_(tokens, non_blocking=self.cuda)
        self.logprobs[:count].copy_(logprobs, non_blocking=self.cuda)
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def finish(self, event, count: int) -> tuple[list[int], list[float]]:
        if event is not None:
            event.synchronize()
        return self.tokens[:count].tolist(), self.logprobs[:count].tolist()
