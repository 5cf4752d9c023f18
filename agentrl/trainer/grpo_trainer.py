"""One GRPO training step on this trainer rank's shard of the batch.

The loss is divided by the token count of the whole global mini-batch and gradients are
summed over trainer ranks: by hand (one flattened all-reduce) when every rank holds the
whole model, or by FSDP2's reduce-scatter when `trainer.fsdp` shards it (see
agentrl/trainer/parallel.py). Either way every rank ends each step with the weights one
rank would have after training on the whole batch.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from agentrl.algorithms.grpo import clipped_policy_loss, entropy, group_advantages, kl_k3, token_logprobs
from agentrl.config import ConfigError
from agentrl.trainer import parallel
from agentrl.trainer.model import load_causal_lm
from agentrl.trajectory import FINISH_REASONS, num_episodes

ERROR = FINISH_REASONS.index("error")


def lr_lambda(schedule: str, warmup: int, total: int, min_ratio: float):
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - (1.0 - min_ratio) * progress
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


class GRPOTrainer:
    def __init__(self, config, weights_path: str, device: str, group=None):
        self.config = config
        self.cfg = config.trainer
        self.device = device
        self.group = group  # torch.distributed group of trainer ranks, None when alone
        if self.cfg.fsdp and group is None:
            raise ConfigError(
                "trainer.fsdp=true needs at least 2 trainer ranks (layout.trainer); with one trainer rank there is "
                "nothing to shard: set trainer.fsdp=false (trainer.mixed_precision=bf16 then uses autocast)"
            )
        self.sharded = self.cfg.fsdp
        self.model = self._load(weights_path)
        self.model.train()
        self.reference = None
        if self.cfg.kl_coef > 0:
            self.reference = self._load(config.model.path, reference=True).eval()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=self.cfg.lr, betas=tuple(self.cfg.betas), weight_decay=self.cfg.weight_decay
        )
        total = config.steps * self.cfg.updates_per_step
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(self.cfg.lr_schedule, self.cfg.warmup_steps, total, self.cfg.min_lr_ratio)
        )

    def _load(self, path: str, reference: bool = False):
        """The policy (or the frozen KL reference), checkpointed and sharded as the config asks.

        With mixed_precision=bf16 the weights stay float32 (master weights) whatever model.dtype
        says; model.dtype then only sets the rollout engine's dtype.
        """
        dtype = "float32" if self.cfg.mixed_precision == "bf16" else self.config.model.dtype
        model = load_causal_lm(path, dtype, self.device)
        if reference:
            model.requires_grad_(False)
        elif self.cfg.activation_checkpointing:
            parallel.enable_activation_checkpointing(model)
        if self.sharded:
            parallel.shard(model, self.group, self.device, self.cfg.mixed_precision)
        return model

    def named_weights(self):
        """(name, tensor) in a fixed order; DTensor shards under FSDP (weights.full_tensors gathers them)."""
        return [(name, p.detach()) for name, p in self.model.named_parameters()]

    def _allreduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over trainer ranks, returned on the tensor's own device (NCCL reduces only GPU tensors)."""
        if self.group is not None:
            import torch.distributed as dist

            on_device = tensor.to(self.device)
            dist.all_reduce(on_device, group=self.group)
            tensor = on_device.to(tensor.device)
        return tensor

    def _sync_gradients(self) -> None:
        if self.group is None or self.sharded:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = self._allreduce(torch.cat([g.reshape(-1) for g in grads]))
        offset = 0
        for param, grad in zip(self.params, grads, strict=True):
            param.grad = flat[offset : offset + grad.numel()].view_as(param)
            offset += grad.numel()

    def train_step(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """Advantages, then `updates_per_step` optimizer steps over the shard; returns global sums/means."""
        n = num_episodes(batch)
        valid = batch["finish"] != ERROR
        advantages = group_advantages(batch["reward"], batch["group"], valid, self.cfg.adv_std_norm)
        sums: dict[str, float] = {}
        grad_norms = []
        for minibatch in np.array_split(np.arange(n), self.cfg.updates_per_step):
            micro_steps = self._agreed_micro_steps(math.ceil(len(minibatch) / self.cfg.micro_batch_size))
            tokens = float(sum(_trained_tokens(batch, i) for i in minibatch))
            global_tokens = self._allreduce(torch.tensor([tokens], dtype=torch.float64)).item()
            self.optimizer.zero_grad(set_to_none=True)
            starts = range(0, len(minibatch), self.cfg.micro_batch_size)
            for start in starts:
                micro = minibatch[start : start + self.cfg.micro_batch_size]
                for key, value in self._micro_step(batch, micro, advantages, max(global_tokens, 1.0)).items():
                    sums[key] = sums.get(key, 0.0) + value
            for _ in range(micro_steps - len(starts)):
                self._idle_micro_step()
            self._sync_gradients()
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
            grad_norms.append(parallel.scalar(norm))
            self.optimizer.step()
            self.scheduler.step()
        totals = self._allreduce(torch.tensor(list(sums.values()), dtype=torch.float64)).tolist()
        sums = dict(zip(sums, totals, strict=True))
        count = max(sums.pop("tokens"), 1.0)
        metrics = {f"train/{key}": value / count for key, value in sums.items()}
        metrics["train/loss"] = metrics.pop("train/loss_sum")
        metrics["train/grad_norm"] = float(np.mean(grad_norms))
        metrics["train/lr"] = self.scheduler.get_last_lr()[0]
        metrics["train/adv_abs_mean"] = float(np.abs(advantages[valid]).mean()) if valid.any() else 0.0
        return metrics

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
            if self.reference is not None:
                with torch.no_grad():
                    self.reference(input_ids=ids, use_cache=False)
        (logits.float().sum() * 0.0).backward()

    def _compute(self):
        return parallel.compute_context(self.device, self.cfg.mixed_precision, self.sharded)

    def _micro_step(self, batch, episodes, advantages, global_tokens: float) -> dict[str, float]:
        offsets = batch["offsets"]
        lengths = [int(offsets[i + 1] - offsets[i]) for i in episodes]
        width = max(lengths)
        ids = torch.zeros(len(episodes), width, dtype=torch.long)
        attention = torch.zeros(len(episodes), width, dtype=torch.long)
        mask = torch.zeros(len(episodes), width, dtype=torch.float32)
        old_logp = torch.zeros(len(episodes), width, dtype=torch.float32)
        adv = torch.zeros(len(episodes), 1, dtype=torch.float32)
        for row, (i, length) in enumerate(zip(episodes, lengths, strict=True)):
            span = slice(int(offsets[i]), int(offsets[i + 1]))
            ids[row, :length] = torch.from_numpy(batch["tokens"][span])
            attention[row, :length] = 1
            mask[row, :length] = torch.from_numpy(batch["loss_mask"][span].astype(np.float32))
            old_logp[row, :length] = torch.from_numpy(batch["logprobs"][span])
            adv[row, 0] = float(advantages[i])
        ids, attention = ids.to(self.device), attention.to(self.device)
        mask, old_logp, adv = mask[:, 1:].to(self.device), old_logp[:, 1:].to(self.device), adv.to(self.device)
        temperature = self.config.rollout.temperature

        with self._compute():
            logits = self.model(input_ids=ids, attention_mask=attention, use_cache=False).logits[:, :-1].float()
        targets = ids[:, 1:]
        logp = token_logprobs(logits, targets, temperature)
        loss_sum, clipped = clipped_policy_loss(
            logp, old_logp, adv, mask, self.cfg.clip_eps_low, self.cfg.clip_eps_high
        )
        stats = {"loss_sum": 0.0, "tokens": float(mask.sum())}
        if self.reference is not None:
            with torch.no_grad(), self._compute():
                ref_logits = (
                    self.reference(input_ids=ids, attention_mask=attention, use_cache=False).logits[:, :-1].float()
                )
                ref_logp = token_logprobs(ref_logits, targets, temperature)
            kl_sum = (kl_k3(logp, ref_logp) * mask).sum()
            loss_sum = loss_sum + self.cfg.kl_coef * kl_sum
            stats["kl"] = float(kl_sum.detach())
        token_entropy = entropy(logits, temperature) if self.cfg.entropy_coef > 0 else None
        if token_entropy is not None:
            loss_sum = loss_sum - self.cfg.entropy_coef * (token_entropy * mask).sum()
        (loss_sum / global_tokens).backward()
        with torch.no_grad():
            if token_entropy is None:
                token_entropy = entropy(logits.detach(), temperature)
            stats["loss_sum"] = float(loss_sum.detach())
            stats["entropy"] = float((token_entropy * mask).sum())
            stats["clip_frac"] = float(clipped)
            stats["logprob_diff_vs_rollout"] = float(((logp.detach() - old_logp).abs() * mask).sum())
            stats["ratio_mean"] = float((torch.exp(logp.detach() - old_logp) * mask).sum())
        return stats


def _trained_tokens(batch, episode: int) -> int:
    """Loss-mask tokens that enter the loss (the first token has no prediction)."""
    return int(batch["loss_mask"][batch["offsets"][episode] + 1 : batch["offsets"][episode + 1]].sum())
