"""One GRPO training step on this trainer rank's shard of the batch.

Gradients are summed over trainer ranks by hand (one flattened all-reduce), and the
loss is divided by the token count of the whole global mini-batch, so every rank holds
identical weights after every step.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from agentrl.algorithms.grpo import clipped_policy_loss, entropy, group_advantages, kl_k3, token_logprobs
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
        self.model = load_causal_lm(weights_path, config.model.dtype, device)
        self.model.train()
        self.reference = None
        if self.cfg.kl_coef > 0:
            self.reference = load_causal_lm(config.model.path, config.model.dtype, device).eval()
            self.reference.requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=self.cfg.lr, betas=tuple(self.cfg.betas), weight_decay=self.cfg.weight_decay
        )
        total = config.steps * self.cfg.updates_per_step
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(self.cfg.lr_schedule, self.cfg.warmup_steps, total, self.cfg.min_lr_ratio)
        )

    def named_weights(self):
        return [(name, p.detach()) for name, p in self.model.named_parameters()]

    def _allreduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.group is not None:
            import torch.distributed as dist

            dist.all_reduce(tensor, group=self.group)
        return tensor

    def _sync_gradients(self) -> None:
        if self.group is None:
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
            tokens = float(sum(_trained_tokens(batch, i) for i in minibatch))
            global_tokens = self._allreduce(torch.tensor([tokens], dtype=torch.float64)).item()
            self.optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(minibatch), self.cfg.micro_batch_size):
                micro = minibatch[start : start + self.cfg.micro_batch_size]
                for key, value in self._micro_step(batch, micro, advantages, max(global_tokens, 1.0)).items():
                    sums[key] = sums.get(key, 0.0) + value
            self._sync_gradients()
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)))
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

        logits = self.model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        targets = ids[:, 1:]
        logp = token_logprobs(logits, targets, temperature)
        loss_sum, clipped = clipped_policy_loss(
            logp, old_logp, adv, mask, self.cfg.clip_eps_low, self.cfg.clip_eps_high
        )
        stats = {"loss_sum": 0.0, "tokens": float(mask.sum())}
        if self.reference is not None:
            with torch.no_grad():
                ref_logits = self.reference(input_ids=ids, attention_mask=attention).logits[:, :-1]
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
