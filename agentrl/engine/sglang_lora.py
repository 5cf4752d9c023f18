"""Adapter-only syncs into SGLang: each version's adapters written as a PEFT folder and loaded through SGLang's LoRA
adapter API (`Engine.load_lora_adapter` / `unload_lora_adapter`; requests name it with `lora_path`).

Wired by contract (tests/unit/test_sglang_contract.py checks the calls against SGLang's source) and untested on a
GPU so far; the folder format is tested on CPU, by loading it with PEFT.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from agentrl.engine.lora_merge import is_adapter_name
from agentrl.weights.lora import adapter_checksum


def server_kwargs(lora) -> dict:
    """What `sglang.Engine` needs to take adapters of `lora` (a LoraConfig) after it started."""
    return {"enable_lora": True, "max_lora_rank": lora.rank, "lora_target_modules": list(lora.target_modules)}


def write_adapter_folder(folder: Path, named_tensors, lora, base_path: str) -> Path:
    """A PEFT adapter folder (adapter_config.json, adapter_model.safetensors) from sync-named adapter tensors."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in named_tensors:
        module, part = name.rsplit(".", 1)
        tensors[f"base_model.model.{module}.{part}.weight"] = tensor.detach().to("cpu").contiguous()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_path,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(list(lora.target_modules)),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return folder


class SGLangAdapters:
    """One version's adapters gathered bucket by bucket, then loaded into `engine` (an sglang.Engine) by name."""

    def __init__(self, engine, lora, base_path: str):
        self.engine = engine
        self.lora = lora
        self.base_path = base_path
        self.root = Path(tempfile.mkdtemp(prefix="agentrl-sglang-lora-"))
        self.pending: dict[str, torch.Tensor] = {}
        self.current: str | None = None  # the adapter name requests use
        self.loaded_checksum: int | None = None

    def take(self, named_tensors) -> None:
        for name, tensor in named_tensors:
            if not is_adapter_name(name):
                raise ValueError(
                    f"weight sync sent {name!r} to an SGLang engine that takes LoRA adapters only (model.lora is "
                    "set): the trainer and the rollout ranks disagree about model.lora; run both from one config"
                )
            self.pending[name] = tensor.detach().to("cpu", copy=True)

    def load(self, version: int) -> None:
        name = f"agentrl-v{version}"
        folder = write_adapter_folder(self.root / name, self.pending.items(), self.lora, self.base_path)
        _succeeded(self.engine.load_lora_adapter(lora_name=name, lora_path=str(folder)), "load_lora_adapter")
        previous, self.current = self.current, name
        if previous is not None:
            _succeeded(self.engine.unload_lora_adapter(lora_name=previous), "unload_lora_adapter")
            shutil.rmtree(self.root / previous, ignore_errors=True)
        self.loaded_checksum = adapter_checksum(self.pending.items())
        self.pending = {}

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _succeeded(result, what: str) -> None:
    """SGLang's LoRA calls answer an object with `success` and `error_message`; raise on failure."""
    if not getattr(result, "success", True):
        message = getattr(result, "error_message", None) or getattr(result, "message", None)
        raise RuntimeError(f"SGLang {what} failed: {message}")
