"""The SGLang rollout backend: an in-process `sglang.Engine` behind our `Engine` interface.

SGLang is GPU-only and optional, so it is imported only when an engine is built.
Facts this module relies on (checked against SGLang 0.5.23; `SGLANG_CALLS` lists every
call with the keywords we pass, and tests/unit/test_sglang_contract.py checks them):

- The Engine keeps an asyncio loop (`engine.loop`); its blocking methods run
  `loop.run_until_complete`, and the tokenizer manager binds its receive task to the
  loop of the first request. So the rollout worker runs its episodes on that loop
  (`event_loop`), and weight updates run between steps, while the loop is idle.
- With `skip_tokenizer_init` the stop token stays in `output_ids` (we also pass
  `no_stop_trim`); `meta_info["output_token_logprobs"]` holds (logprob, token id, text)
  for every generated token, so its ids are the tokens the trainer trains on.
- Weight updates must run between `begin_weight_update()` and `end_weight_update()`.
- The Engine spawns children that re-import `__main__`; they must not see this rank's
  MPI environment (`environment_without_mpi`). A crashing child sends SIGQUIT to this
  process: our handler then aborts the whole MPI job with the reason.
- `Engine.shutdown()` kills every child process of this process, ours included
  (env subprocesses, sandboxes): shut the engine down after the env client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass

import numpy as np

from agentrl.config import ModelConfig, SGLangEngineConfig
from agentrl.engine.base import Engine, FinishReason, GenerateOutput, SamplingParams
from agentrl.engine.sglang_lora import SGLangAdapters, server_kwargs
from agentrl.transport import MPI_VARIABLE_PREFIXES

MISSING_SGLANG = (
    "rollout.engine.backend=sglang needs SGLang: pip install 'agentrl[sglang]' on a GPU machine (SGLang is GPU-only)"
)
NO_MPI_FLAG = "AGENTRL_NO_MPI"  # set for SGLang's children: nothing there may initialise MPI


@dataclass(frozen=True)
class SGLangCall:
    """One SGLang callable we use and the keyword arguments we pass it."""

    source: str  # file inside the sglang package
    owner: str  # class defining it
    function: str
    keywords: tuple[str, ...]


ENGINE_SOURCE = "srt/entrypoints/engine.py"
SGLANG_CALLS = (
    SGLangCall(
        "srt/arg_groups/fields",
        "ServerArgs",
        "fields",
        (
            "model_path",
            "tp_size",
            "base_gpu_id",
            "skip_tokenizer_init",
            "mem_fraction_static",
            "enable_memory_saver",
            "random_seed",
            "dtype",
            "custom_sigquit_handler",
            "enable_lora",
            "max_lora_rank",
            "lora_target_modules",
        ),
    ),
    SGLangCall(
        "srt/sampling/sampling_params.py",
        "SamplingParams",
        "fields",
        (
            "max_new_tokens",
            "temperature",
            "top_p",
            "top_k",
            "stop_token_ids",
            "no_stop_trim",
            "sampling_seed",
            "json_schema",
            "ebnf",
        ),
    ),
    SGLangCall(
        ENGINE_SOURCE, "Engine", "async_generate", ("input_ids", "sampling_params", "return_logprob", "lora_path")
    ),
    SGLangCall(ENGINE_SOURCE, "Engine", "load_lora_adapter", ("lora_name", "lora_path")),
    SGLangCall(ENGINE_SOURCE, "Engine", "unload_lora_adapter", ("lora_name",)),
    SGLangCall(
        ENGINE_SOURCE,
        "Engine",
        "init_weights_update_group",
        ("master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"),
    ),
    SGLangCall(ENGINE_SOURCE, "Engine", "begin_weight_update", ()),
    SGLangCall(ENGINE_SOURCE, "Engine", "end_weight_update", ()),
    SGLangCall(
        ENGINE_SOURCE,
        "Engine",
        "update_weights_from_distributed",
        ("names", "dtypes", "shapes", "group_name", "flush_cache", "load_format"),
    ),
    SGLangCall(ENGINE_SOURCE, "Engine", "update_weights_from_tensor", ("named_tensors", "flush_cache")),
    SGLangCall(ENGINE_SOURCE, "Engine", "flush_cache", ()),
    SGLangCall(ENGINE_SOURCE, "Engine", "release_memory_occupation", ()),
    SGLangCall(ENGINE_SOURCE, "Engine", "resume_memory_occupation", ()),
    SGLangCall(ENGINE_SOURCE, "Engine", "shutdown", ()),
    SGLangCall("srt/managers/tokenizer_manager.py", "TokenizerManager", "abort_request", ("abort_all",)),
    SGLangCall("srt/managers/tokenizer_manager.py", "TokenizerManager", "auto_create_handle_loop", ()),
)


class SGLangMissingError(ImportError):
    pass


class SGLangCrashedError(RuntimeError):
    pass


def import_sglang():
    try:
        import sglang
    except ImportError as error:
        raise SGLangMissingError(MISSING_SGLANG) from error
    return sglang


@contextlib.contextmanager
def environment_without_mpi():
    """Hide this rank's MPI variables from processes started inside, then put them back.

    MPI read them at initialisation, so this rank is unaffected; a child that saw them
    would hang (MPICH) or join the job as an extra rank (Open MPI) on importing mpi4py.
    """
    saved = {key: value for key, value in os.environ.items() if key.startswith(MPI_VARIABLE_PREFIXES)}
    for key in saved:
        del os.environ[key]
    os.environ[NO_MPI_FLAG] = "1"
    try:
        yield
    finally:
        del os.environ[NO_MPI_FLAG]
        os.environ.update(saved)


CHILD_CRASHED = (
    "an SGLang subprocess (scheduler / TP worker / detokenizer) died and sent SIGQUIT; its traceback is in "
    "the log above. Common causes: GPU out of memory (lower rollout.engine.mem_fraction_static), a wrong "
    "rollout.engine.tp_size for the visible GPUs, or a model SGLang cannot load"
)


def abort_job_on_child_crash(signum, frame):
    """SIGQUIT from an SGLang child means it died: abort the whole MPI job now, with the reason.

    Aborting here rather than raising: the signal may land inside an asyncio callback,
    where the loop would log the exception and carry on.
    """
    from agentrl import transport  # imported here: SGLang's children unpickle this function, MPI-free

    def crashed():
        raise SGLangCrashedError(CHILD_CRASHED)

    transport.abort_on_exception(crashed)()


def sampling_params_for_sglang(sampling: SamplingParams) -> dict:
    params = {
        "max_new_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,  # SGLang: -1 disables top-k; our 0 does too
        "stop_token_ids": list(sampling.stop_token_ids),
        "no_stop_trim": True,
    }
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    if sampling.grammar is not None:
        params.update(sampling.grammar.sglang_fields())
    return params


def to_generate_output(result: dict, weight_version: int) -> GenerateOutput:
    """SGLang's result dict as a GenerateOutput whose output_ids are every generated token, the stop token included."""
    meta = result["meta_info"]
    finish = meta.get("finish_reason") or {"type": "abort"}
    reason: FinishReason = finish["type"]
    if reason not in ("stop", "length", "abort"):
        raise ValueError(f"SGLang finished a request with unknown reason {finish!r}")
    entries = meta.get("output_token_logprobs") or []
    logprob_ids = [int(entry[1]) for entry in entries]
    output_ids = [int(token) for token in result.get("output_ids", [])]
    trimmed_stop = reason == "stop" and logprob_ids[:-1] == output_ids and len(logprob_ids) == len(output_ids) + 1
    if output_ids != logprob_ids and not trimmed_stop:
        raise ValueError(
            f"SGLang returned {len(output_ids)} output ids but {len(entries)} token logprobs that disagree; "
            "pass return_logprob=True and keep skip_tokenizer_init=True"
        )
    return GenerateOutput(
        output_ids=np.asarray(logprob_ids, dtype=np.int64),
        logprobs=np.asarray([float(entry[0]) for entry in entries], dtype=np.float32),
        finish_reason=reason,
        weight_version=weight_version,
        meta={"matched": finish.get("matched"), "cached_tokens": meta.get("cached_tokens")},
    )


