"""The built-in rollout backend: batched sampling with a KV cache, in plain torch (the batch scheduler).

`continuous_engine.ContinuousTorchEngine` builds on this one (same sampler, same weight
loading) with continuous batching and KV reuse across turns; `build_torch_engine` picks
one from the config (rollout.engine.scheduler).

Concurrent `generate` calls on one event loop are gathered by a scheduler task and run
as one batch: prompts are left-padded, prefilled together, then decoded one token per
step; a row leaves the batch (and its KV cache) as soon as it finishes, or once its caller stops waiting (its
future cancelled: a client went away), as 'abort'. The batch runs
on a single worker thread, so the event loop keeps serving environments meanwhile and
requests that arrive during a batch are gathered into the next one.

Logprobs follow SGLang: log_softmax(logits / temperature) of the chosen token, not
renormalised after top-k/top-p filtering.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from agentrl.engine.base import Engine, FinishReason, GenerateOutput, SamplingParams
from agentrl.engine.grammar import GrammarVocab, grammar_error
from agentrl.engine.hf import cache_keyword, takes_ready_made_sdpa_masks
from agentrl.engine.sampling import RowSampling, sample_tokens, seeded_generator
from agentrl.engine.shared_prompts import SharedPrompts

# Yields to the event loop with no new request before a batch starts: enough for a
# coroutine woken by a finished request to run up to its next `generate` call.
QUIET_YIELDS = 3


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    matcher: object = None  # the output grammar's matcher, for a constrained request


@dataclass
class _LoopQueue:
    """Requests waiting on one event loop, and that loop's scheduler task."""

    pending: list[_Request] = field(default_factory=list)
    scheduler: asyncio.Task | None = None


