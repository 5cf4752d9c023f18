"""Several LoRA adapters on one base model in one torch engine: each request names its adapter, and each adapted
Linear adds its rows' own adapter to the shared base weight's output.

Policies whose models are adapters on the same base (agentrl/policies/worker.py) share one `SharedBaseEngine` on a
rollout rank: one copy of the base weights, one adapter (A: r x in, B: out x r) per policy. Each policy talks to it
through its `AdapterEngine`, which tags its requests with its name (`SamplingParams.adapter`) and takes its own
weight syncs (adapters only, as agentrl/trainer/lora.py names them).

Applied per request, not merged: an adapted Linear computes x W0^T + s (x A^T) B^T, a forward hook adding the second
term for each adapter's rows of the batch (one product pair per adapter present; a batch of one adapter adds it to
every row without gathering). Turns of different policies then batch together and the base is never rewritten.
Merging into a shared base instead would rewrite every adapted weight each time the batch's policy changes, which
in a game is nearly every batch (at 100M parameters a sync with its merge took 1.9 s on CPU, docs/lora.md, against
milliseconds for a decode step), and keeping a merged copy per policy is the per-policy copy this replaces. The
extra work is r(in + out) multiply-adds per token per adapted Linear against in x out for the base product: 1.6%
at hidden size 1024 and rank 8, a quarter at the tiny models' hidden size 64.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from agentrl.engine.lora_merge import is_adapter_name
from agentrl.engine.torch_engine import TorchEngine
from agentrl.weights.lora import adapter_checksum


class Routing:
    """Which adapter each row of the running batch uses, as (adapter, rows) groups: rows None when every row of the
    batch uses that adapter; an adapter None (the base alone) is no group."""

    def __init__(self):
        self.row_adapters: list[str | None] = []
        self.groups: list[tuple[str, torch.Tensor | None]] = []

    def route(self, row_adapters: list[str | None], device: torch.device) -> None:
        self.row_adapters = list(row_adapters)
        present = list(dict.fromkeys(a for a in self.row_adapters if a is not None))
        if len(present) == 1 and None not in self.row_adapters:
            self.groups = [(present[0], None)]
            return
        self.groups = [
            (name, torch.tensor([i for i, a in enumerate(self.row_adapters) if a == name], device=device))
            for name in present
        ]

    def keep(self, keep: torch.Tensor) -> None:
        """The batch's rows are now its former rows at `keep`: the others finished, or, after a shared prefill,
        each row is a copy of the row that led its prompt's prefill."""
        device = keep.device
        self.route([self.row_adapters[i] for i in keep.tolist()], device)


class ModuleAdapters:
    """One adapted Linear's adapters, by adapter name: (A, B, scaling); a forward hook adding each group's term."""

    def __init__(self, routing: Routing):
        self.routing = routing
        self.by_adapter: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}

    def __call__(self, module, inputs, output):
        x = inputs[0]
        for name, rows in self.routing.groups:
            adapter = self.by_adapter.get(name)
            if adapter is None:
                continue  # this adapter leaves this module as the base has it
            a, b, scaling = adapter
            if rows is None:
                output.add_((x @ a.T) @ b.T, alpha=scaling)
            else:
                output.index_add_(0, rows, (x.index_select(0, rows) @ a.T) @ b.T, alpha=scaling)
        return output


