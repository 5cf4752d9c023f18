"""FSDP2 for the trainer: activation checkpointing, mixed precision, sharding, full state dicts.

`shard` applies `fully_shard` to each decoder layer, then to the root, over the trainer
group (gloo on CPU, NCCL on GPU). Parameters become DTensors sharded on dim 0; FSDP
reduce-scatters gradients in backward, so the trainer skips its own all-reduce. The
functions gathering full state dicts are collectives: every trainer rank calls them.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from agentrl.models.adapters import peft_base


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a Hugging Face causal LM (`model.model.layers` for Llama/Qwen-style models), also
    under a PEFT wrapper (model.lora)."""
    model = peft_base(model)
    base = getattr(model, "base_model", model)
    layers = getattr(base, "layers", None)
    if isinstance(layers, nn.ModuleList) and len(layers):
        return layers
    raise ValueError(
        f"cannot find the decoder layers of {type(model).__name__} (looked for base_model.layers); "
        "FSDP and activation checkpointing wrap each decoder layer: use a Llama/Qwen-style model, "
        "or set parallelism.fsdp=false and parallelism.activation_checkpointing=false"
    )


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in backward (torch.utils.checkpoint, use_reentrant=False).

    Uses the model's own per-layer hook, so parameter names (and the HF folder written
    from them) stay unchanged. Callers pass use_cache=False: a KV cache cannot be recomputed.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"{type(model).__name__} does not support gradient checkpointing; "
            "set parallelism.activation_checkpointing=false"
        )
    decoder_layers(model)
    non_reentrant = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x; the older name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=non_reentrant)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=non_reentrant)


def mixed_precision_policy(mixed_precision: str):
    """bf16: parameters all-gathered and computed in bfloat16, gradients reduced in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if mixed_precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard(model: nn.Module, group, device: str, mixed_precision: str = "none") -> nn.Module:
    """fully_shard every decoder layer, then the root; gradients are summed (not averaged) over ranks.

    Summing matches the replicated path, whose loss is already divided by the token
    count of the global mini-batch.
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = DeviceMesh.from_group(group, device_type=torch.device(device).type)
    policy = mixed_precision_policy(mixed_precision)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
    return model


def broadcast_trainable(model: nn.Module, group) -> None:
    """Every trainable parameter from the group's first rank to the others, before any sharding: all trainer ranks
    then start from the same weights (LoRA's fresh adapters are random)."""
    import torch.distributed as dist

    source = dist.get_global_rank(group, 0)
    for param in model.parameters():
        if param.requires_grad:
            dist.broadcast(param.data, src=source, group=group)


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def compute_context(device: str, mixed_precision: str, sharded: bool):
    """Autocast to bfloat16 for the replicated path; FSDP's policy casts sharded models itself."""
    if mixed_precision == "bf16" and not sharded:
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def scalar(value) -> float:
    """A Python float from a tensor or a replicated DTensor (clip_grad_norm_ returns one under FSDP)."""
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    return float(value)


def _full_options(**extra):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **extra)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the whole state dict on CPU on rank 0 of the group (empty elsewhere)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options())


def full_optimizer_state(model: nn.Module, optimizer) -> dict:
    """Collective: the optimizer state keyed by parameter name, unsharded, on CPU on rank 0 (empty elsewhere)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full_options())


def load_full_optimizer_state(model: nn.Module, optimizer, state: dict) -> None:
    """Collective for sharded models: each rank keeps its own shard of a full, name-keyed optimizer state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def load_full_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Collective for sharded models: every rank passes the same full state dict and keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))
