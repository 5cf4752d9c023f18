"""One SFT optimizer step on this rank's share of a batch of transcripts: token-mean cross-entropy on assistant
tokens, normalised by the global token count, gradients summed over ranks (one all-reduce, or FSDP2's
reduce-scatter), clipped, stepped. Every rank ends the step with the weights of one rank trained on the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from agentrl.config import ConfigError, LRSchedulerConfig, ModelConfig, OptimizerConfig, ParallelismConfig
from agentrl.sft.config import SFTSection
from agentrl.trainer import parallel
from agentrl.trainer.model import load_policy
from agentrl.trainer.optim import build_optimizer, build_scheduler


@dataclass(frozen=True)
class SFTSections:
    """What an SFTTrainer reads of an SFT config: its `model`, `sft`, `optimizer`, `lr_scheduler` and
    `parallelism` sections."""

    model: ModelConfig
    sft: SFTSection
    optimizer: OptimizerConfig
    lr_scheduler: LRSchedulerConfig
    parallelism: ParallelismConfig

    @classmethod
    def of(cls, config) -> SFTSections:
        return cls(config.model, config.sft, config.optimizer, config.lr_scheduler, config.parallelism)


class SFTTrainer:
    """Fine-tunes the model of `weights_path` on `device` among the ranks of `group` (None: alone), for
    `total_steps` optimizer steps (the learning-rate schedule's length). Takes the sections it reads."""

    def __init__(self, weights_path: str, device: str, total_steps: int, group, sections: SFTSections):
        model, sft, optimizer = sections.model, sections.sft, sections.optimizer
        lr_scheduler, parallelism = sections.lr_scheduler, sections.parallelism
        self.micro_batch_size = sft.micro_batch_size
        self.max_grad_norm = optimizer.max_grad_norm
        self.device = device
        self.group = group
        self.parallelism = parallelism
        self.sharded = self.parallelism.fsdp
        dtype = "float32" if self.parallelism.mixed_precision == "bf16" else model.dtype
        if model.lora is not None and self.sharded:
            raise ConfigError(
                "agentrl sft with model.lora and parallelism.fsdp=true is not supported yet (agentrl train takes "
                "them); set parallelism.fsdp=false: the adapters and their optimizer state are small"
            )
        prepare = parallel.enable_activation_checkpointing if self.parallelism.activation_checkpointing else None
        self.model = load_policy(weights_path, model, dtype, device, prepare)
        if model.lora is not None and group is not None:
            parallel.broadcast_trainable(self.model, group)  # fresh adapters: drawn from each rank's own seed
        if self.sharded:
            parallel.shard(self.model, group, device, self.parallelism.mixed_precision)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.params, optimizer)
        self.scheduler = build_scheduler(self.optimizer, lr_scheduler, total_steps)

    def _allreduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self.group is None:
            return tensor
        import torch.distributed as dist

        on_device = tensor.to(self.device)
        dist.all_reduce(on_device, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=self.group)
        return on_device.to(tensor.device)

    def _micro_batches(self, rows) -> tuple[list, int]:
        """This rank's micro-batches and how many every rank runs (FSDP's forwards are collectives)."""
        size = self.micro_batch_size
        chunks = [rows[start : start + size] for start in range(0, len(rows), size)]
        steps = len(chunks)
        if self.sharded:
            steps = int(self._allreduce(torch.tensor([steps], dtype=torch.int64), op="max").item())
        return chunks, steps

    def _nll_sum(self, rows) -> tuple[torch.Tensor, float]:
        """Summed negative log-likelihood of the trained tokens of `rows`, and their count."""
        longest = max(len(tokens) for tokens, _ in rows)
        ids = torch.zeros(len(rows), longest, dtype=torch.long)
        mask = torch.zeros(len(rows), longest, dtype=torch.float32)
        attention = torch.zeros(len(rows), longest, dtype=torch.long)
        for row, (tokens, loss_mask) in enumerate(rows):
            ids[row, : len(tokens)] = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
            mask[row, : len(tokens)] = torch.from_numpy(np.asarray(loss_mask, dtype=np.float32))
            attention[row, : len(tokens)] = 1
        ids, mask, attention = ids.to(self.device), mask[:, 1:].to(self.device), attention.to(self.device)
        with parallel.compute_context(self.device, self.parallelism.mixed_precision, self.sharded):
            logits = self.model(input_ids=ids, attention_mask=attention, use_cache=False).logits[:, :-1].float()
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none")
        return (nll.view_as(mask) * mask).sum(), float(mask.sum())

    def _idle_pass(self, backward: bool) -> None:
        """A one-token forward (and backward) that adds nothing: joins the other ranks' FSDP collectives."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        with parallel.compute_context(self.device, self.parallelism.mixed_precision, self.sharded):
            logits = self.model(input_ids=ids, use_cache=False).logits
        if backward:
            (logits.float().sum() * 0.0).backward()

    def train_step(self, rows) -> dict[str, float]:
        """`rows`: this rank's (tokens, loss_mask) pairs of the step's batch (possibly none)."""
        local_tokens = float(sum(int(np.sum(mask[1:])) for _, mask in rows))
        global_tokens = float(self._allreduce(torch.tensor([local_tokens], dtype=torch.float64)).item())
        self.optimizer.zero_grad(set_to_none=True)
        chunks, steps = self._micro_batches(rows)
        loss_sum = 0.0
        for chunk in chunks:
            nll, _ = self._nll_sum(chunk)
            (nll / max(global_tokens, 1.0)).backward()
            loss_sum += float(nll.detach())
        for _ in range(steps - len(chunks)):
            self._idle_pass(backward=True)
        self._sync_gradients()
        norm = parallel.scalar(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))
        lr = self.scheduler.get_last_lr()[0]  # the rate this step uses
        if global_tokens > 0:
            self.optimizer.step()
            self.scheduler.step()
        total = float(self._allreduce(torch.tensor([loss_sum], dtype=torch.float64)).item())
        return {
            "sft/loss": total / max(global_tokens, 1.0),
            "sft/tokens": global_tokens,
            "sft/grad_norm": norm,
            "sft/lr": lr,
        }

    def _sync_gradients(self) -> None:
        if self.group is None or self.sharded:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = self._allreduce(torch.cat([g.reshape(-1) for g in grads]))
        offset = 0
        for param, grad in zip(self.params, grads, strict=True):
            param.grad = flat[offset : offset + grad.numel()].view_as(param)
            offset += grad.numel()

    @torch.no_grad()
    def eval_loss(self, rows) -> tuple[float, float]:
        """Token-mean loss over every rank's `rows`, and the token count."""
        self.model.eval()
        chunks, steps = self._micro_batches(rows)
        nll_sum, tokens = 0.0, 0.0
        for chunk in chunks:
            nll, count = self._nll_sum(chunk)
            nll_sum, tokens = nll_sum + float(nll), tokens + count
        for _ in range(steps - len(chunks)):
            self._idle_pass(backward=False)
        self.model.train()
        nll_sum, tokens = self._allreduce(torch.tensor([nll_sum, tokens], dtype=torch.float64)).tolist()
        return nll_sum / max(tokens, 1.0), tokens