class SharedBaseEngine(TorchEngine):
    """The batch scheduler over one base model, every request run with the adapter its sampling names."""

    def __init__(self, model, **kwargs):
        super().__init__(model, **kwargs)
        self.routing = Routing()
        self.modules: dict[str, ModuleAdapters] = {}  # adapted Linear's name -> its adapters (and hook)
        self.adapters: dict[str, AdapterEngine] = {}
        self._batch_versions: list[int] = []

    def adapter(self, name: str, scaling: float) -> AdapterEngine:
        """The engine policy `name` generates through: the base until its first sync brings its adapter."""
        if name in self.adapters:
            raise ValueError(f"adapter {name!r} is on this engine already")
        self.adapters[name] = AdapterEngine(self, name, scaling)
        return self.adapters[name]

    def install(self, name: str, adapters: dict[str, torch.Tensor], scaling: float) -> None:
        """Adapter `name` becomes `adapters` ({module.lora_A / module.lora_B: tensor}); modules it no longer names
        go back to the base for it. Call under the model lock."""
        linears = {n: m for n, m in self.model.named_modules() if isinstance(m, torch.nn.Linear)}
        pairs = {}
        for module in sorted({key.rsplit(".", 1)[0] for key in adapters}):
            a, b = adapters.get(module + ".lora_A"), adapters.get(module + ".lora_B")
            if a is None or b is None:
                raise ValueError(f"adapter sync for {module} brought only one of lora_A / lora_B")
            linear = linears.get(module)
            if linear is None:
                raise ValueError(
                    f"adapter {name!r} adapts {module!r}, which is no Linear module of the shared base model: the "
                    "policies sharing it must name this base in model.path (run trainer and rollout from one config)"
                )
            weight = linear.weight
            if (b.shape[0], a.shape[1]) != tuple(weight.shape) or a.shape[0] != b.shape[1]:
                raise ValueError(
                    f"{module}: lora_B {tuple(b.shape)} @ lora_A {tuple(a.shape)} does not fit its weight "
                    f"{tuple(weight.shape)}"
                )
            pairs[module] = (a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype))
        for module, held in self.modules.items():
            if module not in pairs:
                held.by_adapter.pop(name, None)
        for module, (a, b) in pairs.items():
            if module not in self.modules:
                self.modules[module] = ModuleAdapters(self.routing)
                linears[module].register_forward_hook(self.modules[module])
            self.modules[module].by_adapter[name] = (a, b, scaling)

    # the batch: routed by each request's adapter, each row's weight version its adapter's

    def _decode_batch(self, prompts, params, abort_epoch, matchers=None, futures=None):
        names = [p.adapter for p in params]
        unknown = sorted({n for n in names if n is not None and n not in self.adapters})
        if unknown:
            raise ValueError(
                f"requests name adapters {unknown}, which this engine does not hold ({list(self.adapters)})"
            )
        self.routing.route(names, self.device)
        self._batch_versions = [self.adapters[n].weight_version if n else self.weight_version for n in names]
        try:
            return super()._decode_batch(prompts, params, abort_epoch, matchers, futures)
        finally:
            self.routing.route([], self.device)

    def _rows_kept(self, keep: torch.Tensor) -> None:
        self.routing.keep(keep)

    def _run_batch(self, prompts, params, abort_epoch, matchers=None, futures=None):
        outputs = super()._run_batch(prompts, params, abort_epoch, matchers, futures)
        for output, version in zip(outputs, self._batch_versions, strict=True):
            output.weight_version = version
        return outputs

    # the base's own weights never change here: syncs go to an adapter

    def load_weights(self, named_tensors, version: int) -> None:
        raise ValueError("a shared base takes adapters only: load them through its AdapterEngine (engine.adapter)")

    def map_weights(self, named_tensors: list, version: int) -> bool:
        return False

    def base_bytes(self) -> int:
        """Bytes of the base's parameters and buffers, each storage counted once."""
        seen, total = set(), 0
        for tensor in [*self.model.parameters(), *self.model.buffers()]:
            if tensor.untyped_storage().data_ptr() not in seen:
                seen.add(tensor.untyped_storage().data_ptr())
                total += tensor.untyped_storage().nbytes()
        return total

    def adapter_bytes(self) -> int:
        return sum(
            a.numel() * a.element_size() + b.numel() * b.element_size()
            for held in self.modules.values()
            for a, b, _ in held.by_adapter.values()
        )


class AdapterEngine:
    """One policy's view of a `SharedBaseEngine`: its requests run with its adapter, its weight syncs (adapters
    only, bucket by bucket or whole) replace that adapter, and it reports its own version and checksum."""

    def __init__(self, shared: SharedBaseEngine, name: str, scaling: float):
        self.shared, self.name, self.scaling = shared, name, float(scaling)
        self.weight_version = -1
        self.loaded_checksum: int | None = None
        self.bytes_received = 0  # adapter bytes taken by syncs so far
        self._incoming: dict[str, torch.Tensor] | None = None

    @property
    def model(self):
        return self.shared.model

    async def generate(self, input_ids, sampling):
        return await self.shared.generate(input_ids, replace(sampling, adapter=self.name))

    def allow_grammars(self, tokenizer) -> bool:
        return self.shared.allow_grammars(tokenizer)

    def load_weights(self, named_tensors, version: int) -> None:
        self.begin_weight_update()
        self.load_weight_bucket(list(named_tensors.items() if hasattr(named_tensors, "items") else named_tensors))
        self.end_weight_update(version)

    def begin_weight_update(self) -> None:
        self._incoming = {}

    def load_weight_bucket(self, named_tensors: list) -> None:
        if self._incoming is None:
            raise RuntimeError("load_weight_bucket outside an update; call begin_weight_update first")
        for name, tensor in named_tensors:
            if not is_adapter_name(name):
                raise ValueError(
                    f"the weight sync of policy {self.name} sent {name!r}, a parameter trained whole: policies on a "
                    "shared base take adapters only; set model.lora.modules_to_save: [] for them, or give this "
                    "policy a model.path of its own"
                )
            self._incoming[name] = tensor.detach().clone()  # out of the transport's buffer, reused next bucket
            self.bytes_received += tensor.numel() * tensor.element_size()

    def end_weight_update(self, version: int) -> None:
        incoming, self._incoming = self._incoming, None
        if incoming is None:
            raise RuntimeError("end_weight_update without begin_weight_update")
        with self.shared._model_lock:
            self.shared.install(self.name, incoming, self.scaling)
            self.weight_version = version
        self.loaded_checksum = adapter_checksum(incoming.items())

    def abort_all(self) -> None:
        self.shared.abort_all()

    def shutdown(self) -> None:
        """The shared engine is shut down by its owner, once."""