class _BatchOutputs:
    """Tokens and logprobs of every batch row, and which batch row each running row is."""

    def __init__(self, batch_size: int, longest_output: int, device: torch.device):
        self.tokens = torch.zeros(batch_size, longest_output, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(batch_size, longest_output, dtype=torch.float32, device=device)
        self.lengths = [0] * batch_size
        self.reasons: list[FinishReason] = ["length"] * batch_size
        self.running = list(range(batch_size))
        self.running_index = torch.arange(batch_size, device=device)

    def record(self, step: int, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        self.tokens[self.running_index, step] = tokens
        self.logprobs[self.running_index, step] = logprobs

    def finish(
        self, step: int, done: torch.Tensor, stopped: torch.Tensor | None, aborted: bool, cancelled: list[int]
    ) -> torch.Tensor:
        """Close the running rows marked `done` (`cancelled`: those whose caller left); return the positions of the
        rows still running."""
        for row in done.nonzero().squeeze(1).tolist():
            batch_row = self.running[row]
            self.lengths[batch_row] = step + 1
            if aborted or row in cancelled:
                self.reasons[batch_row] = "abort"
            elif stopped is not None and bool(stopped[row]):
                self.reasons[batch_row] = "stop"
        keep = (~done).nonzero().squeeze(1)
        self.running = [self.running[row] for row in keep.tolist()]
        self.running_index = self.running_index[keep]
        return keep


class TorchEngine(Engine):
    """Serve a Hugging Face causal LM: every request pending on a loop runs as one batch."""

    def __init__(
        self,
        model,
        *,
        pad_token_id: int,
        max_batch_size: int = 256,
        seed: int = 0,
        share_prompts: bool = True,
        steps_on_loop: bool = False,
    ):
        """`share_prompts`: rows with the same prompt are prefilled once (engine/shared_prompts.py); off only to
        measure or check what that saves. `steps_on_loop`: the model runs on the event loop's own thread, between
        its callbacks, instead of on the engine's worker thread (see `steps_on_loop` in `build_torch_engine`)."""
        self.model = model.eval()
        self.steps_on_loop = bool(steps_on_loop)
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = int(max_batch_size)
        first_param = next(model.parameters())
        self.device = first_param.device
        output_head = model.get_output_embeddings()
        self.vocab_size = output_head.weight.shape[0] if output_head is not None else model.config.vocab_size
        self.generator = seeded_generator(seed, self.device)
        self.weight_version = -1
        self.weights_mapped = False  # parameters view memory given to map_weights
        self.lora = None  # a LoraMerge once use_lora is called: syncs then bring adapters only
        self.share_prompts = bool(share_prompts)
        # prefill_tokens: prompt tokens run through the model; shared_tokens: those a row took from another row's
        # prefill of the same prompt.
        self.stats = {
            "batches": 0,
            "requests": 0,
            "prompt_tokens": 0,
            "prefill_tokens": 0,
            "shared_tokens": 0,
            "generated_tokens": 0,
            "largest_batch": 0,
        }
        self._keeps_last_logits_only = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._takes_ready_masks = takes_ready_made_sdpa_masks(model)
        self._cache_keyword = cache_keyword(model)
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopQueue] = weakref.WeakKeyDictionary()
        # A new thread starts with OpenMP's default thread count (OMP_NUM_THREADS, else every core), not the
        # count torch.set_num_threads gave the thread that built the engine: the worker sets the same itself.
        self.threads = torch.get_num_threads()
        self._worker = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="torch-engine",
            initializer=torch.set_num_threads,
            initargs=(self.threads,),
        )
        self._model_lock = threading.Lock()  # a batch and a weight update never overlap
        self._checked_update: tuple[list | None, dict] = (None, {})  # load_weights: the names and shapes last checked
        self._abort_epoch = 0  # bumped by abort_all; a batch from an older epoch stops early
        self.grammars: GrammarVocab | None = None  # set by allow_grammars: requests may carry an output grammar
        self._batch_hook: Callable[[], None] | None = None  # watch_batches

    # ---- requests -------------------------------------------------------------------

    async def generate(self, input_ids: list[int] | np.ndarray, sampling: SamplingParams) -> GenerateOutput:
        prompt = self._prompt(input_ids)
        if sampling.max_new_tokens <= 0:
            return self._empty_output("length")
        matcher = await self._matcher(sampling) if sampling.grammar is not None else None
        request = _Request(prompt, sampling, asyncio.get_running_loop().create_future(), matcher)
        self._enqueue(request, self._schedule)
        return await request.future

    def allow_grammars(self, tokenizer) -> bool:
        self.grammars = GrammarVocab(tokenizer, self.vocab_size)
        return True

    async def _matcher(self, sampling: SamplingParams):
        """The matcher of a constrained request, made off the event loop (a large grammar takes milliseconds)."""
        if self.grammars is None:
            raise ValueError("this engine was given no tokenizer for output grammars; call allow_grammars first")
        if not sampling.stop_token_ids:
            raise ValueError("a request with an output grammar needs stop_token_ids to end on once it is complete")
        return await asyncio.get_running_loop().run_in_executor(None, self.grammars.matcher, sampling.grammar)

    @staticmethod
    def _prompt(input_ids: list[int] | np.ndarray) -> list[int]:
        prompt = np.asarray(input_ids, dtype=np.int64).reshape(-1).tolist()
        if not prompt:
            raise ValueError("generate needs a non-empty prompt")
        return prompt

    def _enqueue(self, request, schedule) -> None:
        """Add `request` to the running loop's queue; start `schedule(queue)` there unless it runs already."""
        loop = asyncio.get_running_loop()
        queue = self._queues.setdefault(loop, _LoopQueue())
        queue.pending.append(request)
        if queue.scheduler is None or queue.scheduler.done():
            queue.scheduler = loop.create_task(schedule(queue))

    def watch_batches(self, hook: Callable[[], None] | None) -> bool:
        self._batch_hook = hook
        return True

    def running_batches(self) -> bool:
        queue = self._queues.get(asyncio.get_running_loop())
        return queue is not None and queue.scheduler is not None

    async def _schedule(self, queue: _LoopQueue) -> None:
        loop = asyncio.get_running_loop()
        try:
            while queue.pending:
                await self._wait_for_quiet(queue)
                if self._batch_hook is not None:  # may cancel requests: before they are taken
                    self._batch_hook()
                batch = [r for r in queue.pending[: self.max_batch_size] if not r.future.done()]
                del queue.pending[: self.max_batch_size]
                if not batch:
                    continue
                prompts = [r.prompt for r in batch]
                params = [r.sampling for r in batch]
                matchers = [r.matcher for r in batch]
                try:
                    futures = [r.future for r in batch]
                    batch_args = (prompts, params, self._abort_epoch, matchers, futures)
                    if self.steps_on_loop:
                        outputs = self._run_batch(*batch_args)
                    else:
                        outputs = await loop.run_in_executor(self._worker, self._run_batch, *batch_args)
                except Exception as exc:
                    for request in batch:
                        if not request.future.done():
                            request.future.set_exception(exc)
                    continue
                for request, output in zip(batch, outputs, strict=True):
                    if not request.future.done():
                        request.future.set_result(output)
            queue.scheduler = None
            if self._batch_hook is not None:  # no batch left: a watcher goes back to its timer
                self._batch_hook()
        finally:
            queue.scheduler = None

    async def _wait_for_quiet(self, queue: _LoopQueue) -> None:
        quiet = 0
        while quiet < QUIET_YIELDS and len(queue.pending) < self.max_batch_size:
            seen = len(queue.pending)
            await asyncio.sleep(0)
            quiet = quiet + 1 if len(queue.pending) == seen else 0

    def abort_all(self) -> None:
        """Pending requests finish with 'abort' and no tokens; a running batch stops at its next step."""
        self._abort_epoch += 1
        try:
            current_loop = asyncio.get_running_loop()
        except RuntimeError:
            current_loop = None
        for loop, queue in list(self._queues.items()):
            if loop is current_loop:
                self._abort_pending(queue)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(self._abort_pending, queue)

    def _abort_pending(self, queue: _LoopQueue) -> None:
        requests, queue.pending = queue.pending, []
        for request in requests:
            if not request.future.done():
                request.future.set_result(self._empty_output("abort"))

    def shutdown(self) -> None:
        self.abort_all()
        self._worker.shutdown(wait=True)

    def rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    def _empty_output(self, reason: FinishReason) -> GenerateOutput:
        return GenerateOutput(
            output_ids=np.zeros(0, dtype=np.int64),
            logprobs=np.zeros(0, dtype=np.float32),
            finish_reason=reason,
            weight_version=self.weight_version,
        )

    # ---- weights --------------------------------------------------------------------

    def use_lora(self, scaling: float) -> None:
        """From now on weight syncs bring LoRA adapters only, merged into the base weights (engine/lora_merge.py)."""
        from agentrl.engine.lora_merge import LoraMerge

        self.lora = LoraMerge(self.model, scaling)

    @property
    def loaded_checksum(self) -> int | None:
        """LoRA: the checksum of the adapters the last sync merged (weights/lora.py confirms it)."""
        return None if self.lora is None else self.lora.loaded_checksum

    def load_weights(self, named_tensors, version: int) -> None:
        """Copy every parameter in place from `named_tensors` (a mapping or (name, tensor) pairs)."""
        incoming = dict(named_tensors.items() if hasattr(named_tensors, "items") else named_tensors)
        if self.lora is not None:
            with self._model_lock:
                self.lora.take(incoming.items())
                self.lora.merge()
                self.weight_version = version
            return
        # a step's update names the same tensors with the same shapes as the last: checked once
        signature = [(name, tuple(tensor.shape)) for name, tensor in incoming.items()]
        if signature != self._checked_update[0]:
            self._checked_update = (signature, self._update_targets(incoming))
        targets = self._checked_update[1]
        self.own_weights()
        with self._model_lock, torch.no_grad():
            for name, tensor in incoming.items():
                targets[name].copy_(torch.as_tensor(tensor))
            self.weight_version = version

    def _update_targets(self, incoming: dict) -> dict:
        """The model's tensors that `incoming` names, by name; a ValueError names every unknown, missing or misshapen
        one."""
        targets = {
            **dict(self.model.named_parameters(remove_duplicate=False)),
            **dict(self.model.named_buffers(remove_duplicate=False)),
        }
        unknown = sorted(name for name in incoming if name not in targets)
        given = {id(targets[name]) for name in incoming if name in targets}
        missing = [name for name, param in self.model.named_parameters() if id(param) not in given]
        mismatched = [
            f"{name}: got {tuple(tensor.shape)}, model has {tuple(targets[name].shape)}"
            for name, tensor in incoming.items()
            if name in targets and tuple(tensor.shape) != tuple(targets[name].shape)
        ]
        problems = [
            f"{label}: {', '.join(names)}"
            for label, names in (("unknown names", unknown), ("missing names", missing), ("shape mismatch", mismatched))
            if names
        ]
        if problems:
            raise ValueError("load_weights rejected the update; " + "; ".join(problems))
        return targets

    # ---- weights bucket by bucket: a process group or CUDA IPC (agentrl/weights/nccl.py) --

    def join_weight_group(
        self, address: str, port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> None:
        from agentrl.weights.nccl import init_weight_group

        groups = vars(self).setdefault("_weight_groups", {})
        groups[group_name] = init_weight_group(backend, address, port, world_size, rank_offset, group_name)

    def begin_weight_update(self) -> None:
        self.own_weights()  # copies must not land in memory given to map_weights, which other ranks may view
        self._names_updated: set[str] = set()

    def receive_weight_bucket(self, specs: list[tuple[str, tuple[int, ...], str]], group_name: str) -> None:
        import torch.distributed

        from agentrl.weights.nccl import spec_nbytes, unflatten_bucket

        groups = vars(self).get("_weight_groups", {})
        if group_name not in groups:
            raise RuntimeError(f"weight group {group_name!r} not joined; call join_weight_group first")
        flat = torch.empty(sum(map(spec_nbytes, specs)), dtype=torch.uint8, device=self.device)
        torch.distributed.broadcast(flat, group=groups[group_name], group_src=0)
        self.load_weight_bucket(unflatten_bucket(flat, specs))

    def load_weight_bucket(self, named_tensors: list) -> None:
        if not hasattr(self, "_names_updated"):
            raise RuntimeError("load_weight_bucket outside an update; call begin_weight_update first")
        if self.lora is not None:
            with self._model_lock:
                self.lora.take(named_tensors)
                self._names_updated.update(name for name, _ in named_tensors)
            return
        names = tuple(name for name, _ in named_tensors)
        sources = [tensor for _, tensor in named_tensors]
        targets = self._bucket_targets(names, [tensor.shape for tensor in sources])
        with self._model_lock, torch.no_grad():
            # One fused multi-tensor copy: a kernel launch per tensor costs more than a GPU copies a small model.
            torch._foreach_copy_(targets, sources)
            self._names_updated.update(names)

    def _bucket_targets(self, names: tuple[str, ...], shapes: list[torch.Size]) -> list[torch.Tensor]:
        """The parameters and buffers a bucket of `names` (of `shapes`) loads into, checked once per bucket layout:
        a sync that sends the same tensors every version (CUDA IPC, one bucket) looks them up once."""
        kept = vars(self).setdefault("_bucket_layouts", {}).get(names)
        if kept is not None and kept[1] == shapes:
            return kept[0]
        by_name = dict(self.model.named_parameters(remove_duplicate=False))
        by_name.update(self.model.named_buffers(remove_duplicate=False))
        for name, shape in zip(names, shapes, strict=True):
            if name not in by_name:
                raise ValueError(f"weight bucket names {name!r}, which the rollout model does not have")
            if tuple(shape) != tuple(by_name[name].shape):
                raise ValueError(f"{name}: got {tuple(shape)}, model has {tuple(by_name[name].shape)}")
        targets = [by_name[name] for name in names]
        self._bucket_layouts[names] = (targets, shapes)
        return targets

    def end_weight_update(self, version: int) -> None:
        updated = self.__dict__.pop("_names_updated", None)
        if updated is None:
            raise RuntimeError("end_weight_update without begin_weight_update")
        if self.lora is not None:
            with self._model_lock:
                self.lora.merge()
                self.weight_version = version
            return
        if updated != vars(self).get("_complete_update"):  # a set of names once found complete is complete again
            named = self.model.named_parameters(remove_duplicate=False)
            given = {id(param) for name, param in named if name in updated}
            missing = [name for name, param in self.model.named_parameters() if id(param) not in given]
            if missing:
                raise ValueError(f"weight update left parameters unchanged: {', '.join(missing)}")
            self._complete_update = updated
        self.weight_version = version

    def map_weights(self, named_tensors: list, version: int) -> bool:
        """Every parameter becomes the given tensor itself (same name, shape, dtype and device), no copy."""
        if self.lora is not None:
            return False  # adapters are merged, never viewed
        params = dict(self.model.named_parameters(remove_duplicate=False))
        named_tensors = list(named_tensors)

        def kind(tensor):
            return tensor.shape, tensor.dtype, tensor.device

        fits = all(name in params and kind(tensor) == kind(params[name]) for name, tensor in named_tensors)
        given = {id(params[name]) for name, _ in named_tensors if name in params}
        if not fits or any(id(param) not in given for param in self.model.parameters()):
            return False  # the copy path names what is wrong, or converts what it can
        with self._model_lock, torch.no_grad():
            for name, tensor in named_tensors:
                params[name].data = tensor
            self.weight_version = version
            self.weights_mapped = True
        return True

    def own_weights(self) -> None:
        with self._model_lock, torch.no_grad():
            if self.weights_mapped:
                for param in self.model.parameters():
                    param.data = param.data.clone()
                self.weights_mapped = False

    # ---- batched generation (worker thread) -----------------------------------------

    def _run_batch(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        abort_epoch: int,
        matchers=None,
        futures=None,
    ) -> list[GenerateOutput]:
        started = time.perf_counter()
        with self._model_lock, torch.inference_mode():
            self.stats["batches"] += 1  # counted when the batch starts
            self.stats["requests"] += len(prompts)
            self.stats["prompt_tokens"] += sum(map(len, prompts))
            self.stats["largest_batch"] = max(self.stats["largest_batch"], len(prompts))
            tokens, logprobs, lengths, reasons = self._decode_batch(prompts, params, abort_epoch, matchers, futures)
            version = self.weight_version
        self.stats["generated_tokens"] += sum(lengths)
        self.busy_seconds += time.perf_counter() - started
        matchers = matchers or [None] * len(prompts)
        return [
            GenerateOutput(
                output_ids=tokens[row, :n].copy(),
                logprobs=logprobs[row, :n].copy(),
                finish_reason=reasons[row],
                weight_version=version,
                meta=_output_meta(len(prompts[row]), n, matchers[row]),
            )
            for row, n in enumerate(lengths)
        ]

    def _decode_batch(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        abort_epoch: int,
        matchers=None,
        futures=None,
    ) -> tuple[np.ndarray, np.ndarray, list[int], list[FinishReason]]:
        """`futures`: the rows' callers' futures; a row whose future is cancelled leaves at the next step."""
        batch_size = len(prompts)
        longest_output = max(p.max_new_tokens for p in params)
        sharing = self._shared_prompts(prompts, params)
        prefilled = prompts if sharing is None else [prompts[row] for row in sharing.leaders]
        input_ids, prompt_mask = self._left_pad(prefilled)
        prompt_width = input_ids.shape[1]
        positions = (prompt_mask.cumsum(dim=1) - 1).clamp_min_(0)
        rows = RowSampling(params, self.vocab_size, self.device, matchers=matchers, grammars=self.grammars)
        self.stats["prefill_tokens"] += sum(map(len, prefilled))

        cache = DynamicCache(config=self.model.config)
        if sharing is not None:
            self._rows_kept(sharing.leader_index(self.device))
        logits = self._last_logits(input_ids, prompt_mask, positions, cache)
        if sharing is not None:  # every row takes its prompt's cache and logits
            copies = sharing.copy_index(self.device)
            cache.batch_select_indices(copies)
            logits, prompt_mask, positions = logits[copies], prompt_mask[copies], positions[copies]
            self._rows_kept(copies)
            self.stats["shared_tokens"] += sum(len(prompts[row]) for row, _ in sharing.followers())
        decode_mask = self._decode_mask(prompt_mask, longest_output)
        next_positions = positions[:, -1:] + 1

        outputs = _BatchOutputs(batch_size, longest_output, self.device)
        for step in range(longest_output):
            tokens, logprobs = sample_tokens(logits, rows, self.generator)
            outputs.record(step, tokens, logprobs)

            stopped = rows.stopped(tokens)
            done = rows.max_new_tokens == step + 1
            if stopped is not None:
                done |= stopped
            aborted = self._abort_epoch != abort_epoch
            # Read from this thread, as the continuous engine does: at worst a row leaves one step later.
            cancelled = (
                [row for row, index in enumerate(outputs.running) if futures[index].cancelled()] if futures else []
            )
            if cancelled:
                done[cancelled] = True
            if aborted or done.any():
                if aborted:
                    done.fill_(True)
                keep = outputs.finish(step, done, stopped, aborted, cancelled)
                if keep.numel() == 0:
                    break
                cache.batch_select_indices(keep)
                decode_mask = decode_mask[keep] if decode_mask is not None else None
                next_positions = next_positions[keep]
                rows.select(keep)
                self._rows_kept(keep)
                tokens = tokens[keep]

            # A contiguous mask keeps SDPA on its fast path; one small copy serves every layer.
            step_mask = decode_mask[..., : prompt_width + step + 1].contiguous() if decode_mask is not None else None
            logits = self._last_logits(tokens[:, None], step_mask, next_positions, cache)
            next_positions += 1

        return outputs.tokens.cpu().numpy(), outputs.logprobs.cpu().numpy(), outputs.lengths, outputs.reasons

    def _shared_prompts(self, prompts: list[list[int]], params: list[SamplingParams]) -> SharedPrompts | None:
        """Which rows' prefill serves which rows: those with the same prompt (and adapter) share one; None: no
        two rows do, or sharing is off."""
        if not self.share_prompts or len(prompts) < 2:
            return None
        return SharedPrompts.of([(tuple(prompt), p.adapter) for prompt, p in zip(prompts, params, strict=True)])

    def _rows_kept(self, keep: torch.Tensor) -> None:
        """The running batch's rows are now its former rows at `keep` (rows finished, or, after a shared prefill,
        leaders copied to the rows that share their prompt): for a subclass that tracks rows (engine/shared_lora.py)."""

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(map(len, prompts))
        input_ids = np.full((len(prompts), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(prompts), width), dtype=np.int64)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = prompt
            mask[row, width - len(prompt) :] = 1
        return torch.from_numpy(input_ids).to(self.device), torch.from_numpy(mask).to(self.device)

    def _decode_mask(self, prompt_mask: torch.Tensor, longest_output: int) -> torch.Tensor | None:
        """The attention mask over prompt and output, sliced to the cache length at each decode step.

        None when no prompt is padded. Generated tokens are never padding, so the mask
        for every step is known upfront; where the model accepts ready-made SDPA masks it
        is built once here instead of once per step inside the model.
        """
        if bool(prompt_mask.all()):
            return None
        output_mask = prompt_mask.new_ones(prompt_mask.shape[0], longest_output)
        mask = torch.cat([prompt_mask, output_mask], dim=1)
        return mask.bool()[:, None, None, :] if self._takes_ready_masks else mask

    def _last_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        extra = {"logits_to_keep": 1} if self._keeps_last_logits_only else {}
        if attention_mask is not None and attention_mask.ndim == 4:
            attention_mask = {"full_attention": attention_mask}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_keyword: cache},
            **extra,
        )
        return out.logits[:, -1, :]


def _output_meta(prompt_tokens: int, completion_tokens: int, matcher) -> dict:
    meta = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    error = grammar_error(matcher)
    if error is not None:
        meta["grammar_error"] = error
    return meta
