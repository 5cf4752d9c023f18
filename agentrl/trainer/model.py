"""Loading the policy and its tokenizer, building the tiny quickstart model, torch.distributed setup."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl import transport


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str, dtype: str = "float32", device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    return model.to(device)


def ensure_model(config, texts_for_tokenizer) -> None:
    """Build the tiny model at `model.path` if the config asks for one and it is missing."""
    path = Path(config.model.path)
    if path.exists():
        return
    if config.model.tiny is None:
        return  # a hub id, or a folder from_pretrained will complain about with its own message
    from agentrl.models.tiny import build_tiny_model

    tiny = config.model.tiny
    build_tiny_model(
        path,
        texts_for_tokenizer(),
        hidden_size=tiny.hidden_size,
        num_layers=tiny.num_layers,
        num_heads=tiny.num_heads,
        vocab_size=tiny.vocab_size,
        seed=tiny.seed,
    )


def init_trainer_group(role_comm, device: str):
    """torch.distributed among trainer ranks; the rendezvous address travels over MPI."""
    import torch.distributed as dist

    size = role_comm.Get_size()
    if size == 1:
        return None
    host, port = transport.rendezvous_address(role_comm)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=role_comm.Get_rank(), world_size=size)
    return dist.group.WORLD
