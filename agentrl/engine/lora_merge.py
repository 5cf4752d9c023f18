"""The torch engine's side of adapter-only syncs: merge W = W0 + scale * B @ A into each adapted weight.

An adapter sync brings `<module>.lora_A` and `<module>.lora_B` for some Linear modules (names from
agentrl/trainer/lora.py). The first time a module is adapted its weight W0 is kept aside (the base); every
version merges from that base, never from the previous merge, so rounding does not pile up over versions and
the engine's weights are exactly what the trainer's adapters mean. Merging (one r-rank product per adapted
weight per sync) keeps generation at the plain model's speed: running the adapter path instead would add two
small matrix products per adapted module to every decode step and undo the lean decoder's fused projections.
"""

from __future__ import annotations

import torch

from agentrl.weights.lora import adapter_checksum

SUFFIXES = (".lora_A", ".lora_B")


def is_adapter_name(name: str) -> bool:
    return name.endswith(SUFFIXES)


class LoraMerge:
    """Adapters received for one version, merged into `model` at its end; the base weights kept aside."""

    def __init__(self, model: torch.nn.Module, scaling: float):
        self.model = model
        self.scaling = float(scaling)
        self.base: dict[str, torch.Tensor] = {}  # weight name -> W0 (float32 copy)
        self.adapters: dict[str, torch.Tensor] = {}  # adapter name -> its tensor, copied out of the transport
        self.whole: dict[str, torch.Tensor] = {}  # parameters trained whole (model.lora.modules_to_save)
        self.loaded_checksum: int | None = None

    def take(self, named_tensors) -> None:
        """Copy adapter tensors (and parameters trained whole) out of the transport's buffer (reused for the next
        bucket)."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        for name, tensor in named_tensors:
            if not is_adapter_name(name):
                if name not in params:
                    raise ValueError(
                        f"weight sync sent {name!r}, which the rollout model does not have: the trainer and the "
                        "rollout ranks disagree about model.lora or model.path; run both from the same config"
                    )
                self.whole[name] = tensor.detach().clone()
                continue
            weight = name.rsplit(".", 1)[0] + ".weight"
            if weight not in params:
                raise ValueError(f"adapter {name!r} adapts {weight!r}, which the rollout model does not have")
            self.adapters[name] = tensor.detach().clone()

    def merge(self) -> None:
        """Every adapted weight becomes base + scaling * B @ A (in float32, cast to the weight's dtype)."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        modules = sorted({name.rsplit(".", 1)[0] for name in self.adapters})
        for module in modules:
            a, b = self.adapters.get(module + ".lora_A"), self.adapters.get(module + ".lora_B")
            if a is None or b is None:
                raise ValueError(f"adapter sync for {module} brought only one of lora_A / lora_B")
            weight = params[module + ".weight"]
            if (b.shape[0], a.shape[1]) != tuple(weight.shape) or a.shape[0] != b.shape[1]:
                raise ValueError(
                    f"{module}: lora_B {tuple(b.shape)} @ lora_A {tuple(a.shape)} does not fit its weight "
                    f"{tuple(weight.shape)}"
                )
            base = self.base.get(module)
            if base is None:
                base = self.base[module] = weight.detach().to(torch.float32, copy=True)
            b, a = b.to(weight.device, torch.float32), a.to(weight.device, torch.float32)
            with torch.no_grad():
                if weight.dtype == torch.float32:  # one fused pass, straight into the weight
                    torch.addmm(base, b, a, alpha=self.scaling, out=weight.data)
                else:
                    weight.copy_(torch.addmm(base, b, a, alpha=self.scaling))
        with torch.no_grad():
            for name, tensor in self.whole.items():
                params[name].copy_(tensor)
        self.loaded_checksum = adapter_checksum([*self.adapters.items(), *self.whole.items()])
