"""Inference engines: token ids in, token ids, logprobs and a finish reason out (`base.Engine`).

- `torch_engine.TorchEngine`: the torch engine's batch scheduler; `continuous.ContinuousTorchEngine`: its
  continuous scheduler, with KV reuse across turns (`kv_sessions`), the lean decoder's steps and, on
  CUDA, decode steps replayed as CUDA graphs over a slot KV cache (`slot_batch`, `decode_graphs`);
- `sglang.SGLangEngine`: an in-process `sglang.Engine` (GPU);
- `make_engine` builds the one a config asks for. Nothing here imports the agent side (agentrl/rollout/).
"""

from __future__ import annotations

from agentrl.config import EngineConfig, ModelConfig


def make_engine(engine: EngineConfig, model: ModelConfig, device: str, seed: int, *, colocate: bool):
    """The engine `engine` (`rollout.engine`) asks for, serving `model`; `colocate` (`layout.colocate`): an SGLang
    engine shares its GPU with a trainer and sleeps while it trains."""
    if engine.backend == "sglang":
        from agentrl.engine.sglang import SGLangEngine

        return SGLangEngine.from_config(engine, model, device, seed, colocate=colocate)
    from agentrl.models.loading import load_causal_lm, load_tokenizer

    loaded = load_causal_lm(model.path, model.dtype, device)
    tokenizer = load_tokenizer(model.path)
    built = build_torch_engine(loaded, engine, pad_token_id=tokenizer.pad_token_id, seed=seed)
    if model.lora is not None:  # syncs bring adapters only, merged into these weights
        built.use_lora(model.lora.scaling)
    return built


def make_shared_base_engine(engine: EngineConfig, model: ModelConfig, device: str, seed: int):
    """One torch engine (the batch scheduler) over `model`'s base, for several policies' LoRA adapters on it
    (`SharedBaseEngine.adapter` gives each its engine)."""
    from agentrl.engine.shared_lora import SharedBaseEngine
    from agentrl.models.loading import load_causal_lm, load_tokenizer

    loaded = load_causal_lm(model.path, model.dtype, device)
    pad = load_tokenizer(model.path).pad_token_id
    return SharedBaseEngine(loaded, pad_token_id=pad, max_batch_size=engine.max_batch_size, seed=seed)


def build_torch_engine(model, config, *, pad_token_id: int, seed: int):
    """The torch engine `config` (a TorchEngineConfig) asks for: the continuous or the batch scheduler."""
    from agentrl.engine.torch_engine import TorchEngine

    if config.scheduler == "batch":
        return TorchEngine(model, pad_token_id=pad_token_id, max_batch_size=config.max_batch_size, seed=seed)
    from agentrl.engine.continuous import ContinuousTorchEngine

    return ContinuousTorchEngine(
        model,
        pad_token_id=pad_token_id,
        max_batch_size=config.max_batch_size,
        seed=seed,
        kv_cache_bytes=int(config.kv_cache_mb * (1 << 20)),
        cuda_graphs=config.cuda_graphs,
    )
