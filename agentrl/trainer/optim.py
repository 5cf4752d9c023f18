"""The policy's optimizer and learning-rate schedule, from the `optimizer` and `lr_scheduler` sections."""

from __future__ import annotations

import math

import torch


def lr_lambda(decay: str, warmup: int, total: int, min_ratio: float):
    """LR factor per optimizer step: linear warm-up, then constant, linear or cosine decay to `min_ratio`."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if decay == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if decay == "linear":
            return 1.0 - (1.0 - min_ratio) * progress
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_optimizer(params, optimizer_config) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        params,
        lr=optimizer_config.lr,
        betas=tuple(optimizer_config.betas),
        weight_decay=optimizer_config.weight_decay,
    )


def build_scheduler(optimizer, scheduler_config, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """`total_steps`: optimizer steps in the whole run (training steps x updates per step)."""
    schedule = lr_lambda(
        scheduler_config.decay, scheduler_config.warmup_steps, total_steps, scheduler_config.min_lr_ratio
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
