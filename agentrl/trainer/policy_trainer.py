"""One training step of the policy on this trainer rank's shard of the batch; the algorithm supplies the math.

The algorithm (agentrl/algorithms/) turns the batch into per-token advantages and a
micro-batch's log-probs into a loss; this module does everything that is the same for
all of them: micro-batches (forwarded as whole rows, or with each group's shared prefix once:
`trainer.shared_prefix`, agentrl/trainer/shared_prefix.py), the old policy's log-probs when asked, the frozen reference,
gradient sync and clipping, the optimizer, and skipping an update whose loss or gradient norm
is not finite (agentrl/trainer/nonfinite.py). Losses are normalised by global counts of the
whole mini-batch and gradients are summed over trainer ranks: by hand (one flattened
all-reduce) when every rank holds the whole model, or by FSDP2's reduce-scatter when
`parallelism.fsdp` shards it (see agentrl/trainer/parallel.py). Either way every rank
ends each step with the weights one rank would have after training on the whole batch.

Models an algorithm trains beside the policy (`Algorithm.extra_models`, e.g. PPO's critic)
get the same treatment: placed and sharded like the policy, run in every micro-batch,
gradients synced, clipped and stepped with their own optimizers, checkpointed through
`extra_state`. The trainer knows them only by name.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from agentrl import transport
from agentrl.algorithms.base import Algorithm, ExtraModel, LossInputs, Prepared, Reduce, valid_episodes
from agentrl.config import (
    ConfigError,
    LRSchedulerConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelismConfig,
    TrainerConfig,
)
from agentrl.models.loading import load_causal_lm
from agentrl.trainer import checkpoint, parallel, shared_prefix
from agentrl.trainer.lean_forward import LeanForward
from agentrl.trainer.model import load_policy
from agentrl.trainer.nonfinite import NonFiniteGuard, all_finite
from agentrl.trainer.optim import build_optimizer, build_scheduler
from agentrl.trainer.token_logits import TokenLogits, kept_positions
from agentrl.trajectory import num_episodes, token_totals, trained_tokens

STATS = "trainer/"  # the step's statistics' names in their sum, apart from the numbers that ride it


@dataclass(frozen=True)
class PolicySections:
    """What a PolicyTrainer reads of the config: the `model`, `trainer`, `optimizer`, `lr_scheduler` and
    `parallelism` sections; of `rollout` the sampling `temperature` (log-probs are of logits / temperature); and
    the run's `steps` (the learning-rate schedule spans steps x trainer.updates_per_step optimizer steps)."""

    model: ModelConfig
    trainer: TrainerConfig
    optimizer: OptimizerConfig
    lr_scheduler: LRSchedulerConfig
    parallelism: ParallelismConfig
    temperature: float
    steps: int

    @classmethod
    def of(cls, config) -> PolicySections:
        return cls(
            config.model,
            config.trainer,
            config.optimizer,
            config.lr_scheduler,
            config.parallelism,
            config.rollout.temperature,
            config.steps,
        )


