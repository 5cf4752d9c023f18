"""LoRA adapters on the policy (PEFT): wrap a model, name its adapter tensors for syncs (adapter folders are read
by agentrl/models/adapters.py).

A sync names each adapter tensor after the base weight it adapts: `model.layers.0.self_attn.q_proj.lora_A`
and `...q_proj.lora_B` for the weight `model.layers.0.self_attn.q_proj.weight` (agentrl/engine/lora_merge.py
merges them there).
"""

from __future__ import annotations

import re

import torch

from agentrl.errors import UserError
from agentrl.models.adapters import base_folder, peft_names

PEFT_PARAM = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.(?P<part>lora_A|lora_B)\.default\.weight$")
SAVED_PARAM = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.modules_to_save\.default\.(?P<param>\w+)$")


def module_names(model: torch.nn.Module) -> list[str]:
    """The distinct last parts of the model's Linear module names (what target_modules usually lists)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def check_targets(model: torch.nn.Module, targets: list[str], saved: list[str] = ()) -> None:
    """Every target names at least one Linear module, every module to save at least one module (by its last part
    or its full dotted name)."""
    linear = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    unmatched = [t for t in targets if not any(name == t or name.endswith("." + t) for name in linear)]
    if unmatched:
        raise UserError(
            f"model.lora.target_modules {unmatched} match no Linear module of this model; its Linear modules are "
            f"named {module_names(model)}: set model.lora.target_modules to some of those"
        )
    tied = _tied_modules(model, (torch.nn.Linear,))  # a tied output head
    tied_targets = sorted(n for n in tied if any(n == t or n.endswith("." + t) for t in targets))
    if tied_targets:
        raise UserError(
            f"model.lora.target_modules adapts {tied_targets}, whose weight is tied to another (the input "
            "embedding): a merged adapter would change both; leave them out of model.lora.target_modules"
        )
    every = [name for name, _ in model.named_modules() if name]
    unmatched = [t for t in saved if not any(name == t or name.endswith(t) for name in every)]
    if unmatched:
        names = sorted({name.rsplit(".", 1)[-1] for name in every})
        raise UserError(
            f"model.lora.modules_to_save {unmatched} match no module of this model; its modules are named {names}: "
            "set model.lora.modules_to_save to some of those"
        )


def _tied_modules(model: torch.nn.Module, kinds: tuple[type, ...]) -> list[str]:
    """Modules of `kinds` whose weight shares its storage with another parameter."""
    owners: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        owners[param.data_ptr()] = owners.get(param.data_ptr(), 0) + 1
    return [
        name for name, m in model.named_modules() if isinstance(m, kinds) and owners.get(m.weight.data_ptr(), 0) > 1
    ]


def apply_lora(model: torch.nn.Module, lora, base_path: str) -> torch.nn.Module:
    """`model` with fresh adapters (B = 0: the same outputs as the base); only the adapters require grad."""
    LoraConfig, get_peft_model = peft_names("LoraConfig", "get_peft_model")

    check_targets(model, list(lora.target_modules), list(lora.modules_to_save))
    peft_config = LoraConfig(
        ensure_weight_tying=saves_tied_weight(model, list(lora.modules_to_save)),
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        modules_to_save=list(lora.modules_to_save) or None,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model.name_or_path = base_folder(base_path)  # what PEFT records as the checkpoint's base
    wrapped = get_peft_model(model, peft_config)
    wrapped.peft_config["default"].base_model_name_or_path = model.name_or_path
    return wrapped


def saves_tied_weight(model: torch.nn.Module, saved: list[str]) -> bool:
    """Whether modules_to_save names a module whose weight is tied to another (the embedding of a model with a
    tied output head): PEFT must then train one copy for both, or the head would stay the frozen original."""
    tied = _tied_modules(model, (torch.nn.Linear, torch.nn.Embedding))
    return any(name == t or name.endswith("." + t) for name in tied for t in saved)


def adapter_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(sync name, tensor) of every adapter tensor, in the model's order (what an adapter sync sends); a module
    trained whole (modules_to_save) goes by its own parameter names."""
    named = []
    for name, param in model.named_parameters():
        if match := PEFT_PARAM.match(name):
            named.append((f"{match['module']}.{match['part']}", param.detach()))
        elif (match := SAVED_PARAM.match(name)) and param.requires_grad:
            named.append((f"{match['module']}.{match['param']}", param.detach()))
    if not named:
        raise ValueError("the model has no LoRA adapter tensors (lora_A / lora_B): was apply_lora called?")
    return named


def adapter_nbytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for _, t in adapter_weights(model))
