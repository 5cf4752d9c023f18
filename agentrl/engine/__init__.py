"""Inference engines: token ids in, token ids, logprobs and a finish reason out (`base.Engine`).

- `torch_engine.TorchEngine`: the torch engine's batch scheduler; `continuous.ContinuousTorchEngine`: its
  continuous scheduler, with KV reuse across turns (`kv_sessions`), the lean decoder's steps and, on
  CUDA, decode steps replayed as CUDA graphs over a slot KV cache (`slot_batch`, `decode_graphs`);
- `sglang.SGLangEngine`: an in-process `sglang.Engine` (GPU);
- `make_engine` builds the one a config asks for. Nothing here imports the agent side (agentrl/rollout/).
"""

from __future__ import annotations

from agentrl.config import EngineConfig, ModelConfig


def make_engine(
    engine: EngineConfig, model: ModelConfig, device: str, seed: int, *, colocate: bool, keep_loop_free: bool = False
):
    """The engine `engine` (`rollout.engine`) asks for, serving `model`; `colocate` (`layout.colocate`): an SGLang
    engine shares its GPU with a trainer and sleeps while it trains; `keep_loop_free`: the rollout's event loop has work
    while the model runs (a torch engine's `steps_on=auto` then keeps its steps off that loop; see `loop_has_work`)."""
    if engine.backend == "sglang":
        from agentrl.engine.sglang import SGLangEngine

        return SGLangEngine.from_config(engine, model, device, seed, colocate=colocate)
    from agentrl.models.loading import load_causal_lm, load_tokenizer

    loaded = load_causal_lm(model.path, model.dtype, device)
    tokenizer = load_tokenizer(model.path)
    on_loop = steps_on_loop(engine, device, keep_loop_free)
    built = build_torch_engine(loaded, engine, pad_token_id=tokenizer.pad_token_id, seed=seed, steps_on_loop=on_loop)
    if model.lora is not None:  # syncs bring adapters only, merged into these weights
        built.use_lora(model.lora.scaling)
    return built


def make_shared_base_engine(
    engine: EngineConfig, model: ModelConfig, device: str, seed: int, *, keep_loop_free: bool = False
):
    """One torch engine (the batch scheduler) over `model`'s base, for several policies' LoRA adapters on it
    (`SharedBaseEngine.adapter` gives each its engine)."""
    from agentrl.engine.shared_lora import SharedBaseEngine
    from agentrl.models.loading import load_causal_lm, load_tokenizer

    loaded = load_causal_lm(model.path, model.dtype, device)
    pad = load_tokenizer(model.path).pad_token_id
    on_loop = steps_on_loop(engine, device, keep_loop_free)
    return SharedBaseEngine(
        loaded, pad_token_id=pad, max_batch_size=engine.max_batch_size, seed=seed, steps_on_loop=on_loop
    )


def steps_on_loop(engine: EngineConfig, device: str, keep_loop_free: bool) -> bool:
    """Whether a torch engine runs its steps on the event loop's thread (`rollout.engine.steps_on`)."""
    if engine.steps_on != "auto":
        return engine.steps_on == "loop"
    return device.split(":")[0] == "cpu" and not keep_loop_free


def loop_has_work(rollout, agent_programs: bool, rollout_ranks: int = 1) -> bool:
    """Whether a rollout's event loop has work that must not wait for the model: agent programs' HTTP requests
    (`agent:`), and, with the batch scheduler, whose batch holds a loop until it ends, a look for new weights while
    running ahead of the trainer (the trainer's send may wait for it) and the other rollout ranks' task claims
    (`rollout.dispatch=dynamic`, answered on rollout rank 0's loop). The continuous scheduler's steps are short enough
    for those to wait between them."""
    if agent_programs:
        return True
    if getattr(rollout.engine, "scheduler", None) != "batch":
        return False
    return rollout.max_staleness > 0 or (rollout.dispatch == "dynamic" and rollout_ranks > 1)


def build_torch_engine(model, config, *, pad_token_id: int, seed: int, steps_on_loop: bool = False):
    """The torch engine `config` (a TorchEngineConfig) asks for: the continuous or the batch scheduler; its steps on
    the event loop that awaits them (`steps_on_loop`; the continuous scheduler's, one loop at a time) or on a worker
    thread of its own."""
    from agentrl.engine.torch_engine import TorchEngine

    if config.scheduler == "batch":
        return TorchEngine(
            model,
            pad_token_id=pad_token_id,
            max_batch_size=config.max_batch_size,
            seed=seed,
            steps_on_loop=steps_on_loop,
        )
    from agentrl.engine.continuous import ContinuousTorchEngine

    return ContinuousTorchEngine(
        model,
        pad_token_id=pad_token_id,
        max_batch_size=config.max_batch_size,
        seed=seed,
        kv_cache_bytes=int(config.kv_cache_mb * (1 << 20)),
        cuda_graphs=config.cuda_graphs,
        steps_on_loop=steps_on_loop,
    )