class PolicyTrainer:
    """Trains the policy of `weights_path` on `device`, among the trainer ranks of `group` (None: alone).

    It takes the sections it reads (`PolicySections`), not the whole config, and `algorithm`, which builds the
    algorithm given the sum over trainer ranks (`agentrl.algorithms.algorithm_of`: the config's `algorithm`).
    """

    def __init__(
        self,
        weights_path: str,
        device: str,
        group,
        sections: PolicySections,
        algorithm: Callable[[Reduce], Algorithm],
        comm=None,
    ):
        model, trainer, optimizer = sections.model, sections.trainer, sections.optimizer
        self.model_config = model
        self.micro_batch_size, self.updates_per_step = trainer.micro_batch_size, trainer.updates_per_step
        self.nonfinite = NonFiniteGuard(trainer.max_skipped_nonfinite, announce=_leads(group))
        self.max_grad_norm = optimizer.max_grad_norm
        self.temperature = sections.temperature
        self.device = device
        self.group = group  # torch.distributed group of trainer ranks, None when alone
        self.parallelism = sections.parallelism
        if self.parallelism.fsdp and group is None:
            raise ConfigError(
                "parallelism.fsdp=true needs at least 2 trainer ranks (layout.trainer); with one trainer rank there "
                "is nothing to shard: set parallelism.fsdp=false (parallelism.mixed_precision=bf16 then uses autocast)"
            )
        self.sharded = self.parallelism.fsdp
        # the trainer ranks' MPI communicator: on CPU without FSDP (whose collectives go over the torch group) the
        # trainer's sums go over it (shared memory on a node, polled; gloo's TCP is several times slower)
        self.sum_comm = comm if group is not None and device == "cpu" and not self.sharded else None
        self.comm = comm
        # the names of the step's sums every rank held at the last gather of them: then they ride the gradient sum
        self._agreed_names: tuple[str, ...] | None = None
        self.ridden: np.ndarray | None = None
        self.summed_grads: tuple[list, torch.Tensor] | None = None  # params whose grads `_sync_gradients` made flat
        self.algorithm = algorithm(self._reduce)
        self.model = self._load(weights_path)
        self.model.train()
        self.reference = None
        if self.algorithm.needs_reference:
            self.reference = self._load(model.path, reference=True).eval()
        self.shared_prefix = trainer.shared_prefix
        self.prefix_positions = np.zeros(2)  # this step's policy forwards: positions computed, and whole rows'
        self.announced_whole_rows = False
        if self.shared_prefix:
            self.prefix_layouts = shared_prefix.check_model(self.model)
            self.pair_cost = shared_prefix.pair_cost(self.model)
        # by id(model), the policy's and the reference's; not under FSDP or activation checkpointing, whose hooks
        # are on the decoder layers the lean forward does not call
        self.lean_forwards: dict[int, LeanForward | None] = {}
        if not self.sharded and not self.parallelism.activation_checkpointing:
            for module in (self.model, self.reference):
                if module is not None:
                    self.lean_forwards[id(module)] = LeanForward.for_model(module)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.params, optimizer)
        self.scheduler = build_scheduler(
            self.optimizer, sections.lr_scheduler, sections.steps * trainer.updates_per_step
        )
        self.extras: list[ExtraModel] = self.algorithm.extra_models(self._place)
        for extra in self.extras:
            extra.module.train()

    @property
    def extra_state(self) -> list[checkpoint.ExtraModelState]:
        """What checkpoint.save/load_state keep beside the policy: the algorithm's extra models."""
        return [checkpoint.ExtraModelState(extra) for extra in self.extras]

    def _place(self, module: torch.nn.Module) -> torch.nn.Module:
        """An algorithm's extra model onto this trainer's device and dtype, checkpointed and sharded as the policy."""
        dtype = "float32" if self.parallelism.mixed_precision == "bf16" else self.model_config.dtype
        module = module.to(device=self.device, dtype=getattr(torch, dtype))
        if self.parallelism.activation_checkpointing:
            parallel.enable_activation_checkpointing(getattr(module, "base_model", module))
        if self.sharded:
            parallel.shard(module, self.group, self.device, self.parallelism.mixed_precision)
        return module

    def _load(self, path: str, reference: bool = False):
        """The policy (or the frozen KL reference), checkpointed and sharded as the config asks.

        With mixed_precision=bf16 the weights stay float32 (master weights) whatever model.dtype
        says; model.dtype then only sets the rollout engine's dtype.
        """
        dtype = "float32" if self.parallelism.mixed_precision == "bf16" else self.model_config.dtype
        if reference:
            model = load_causal_lm(path, dtype, self.device)
            model.requires_grad_(False)
        else:
            prepare = parallel.enable_activation_checkpointing if self.parallelism.activation_checkpointing else None
            model = load_policy(path, self.model_config, dtype, self.device, prepare)
            if self.model_config.lora is not None and self.group is not None:
                parallel.broadcast_trainable(model, self.group)  # fresh adapters: drawn from each rank's own seed
        if self.sharded:
            parallel.shard(model, self.group, self.device, self.parallelism.mixed_precision)
        return model

    def named_weights(self):
        """(name, tensor) in a fixed order; DTensor shards under FSDP (weights.full_tensors gathers them).
        With model.lora, only the adapter tensors (agentrl/trainer/lora.py names them)."""
        if self.model_config.lora is not None:
            from agentrl.trainer.lora import adapter_weights

            return adapter_weights(self.model)
        return [(name, p.detach()) for name, p in self.model.named_parameters()]

    def _allreduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over trainer ranks, returned on the tensor's own device (NCCL reduces only GPU tensors)."""
        if self.sum_comm is not None:  # bfloat16 (model.dtype) has no numpy or MPI type: summed in float32
            wide = tensor.detach().float() if tensor.dtype == torch.bfloat16 else tensor.detach()
            summed = transport.allreduce_sum(self.sum_comm, wide.contiguous().numpy())
            return torch.from_numpy(summed).to(tensor.dtype)
        if self.group is not None:
            import torch.distributed as dist

            on_device = tensor.to(self.device)
            dist.all_reduce(on_device, group=self.group)
            tensor = on_device.to(tensor.device)
        return tensor

    def _reduce(self, array: np.ndarray) -> np.ndarray:
        """Sum a float64 array over trainer ranks: what algorithms use for global-batch statistics."""
        return self._allreduce(torch.from_numpy(np.asarray(array, dtype=np.float64).copy())).numpy()

    def _sync_gradients(self, params, vote: bool | None = None, ride: np.ndarray | None = None) -> bool | None:
        """Sum the gradients over trainer ranks. `vote`: this rank's flag, summed in the same collective (one
        element after the gradients); returns whether any rank raised it, or None where no sum runs (one rank, or
        sharded: the caller then votes on its own). `ride` (from `_riders`): numbers summed in the same collective,
        after the flag; their sums are left in `self.ridden`."""
        if self.group is None or self.sharded:
            return None
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        dtype, device = grads[0].dtype, grads[0].device
        flags = [] if vote is None else [torch.tensor([float(vote)], dtype=dtype, device=device)]
        riders = [] if ride is None else [torch.from_numpy(ride).to(dtype)]
        flat = self._allreduce(torch.cat([g.reshape(-1) for g in grads] + flags + riders))
        offset = 0
        for param, grad in zip(params, grads, strict=True):
            param.grad = flat[offset : offset + grad.numel()].view_as(param)
            offset += grad.numel()
        self.summed_grads = (params, flat[:offset])
        if ride is not None:
            self.ridden = flat[offset + len(flags) :].double().numpy()
        return None if vote is None else bool(flat[offset] > 0)

    def _riders(self, named: dict[str, float]) -> np.ndarray | None:
        """`named` laid out to ride the gradient sum: the names every rank summed last time, in their order, then
        1 if this rank has exactly those names (the sums then stand for `_sum_named`'s where every rank has); None
        where they cannot ride: no names agreed yet, or a sum that is not MPI's over float32 gradients."""
        if self._agreed_names is None or self.sum_comm is None or self.params[0].dtype != torch.float32:
            return None
        values = np.zeros(len(self._agreed_names) + 1)
        if len(named) == len(self._agreed_names) and all(name in named for name in self._agreed_names):
            values[:-1] = [named[name] for name in self._agreed_names]
            values[-1] = 1.0
        return values

    def _ridden_sums(self) -> dict[str, float] | None:
        """The named sums that rode the gradient sum, where every rank had the agreed names; None otherwise."""
        ridden, self.ridden = self.ridden, None
        if ridden is None or ridden[-1] != self.sum_comm.Get_size():
            return None
        return dict(zip(self._agreed_names, ridden[:-1].tolist(), strict=True))

    def train_step(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """Advantages, then `updates_per_step` optimizer steps over the shard; returns global sums/means
        (`train_and_sum` without more numbers to sum)."""
        return self.train_and_sum(batch, {})[0]

    def train_and_sum(
        self, batch: dict[str, np.ndarray], more: dict[str, float], step_trained: np.ndarray | None = None
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Advantages, then `updates_per_step` optimizer steps over the shard: (the step's metrics, global
        sums/means; `more`'s totals over the trainer ranks, summed in the same collective as the metrics, a name
        some rank lacks counting as 0 there: a training loop's own sums ride it instead of a collective of their
        own).

        `step_trained`: where the caller knows them, the tokens and episodes entering the loss over every trainer
        rank's shard (`trajectory.trained_totals` summed, sent along with the shards); with one update a step
        they are the loss's denominators, and no sum over the ranks runs for them. Every trainer rank passes them,
        or none does.

        Shards may differ in size between ranks and steps (dynamic sampling), down to none: an empty
        shard trains on one placeholder episode that carries no trained token, so this rank still runs
        the same collectives and reports the same stat names. A mini-batch with no trained token on any
        rank takes no optimizer or scheduler step (AdamW's momentum would move the weights on no data),
        nor does one whose loss or gradient norm is not finite on any rank (`train/skipped_nonfinite`).
        """
        if num_episodes(batch) == 0:
            batch = _placeholder_batch()
        n = num_episodes(batch)
        valid = valid_episodes(batch)
        self.prefix_positions[:] = 0
        prepared = self.algorithm.prepare(batch, valid, lambda name: self._extra_outputs(batch, name))
        advantages = self.algorithm.advantages(batch, valid)
        old_logp = batch["logprobs"]  # the rollout's own (correction.mode none): the old policy is mu
        if self.algorithm.needs_old_logprobs:  # None: each micro-batch's own forward is the old policy (see below)
            old_logp = self._old_logprobs(batch) if self._recomputes_old_logprobs() else None
        micro_size = self.micro_batch_size
        sums: dict[str, float] = {}
        grad_norms = []
        extra_norms: dict[str, list[float]] = {extra.name: [] for extra in self.extras}
        skipped = 0
        tokens_of = trained_tokens(batch)
        for update, minibatch in enumerate(np.array_split(np.arange(n), self.updates_per_step)):
            micro_steps = self._agreed_micro_steps(math.ceil(len(minibatch) / micro_size))
            if step_trained is not None and self.updates_per_step == 1:
                global_tokens, global_sequences = (float(x) for x in step_trained)
            else:
                counts = torch.from_numpy(token_totals(tokens_of[minibatch]))
                global_tokens, global_sequences = self._allreduce(counts).tolist()
            self.optimizer.zero_grad(set_to_none=True)
            for extra in self.extras:
                extra.optimizer.zero_grad(set_to_none=True)
            starts = range(0, len(minibatch), micro_size)
            update_loss = 0.0
            for start in starts:
                micro = minibatch[start : start + micro_size]
                step_stats, micro_loss = self._micro_step(
                    batch,
                    micro,
                    advantages,
                    old_logp,
                    max(global_tokens, 1.0),
                    max(global_sequences, 1.0),
                    update,
                    prepared,
                )
                update_loss += micro_loss
                for key, value in step_stats.items():
                    sums[key] = sums.get(key, 0.0) + value
            for _ in range(micro_steps - len(starts)):
                self._idle_micro_step()
            # a loss not finite on any rank skips the update on all: voted in the gradient sum where one runs; the
            # step's named sums ride the last update's
            ride = None
            if update == self.updates_per_step - 1:
                named = self._named_sums(sums, batch, valid, advantages, more)
                ride = self._riders(named)
            loss_vote = self._sync_gradients(self.params, vote=not all_finite(update_loss), ride=ride)
            norms = {"grad_norm": self._clipped_norm(self.params, self.max_grad_norm)}
            for extra in self.extras:  # as the policy: synced and clipped every time, stepped with it
                params = [p for p in extra.module.parameters() if p.requires_grad]
                self._sync_gradients(params)
                norms[f"{extra.name}_grad_norm"] = self._clipped_norm(params, extra.max_grad_norm)
                extra_norms[extra.name].append(norms[f"{extra.name}_grad_norm"])
            grad_norms.append(norms["grad_norm"])
            if loss_vote is None:
                skip = self._any_rank(not all_finite(update_loss, *norms.values()))
            else:  # the norms are of the summed gradients: alike on every rank
                skip = loss_vote or not all_finite(*norms.values())
            if skip:  # nothing of this update reaches the weights or the optimizer state
                self.optimizer.zero_grad(set_to_none=True)
                for extra in self.extras:
                    extra.optimizer.zero_grad(set_to_none=True)
                skipped += 1
            elif global_tokens > 0:
                self.optimizer.step()
                self.scheduler.step()
                for extra in self.extras:
                    extra.optimizer.step()
            self.nonfinite.record(skip, update_loss, norms)
        totals = self._ridden_sums()
        if totals is None:  # one collective more: a gather of the names, which every rank then agrees on
            totals = self._sum_named(named)
            self._agreed_names = tuple(sorted(totals))
        sums = {k[len(STATS) :]: totals.pop(k) for k in list(totals) if k.startswith(STATS)}
        abs_sum, abs_count = sums.pop("adv_abs_sum"), sums.pop("adv_abs_count")
        prefix = (sums.pop("prefix_computed"), sums.pop("prefix_whole")) if self.shared_prefix else None
        count = max(sums.pop("tokens"), 1.0)
        first_count = max(sums.pop("first_update_tokens"), 1.0)
        metrics = {}
        for key, value in sums.items():
            denominator = first_count if key.startswith("mismatch_") else count
            metrics[f"train/{key}"] = value / denominator
        metrics["train/loss"] = metrics.pop("train/loss_sum")
        metrics["train/grad_norm"] = float(np.mean(grad_norms))
        metrics["train/skipped_nonfinite"] = float(skipped)
        metrics["train/lr"] = self.scheduler.get_last_lr()[0]
        for name, norms in extra_norms.items():
            metrics[f"train/{name}_grad_norm"] = float(np.mean(norms))
        metrics.update({f"train/{key}": value for key, value in prepared.metrics.items()})
        metrics["train/adv_abs_mean"] = abs_sum / max(abs_count, 1.0)
        if prefix is not None:
            metrics["train/shared_prefix_positions"] = prefix[0] / max(prefix[1], 1.0)
        return metrics, totals

    def _named_sums(self, sums: dict, batch: dict, valid: np.ndarray, advantages: np.ndarray, more: dict) -> dict:
        """This rank's numbers of the step to be summed over the trainer ranks by name: the loss's statistics
        (`sums`, under STATS), the advantages' and the shared prefixes' counts, and the caller's `more`."""
        trained_mask = batch["loss_mask"].astype(bool) & np.repeat(valid, np.diff(batch["offsets"]))
        sums = {
            **sums,
            "adv_abs_sum": float(np.abs(advantages[trained_mask]).sum()),
            "adv_abs_count": float(trained_mask.sum()),
        }
        if self.shared_prefix:
            sums["prefix_computed"], sums["prefix_whole"] = (float(x) for x in self.prefix_positions)
        return {**{STATS + k: v for k, v in sums.items()}, **more}

    def _sum_named(self, values: dict[str, float]) -> dict[str, float]:
        """Named numbers summed over the trainer ranks, a name some rank lacks counting as 0 there: one gather over
        their MPI communicator. Without one (a torch group alone), only names every rank holds (the step's own
        statistics) can be summed."""
        if self.comm is not None:
            return transport.allreduce_named(self.comm, values)
        names = sorted(values)
        totals = self._allreduce(torch.tensor([values[k] for k in names], dtype=torch.float64)).tolist()
        return dict(zip(names, totals, strict=True))

    def _clipped_norm(self, params, max_norm: float) -> float:
        """Clip the gradients to `max_norm`; their norm before clipping. Gradients just summed into one flat tensor
        (`_sync_gradients`) are measured and scaled as that one tensor, as clip_grad_norm_ does tensor by tensor."""
        summed, self.summed_grads = self.summed_grads, None
        if summed is None or summed[0] is not params:
            return parallel.scalar(torch.nn.utils.clip_grad_norm_(params, max_norm))
        flat = summed[1]
        norm = torch.linalg.vector_norm(flat)
        flat.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return float(norm)

    def _any_rank(self, flag: bool) -> bool:
        """Whether `flag` is true on any trainer rank: a decision every rank then takes alike."""
        return bool(self._allreduce(torch.tensor([float(flag)], dtype=torch.float64)).item() > 0)

    def _lr_scale(self) -> float:
        """The scheduler's factor at this step (lr / peak lr)."""
        peak = self.scheduler.base_lrs[0]
        return self.scheduler.get_last_lr()[0] / peak if peak else 1.0

    def _agreed_micro_steps(self, mine: int) -> int:
        """Sharded: forward/backward passes are collectives, so every rank runs the most any rank needs."""
        if not self.sharded:
            return mine
        import torch.distributed as dist

        most = torch.tensor([mine], dtype=torch.int64, device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self.group)
        return int(most.item())

    def _idle_micro_step(self) -> None:
        """A forward/backward on one token with zero loss: joins FSDP's gathers and reductions, adds no gradient."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        with self._compute():
            logits = self.model(input_ids=ids, use_cache=False).logits
            outputs = [extra.module(input_ids=ids) for extra in self.extras]  # the order of _micro_step's forwards
            if self.reference is not None:
                with torch.no_grad():
                    self.reference(input_ids=ids, use_cache=False)
        zero = logits.float().sum() * 0.0
        for output in outputs:
            zero = zero + output.float().sum() * 0.0
        zero.backward()

    def _compute(self):
        return parallel.compute_context(self.device, self.parallelism.mixed_precision, self.sharded)

    def _recomputes_old_logprobs(self) -> bool:
        """Whether the old policy's log-probs take a forward of their own. With one update a step the weights do not
        move before every micro-batch has been forwarded, so each micro-batch's forward, detached, is the old policy
        itself: no extra forward."""
        return self.updates_per_step > 1

    def _old_logprobs(self, batch) -> np.ndarray:
        """The policy's own log-probs of the trained tokens before this step's updates (flat, like batch["logprobs"];
        at other tokens another position's, as the loss's own, which it reads through the mask)."""
        temperature = self.temperature

        def logprobs(ids, attention, prefix_layout, trained):
            with self._compute():
                flat, index = self._position_logits(self.model, ids, attention, prefix_layout, trained)
            return TokenLogits(flat, index, temperature).logprobs(ids[:, 1:])

        return self._per_token(batch, logprobs, lambda ids: self.model(input_ids=ids, use_cache=False), shared=True)

    def _extra_outputs(self, batch, name: str) -> np.ndarray:
        """`prepare`'s forward: extra model `name` over this rank's shard, before the step's updates (flat)."""
        found = [extra for extra in self.extras if extra.name == name]
        if not found:
            known = ", ".join(extra.name for extra in self.extras) or "none"
            raise KeyError(f"prepare asked for extra model {name!r}; extra_models returned: {known}")
        module = found[0].module

        def outputs(ids, attention, prefix_layout, trained):  # every position's: an extra model's output is per token
            with self._compute():
                return module(input_ids=ids, attention_mask=attention)[:, :-1].float()

        return self._per_token(batch, outputs, lambda ids: module(input_ids=ids))

    @torch.no_grad()
    def _per_token(self, batch, compute, idle, shared: bool = False) -> np.ndarray:
        """compute(ids, attention, prefix layout, trained) -> (B, T-1) per micro-batch, flattened like
        batch["logprobs"] (0 at first tokens); `trained` (B, T-1) bool: the tokens the loss trains.

        The prefix layout (`shared_prefix.prepare`) is None unless `shared` (the policy's own forward) and
        trainer.shared_prefix found a plan. Sharded, every rank runs as many forwards as the busiest one: `idle(ids)`
        on one token.
        """
        out = np.zeros(len(batch["tokens"]), dtype=np.float32)
        n = num_episodes(batch)
        micro_size = self.micro_batch_size
        starts = range(0, n, micro_size)
        offsets = batch["offsets"]
        agreed = self._agreed_micro_steps(len(starts))  # before any forward: under FSDP forwards are collectives
        for start in starts:
            episodes = np.arange(start, min(n, start + micro_size))
            ids, attention, lengths = _rows(batch, episodes, "tokens", torch.long)
            prefix_layout = self._prefix_layout(batch, episodes, ids, lengths) if shared else None
            ids, attention = ids.to(self.device), attention.to(self.device)
            trained = _rows(batch, episodes, "loss_mask", torch.bool)[0][:, 1:].to(self.device)
            values = compute(ids, attention, prefix_layout, trained).cpu().numpy()
            predicted = _inside(np.asarray(lengths) - 1)  # position t predicts token t + 1
            columns = np.arange(predicted.shape[1])
            out[(offsets[episodes][:, None] + 1 + columns)[predicted]] = values[:, : predicted.shape[1]][predicted]
        for _ in range(agreed - len(starts)):
            with self._compute():
                idle(torch.zeros(1, 1, dtype=torch.long, device=self.device))
        return out

    def _prefix_layout(self, batch, episodes, ids: torch.Tensor, lengths: list[int]):
        """With trainer.shared_prefix, the micro-batch's rows laid out to share their groups' prefixes
        (`shared_prefix.prepare`; None: whole rows); counted in `prefix_positions`."""
        if not self.shared_prefix:
            return None
        groups = batch["group"][np.asarray(episodes)]
        found = shared_prefix.plan(ids.numpy(), np.asarray(lengths), groups, self.pair_cost, self.prefix_layouts)
        if found is None and not self.announced_whole_rows and _leads(self.group):
            self.announced_whole_rows = True
            print(
                "agentrl: trainer.shared_prefix: a micro-batch forwards whole rows, as sharing its groups' prefixes "
                "would not cost less (groups of one of like lengths, prefixes of a few tokens before long rests, or "
                "groups split across micro-batches: trainer.micro_batch_size a multiple of rollout.group_size keeps "
                "them whole); "
                "said once",
                file=sys.stderr,
                flush=True,
            )
        whole = len(lengths) * max(lengths)
        self.prefix_positions += (whole if found is None else found.positions, whole)
        return None if found is None else shared_prefix.prepare(ids.numpy(), np.asarray(lengths), found)

    def _position_logits(
        self, model, ids: torch.Tensor, attention: torch.Tensor, prefix_layout, trained: torch.Tensor | None = None
    ):
        """The model's logits of the rows, as `TokenLogits` reads them: (positions, vocab), and (B, T-1) the position
        predicting each row's token t+1. Whole rows: every row position is its own; a prefix layout: a prefix's
        positions are its rows'. `trained` (B, T-1) bool: only the positions predicting those tokens are read, and
        a lean forward computes only theirs (`kept_positions`)."""
        lean = self.lean_forwards.get(id(model))
        wanted = None if trained is None or lean is None else F.pad(trained, (0, 1))
        if prefix_layout is None:
            rows, longest = ids.shape
            index = torch.arange(rows * longest, device=ids.device).view(rows, longest)
            if wanted is not None:
                keep, index = kept_positions(index, wanted)
                flat = lean.rows(ids, keep)
            elif lean is not None:
                flat = lean.rows(ids)
            else:
                flat = model(input_ids=ids, attention_mask=attention, use_cache=False).logits.flatten(0, 1)
            return flat, index[:, :-1]
        flat, index = shared_prefix.position_logits(model, ids, prefix_layout, lean, wanted)
        return flat, index[:, :-1]

    def _micro_step(
        self,
        batch,
        episodes,
        advantages,
        old_logp,
        global_tokens: float,
        global_sequences: float,
        update: int,
        prepared: Prepared,
    ) -> tuple[dict[str, float], float]:
        """One forward and backward; its stats' sums and its loss (NaN or inf when not finite)."""
        layout = _RowLayout(batch["offsets"], episodes)
        ids, lengths = layout.gather(batch["tokens"], torch.long), layout.lengths.tolist()
        prefix_layout = self._prefix_layout(batch, episodes, ids, lengths)

        def predicted(flat) -> torch.Tensor:  # (B, T-1) float32 rows of a flat per-token array, from token 1 on
            return layout.gather(flat, torch.float32)[:, 1:].to(self.device)

        mask, rollout_logp, adv = predicted(batch["loss_mask"]), predicted(batch["logprobs"]), predicted(advantages)
        rows = {name: predicted(flat) for name, flat in prepared.per_token.items()}
        ids, attention = ids.to(self.device), layout.attention().to(self.device)
        temperature = self.temperature
        trained = mask > 0

        with self._compute():
            flat, index = self._position_logits(self.model, ids, attention, prefix_layout, trained)
            outputs = {
                extra.name: extra.module(input_ids=ids, attention_mask=attention)[:, :-1].float()
                for extra in self.extras
            }
        targets = ids[:, 1:]
        token_logits = TokenLogits(flat, index, temperature)
        logp = token_logits.logprobs(targets)
        if old_logp is None:  # one update a step: this forward is the old policy
            old = logp.detach()
        elif old_logp is batch["logprobs"]:
            old = rollout_logp
        else:
            old = predicted(old_logp)
        ref_logp = None
        if self.reference is not None:
            with torch.no_grad(), self._compute():
                ref_flat, ref_index = self._position_logits(self.reference, ids, attention, prefix_layout, trained)
                ref_logp = TokenLogits(ref_flat, ref_index, temperature).logprobs(targets)
        with torch.set_grad_enabled(self.algorithm.needs_entropy_grad):
            token_entropy = token_logits.entropy()
        inputs = LossInputs(
            logp=logp,
            old_logp=old,
            rollout_logp=rollout_logp,
            advantages=adv,
            mask=mask,
            entropy=token_entropy,
            ref_logp=ref_logp,
            global_tokens=global_tokens,
            global_sequences=global_sequences,
            model_outputs=outputs,
            prepared=rows,
            lr_scale=self._lr_scale(),
            uniform_kl=token_logits.uniform_kl() if self.algorithm.needs_uniform_kl else None,
        )
        loss, stats = self.algorithm.loss(inputs)
        loss.backward()
        with torch.no_grad():  # one read-back of every sum (one sync on a GPU)
            current = logp.detach()
            log_ratio = current - rollout_logp  # log pi - log mu, on tokens sampled from mu
            per_token = [torch.ones_like(mask), token_entropy, log_ratio.abs(), torch.exp(current - old)]
            first = update == 0  # the policy has not moved yet: logp is the trainer's view of the rollout policy
            if first:
                per_token += [-log_ratio, torch.exp(log_ratio) - log_ratio - 1.0]
            sums = (torch.stack(per_token) * mask).sum(dim=(1, 2))
            tokens, entropy_sum, diff, ratio, *mismatch, loss_value = torch.cat([sums, loss.detach()[None]]).tolist()
        k1, k3 = mismatch if first else (0.0, 0.0)
        stats = {"tokens": tokens, **stats, "entropy": entropy_sum, "logprob_diff_vs_rollout": diff}
        stats |= {"ratio_mean": ratio, "first_update_tokens": tokens if first else 0.0}
        stats |= {"mismatch_kl_k1": k1, "mismatch_kl_k3": k3}
        return stats, loss_value


def _leads(group) -> bool:
    """Whether this is the first rank of the trainer ranks (or the only one)."""
    if group is None:
        return True
    import torch.distributed as dist

    return dist.get_rank(group) == 0


def _placeholder_batch() -> dict[str, np.ndarray]:
    """One failed two-token episode with no trained token: what an empty shard trains on (adds nothing)."""
    from agentrl.trajectory import Episode, pack

    episode = Episode(group=-1, task_seed=0, finish="error")
    episode.extend([0, 0], mask=0)
    return pack([episode])


class _RowLayout:
    """Where a micro-batch's episodes lie in the batch's flat per-token arrays, to gather any of them as rows."""

    def __init__(self, offsets, episodes):
        offsets = np.asarray(offsets, dtype=np.int64)
        episodes = np.asarray(episodes, dtype=np.int64)
        starts = offsets[episodes]
        self.lengths = offsets[episodes + 1] - starts  # (rows,)
        self.inside = _inside(self.lengths)  # (rows, longest) bool
        self.source = (starts[:, None] + np.arange(self.inside.shape[1]))[self.inside]

    def gather(self, flat: np.ndarray, dtype) -> torch.Tensor:
        """Each episode's slice of `flat` as a right-padded row (zeros after it), cast to `dtype`: one numpy gather."""
        flat = np.asarray(flat)
        rows = np.zeros(self.inside.shape, dtype=flat.dtype)
        rows[self.inside] = flat[self.source]
        return torch.from_numpy(rows).to(dtype)

    def attention(self) -> torch.Tensor:
        """(rows, longest) long: 1 on each row's tokens, 0 on its padding."""
        return torch.from_numpy(self.inside.astype(np.int64))


def _rows(batch, episodes, key: str, dtype) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Episodes of `batch[key]` as right-padded rows, their attention mask, and their lengths."""
    layout = _RowLayout(batch["offsets"], episodes)
    return layout.gather(batch[key], dtype), layout.attention(), layout.lengths.tolist()


def _gather_rows(flat: np.ndarray, offsets, episodes, lengths: list[int], dtype) -> torch.Tensor:
    """Each episode's slice of `flat` as a right-padded row (zeros after it), cast to `dtype`; `lengths` are the
    episodes' own (as `_rows` gives them)."""
    layout = _RowLayout(offsets, episodes)
    if layout.lengths.tolist() != list(lengths):
        raise ValueError(f"row lengths {list(lengths)} are not those of episodes {list(episodes)}")
    return layout.gather(flat, dtype)


def _inside(lengths: list[int]) -> np.ndarray:
    """(rows, longest) bool: True on the first `length` columns of each row."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.arange(lengths.max()) < lengths[:, None]