def succeeded(result, what: str) -> None:
    """SGLang's weight calls answer (success, message) or an object with those fields; raise on failure."""
    success, message = (result.success, result.message) if hasattr(result, "success") else result
    if not success:
        raise RuntimeError(f"SGLang {what} failed: {message}")


async def _bind_handle_loop(tokenizer_manager) -> None:
    tokenizer_manager.auto_create_handle_loop()


class SGLangEngine(Engine):
    """An in-process SGLang engine on GPUs base_gpu_id .. base_gpu_id + tp_size - 1 of this node."""

    def __init__(
        self,
        model_path: str,
        section: SGLangEngineConfig,
        *,
        base_gpu_id: int,
        colocate: bool = False,
        seed: int = 0,
        dtype: str = "bfloat16",
        lora=None,
    ):
        """`section`: the engine's `rollout.engine` (tp_size, mem_fraction_static, SGLang's own keyword arguments);
        `lora` (a LoraConfig): weight syncs bring adapters only, loaded through SGLang's LoRA adapter API."""
        tp_size, mem_fraction_static, sglang_kwargs = section.tp_size, section.mem_fraction_static, section.kwargs
        sglang = import_sglang()
        self.colocate = colocate
        self.weight_group_size = tp_size
        self.weight_version = -1
        self.busy_seconds = 0.0
        self._in_flight = 0
        self._busy_since = 0.0
        self._asleep = False
        with environment_without_mpi():
            self.engine = sglang.Engine(
                model_path=str(model_path),
                tp_size=tp_size,
                base_gpu_id=base_gpu_id,
                skip_tokenizer_init=True,
                mem_fraction_static=mem_fraction_static,
                enable_memory_saver=colocate,
                random_seed=seed,
                dtype=dtype,
                custom_sigquit_handler=abort_job_on_child_crash,
                **(server_kwargs(lora) if lora is not None else {}),
                **(sglang_kwargs or {}),
            )
        self.adapters = SGLangAdapters(self.engine, lora, str(model_path)) if lora is not None else None
        # Bind SGLang's receive task to its loop now (it takes the running loop, else makes a new one).
        self.engine.loop.run_until_complete(_bind_handle_loop(self.engine.tokenizer_manager))
        if self.engine.tokenizer_manager.event_loop is not self.engine.loop:
            raise RuntimeError("SGLang bound its tokenizer manager to another event loop than Engine.loop")
        self._take_back_signals()

    def _take_back_signals(self) -> None:
        """SGLang's loop handlers would drain and exit on SIGTERM and kill this rank on SIGQUIT: restore ours."""
        from agentrl.run import preempt

        for signum in (signal.SIGTERM, signal.SIGQUIT):
            self.engine.loop.remove_signal_handler(signum)
        preempt.install()  # SIGTERM / SIGUSR1: a graceful stop decided by the trainers
        signal.signal(signal.SIGQUIT, abort_job_on_child_crash)

    @classmethod
    def from_config(
        cls, engine: SGLangEngineConfig, model: ModelConfig, device: str, seed: int, *, colocate: bool
    ) -> SGLangEngine:
        """The engine of `rollout.engine` serving `model`; `colocate` is `layout.colocate`."""
        import_sglang()
        if not device.startswith("cuda"):
            raise ValueError(
                f"rollout.engine.backend=sglang needs a GPU for this rollout rank, but it got {device!r}; "
                "run on GPU nodes or use rollout.engine.backend=torch"
            )
        return cls(
            model.path,
            engine,
            base_gpu_id=int(device.partition(":")[2] or 0),
            colocate=colocate,
            seed=seed,
            dtype=model.dtype,
            lora=model.lora,
        )

    @property
    def event_loop(self):
        return self.engine.loop

    def allow_grammars(self, tokenizer) -> bool:
        """False: SGLang compiles grammars with its own tokenizer, which this engine skips (skip_tokenizer_init:
        token ids in and out), and then aborts every request that has one. `sampling_params_for_sglang` passes a
        grammar on all the same, for an engine started with its tokenizer."""
        return False

    # ---- requests -------------------------------------------------------------------

    async def generate(self, input_ids: list[int] | np.ndarray, sampling: SamplingParams) -> GenerateOutput:
        if asyncio.get_running_loop() is not self.engine.loop:
            raise RuntimeError("await SGLangEngine.generate on engine.event_loop (SGLang binds its requests there)")
        prompt = np.asarray(input_ids, dtype=np.int64).reshape(-1).tolist()
        adapter = {"lora_path": self.adapters.current} if self.adapters is not None and self.adapters.current else {}
        self._start_busy()
        try:
            result = await self.engine.async_generate(
                input_ids=prompt, sampling_params=sampling_params_for_sglang(sampling), return_logprob=True, **adapter
            )
        finally:
            self._end_busy()
        return to_generate_output(result, self.weight_version)

    def _start_busy(self) -> None:
        if self._in_flight == 0:
            self._busy_since = time.perf_counter()
        self._in_flight += 1

    def _end_busy(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self.busy_seconds += time.perf_counter() - self._busy_since

    def abort_all(self) -> None:
        """Every in-flight request finishes with 'abort' (SGLang has no Engine.abort; the tokenizer manager does)."""
        abort = self.engine.tokenizer_manager.abort_request
        try:
            on_engine_loop = asyncio.get_running_loop() is self.engine.loop
        except RuntimeError:
            on_engine_loop = False
        if on_engine_loop or not self.engine.loop.is_running():
            abort(abort_all=True)
        else:
            self.engine.loop.call_soon_threadsafe(lambda: abort(abort_all=True))

    def shutdown(self) -> None:
        """Stop SGLang; note it kills every child process of this process (see the module docstring)."""
        self.engine.shutdown()
        if self.adapters is not None:
            self.adapters.close()

    @property
    def loaded_checksum(self) -> int | None:
        """LoRA: the checksum of the adapters the last sync loaded (weights/lora.py confirms it)."""
        return None if self.adapters is None else self.adapters.loaded_checksum

    # ---- weights (called between steps, while the engine loop is idle) ---------------

    def load_weights(self, named_tensors, version: int) -> None:
        """In-process tensors (GPU tensors travel to the TP workers by CUDA IPC)."""
        items = list(named_tensors.items() if hasattr(named_tensors, "items") else named_tensors)
        self.begin_weight_update()
        self.load_weight_bucket(items)
        self.end_weight_update(version)

    def join_weight_group(
        self, address: str, port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> None:
        result = self.engine.init_weights_update_group(
            master_address=address,
            master_port=port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
        )
        succeeded(result, "init_weights_update_group")

    def begin_weight_update(self) -> None:
        if self.adapters is None and hasattr(self.engine, "begin_weight_update"):
            self.engine.begin_weight_update()

    def receive_weight_bucket(self, specs: list[tuple[str, tuple[int, ...], str]], group_name: str) -> None:
        result = self.engine.update_weights_from_distributed(
            names=[name for name, _, _ in specs],
            dtypes=[dtype for _, _, dtype in specs],
            shapes=[list(shape) for _, shape, _ in specs],
            group_name=group_name,
            flush_cache=False,
            load_format="flattened_bucket",
        )
        succeeded(result, "update_weights_from_distributed")

    def load_weight_bucket(self, named_tensors: list) -> None:
        if self.adapters is not None:
            self.adapters.take(named_tensors)
            return
        result = self.engine.update_weights_from_tensor(named_tensors=list(named_tensors), flush_cache=False)
        succeeded(result, "update_weights_from_tensor")

    def end_weight_update(self, version: int) -> None:
        if self.adapters is not None:
            self.adapters.load(version)
        elif hasattr(self.engine, "end_weight_update"):
            self.engine.end_weight_update()
        self.engine.flush_cache()  # cached prefixes were computed with the old weights
        self.weight_version = version

    def sleep(self) -> None:
        if self.colocate and not self._asleep:
            self.engine.release_memory_occupation()
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self.engine.resume_memory_occupation()
            self._asleep = False
