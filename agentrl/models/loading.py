"""Loading the policy and its tokenizer, building the tiny quickstart model, torch.distributed setup."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from agentrl import transport
from agentrl.config import ModelConfig
from agentrl.errors import UserError
from agentrl.models.hub import refuse_missing_model


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str, dtype: str = "float32", device: str = "cpu"):
    """A plain causal LM; a LoRA adapter folder (a LoRA run's checkpoint) loads its recorded base, merged."""
    from transformers import AutoModelForCausalLM

    from agentrl.trainer import lora

    if lora.is_adapter_folder(path):
        base = AutoModelForCausalLM.from_pretrained(lora.recorded_base(path), dtype=getattr(torch, dtype))
        return lora.load_adapter_model(path, base).to(device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    return model.to(device)


def import_model_code() -> None:
    """Import the code that loading a causal LM and its tokenizer runs: seconds of CPU per process (transformers
    scans its model folders and pulls in torch.distributed.tensor and dynamo), spent by every model-loading rank
    side by side before rank 0 checks the model, instead of by rank 0 alone while the others wait."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401


TINY_RECORD = "agentrl_tiny.json"  # the model.tiny section a folder was built from


def ensure_model(model: ModelConfig, texts_for_tokenizer) -> None:
    """Build the tiny model at `model.path` if `model.tiny` asks for one and it is missing; else check it loads,
    and that a tiny model built there earlier was built from the same `model.tiny`.

    Runs on rank 0 before any other rank loads the model, so a wrong `model.path` is one
    message instead of a traceback per rank (and a hub model is downloaded once).
    """
    path = Path(model.path)
    refuse_missing_model(model)
    if path.exists() or model.tiny is None:
        _check_loadable(model.path)
        if model.tiny is not None:
            _check_tiny_record(path, model.tiny)
        return
    from agentrl.models.tiny import build_tiny_model

    tiny = model.tiny
    build_tiny_model(
        path,
        texts_for_tokenizer(),
        hidden_size=tiny.hidden_size,
        num_layers=tiny.num_layers,
        num_heads=tiny.num_heads,
        vocab_size=tiny.vocab_size,
        seed=tiny.seed,
        init_std=tiny.init_std,
        output_scale=tiny.output_scale,
    )
    (path / TINY_RECORD).write_text(json.dumps(tiny.model_dump(), indent=1) + "\n")


def _check_tiny_record(path: Path, tiny) -> None:
    """A folder built from another model.tiny would otherwise be used as it is, silently keeping its old weights."""
    record = path / TINY_RECORD
    if not record.is_file():
        return  # not built by `agentrl` from a model.tiny section: the user's own folder, used as it is
    built = json.loads(record.read_text())
    wanted = tiny.model_dump()
    defaults = type(tiny)().model_dump()  # a field added since the folder was built had its default then
    differ = [
        f"{key}: {built.get(key, defaults[key])} there, {value} in the config"
        for key, value in wanted.items()
        if built.get(key, defaults[key]) != value
    ]
    if differ:
        raise UserError(
            f"model.path={path} holds a tiny model built from another model.tiny ({'; '.join(differ)}); set "
            f"model.path to a new folder (the model is built there on first use), or delete {path} to rebuild it"
        )


def _check_loadable(path: str) -> None:
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as error:
        where = "the folder" if Path(path).exists() else "it as a hub id, which"
        raise UserError(
            f"model.path={path} cannot be loaded ({str(error).splitlines()[0]}); check {where} holds a "
            "Hugging Face model (config.json, weights, tokenizer)"
        ) from None


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
    from agentrl.trainer import lora

    lora_config = model.lora
    adapter_checkpoint = lora.is_adapter_folder(path) and str(path) != str(model.path)
    if lora_config is None:
        if adapter_checkpoint:
            raise UserError(
                f"{path} is a LoRA adapter checkpoint but model.lora is not set; resume it with the run's model.lora "
                "section, or export it with `agentrl export-merged` and fine-tune that"
            )
        return _prepared(load_causal_lm(path, dtype, device), prepare)
    if adapter_checkpoint:
        base = _prepared(load_causal_lm(model.path, dtype, device), prepare)
        return lora.load_adapter_model(path, base, trainable=True)
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
