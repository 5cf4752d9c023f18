"""The trainer's model: the policy it trains (plain, or with LoRA adapters), and torch.distributed among trainer
ranks."""

from __future__ import annotations

from agentrl import transport
from agentrl.config import ModelConfig
from agentrl.errors import UserError
from agentrl.models.loading import load_causal_lm


def trainer_backend(device: str, shares_gpu: bool) -> str:
    """The trainer ranks' torch.distributed backend: NCCL where each has a GPU of its own; gloo on CPU, and where two
    share a GPU (NCCL refuses them; gloo all-reduces and broadcasts CUDA tensors through host memory)."""
    return "nccl" if device.startswith("cuda") and not shares_gpu else "gloo"


def init_trainer_group(role_comm, device: str, shares_gpu: bool = False):
    """torch.distributed among trainer ranks; the rendezvous address travels over MPI. `shares_gpu`: some of them
    are bound to one GPU (`agentrl.layout.shared_trainer_gpu`)."""
    import torch.distributed as dist

    size = role_comm.Get_size()
    if size == 1:
        return None
    host, port = transport.rendezvous_address(role_comm)
    backend = trainer_backend(device, shares_gpu)
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=role_comm.Get_rank(), world_size=size)
    return dist.group.WORLD


def load_policy(path: str, model: ModelConfig, dtype: str, device: str, prepare=None):
    """The model a trainer trains: `load_causal_lm(path)`, or with `model.lora` set, the base at `model.path`
    with adapters (fresh, or those of `path` when it is a LoRA checkpoint); only the adapters then require grad.
    `prepare(loaded)`, if given, runs on the plain model before adapters wrap it (activation checkpointing)."""
    from agentrl.models import adapters
    from agentrl.trainer import lora

    lora_config = model.lora
    adapter_checkpoint = adapters.is_adapter_folder(path) and str(path) != str(model.path)
    if lora_config is None:
        if adapter_checkpoint:
            raise UserError(
                f"{path} is a LoRA adapter checkpoint but model.lora is not set; resume it with the run's model.lora "
                "section, or export it with `agentrl export-merged` and fine-tune that"
            )
        return _prepared(load_causal_lm(path, dtype, device), prepare)
    if adapter_checkpoint:
        base = _prepared(load_causal_lm(model.path, dtype, device), prepare)
        return adapters.load_adapter_model(path, base, trainable=True)
    if path != model.path:
        raise UserError(
            f"{path} is a full-model checkpoint but model.lora is set; resume it without model.lora, or start a new "
            "run_dir for LoRA"
        )
    return lora.apply_lora(_prepared(load_causal_lm(path, dtype, device), prepare), lora_config, path)


def _prepared(model, prepare):
    if prepare is not None:
        prepare(model)
    return model
