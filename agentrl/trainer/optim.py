"""The policy's optimizer and learning-rate schedule, from the `optimizer` and `lr_scheduler` sections."""

from __future__ import annotations

import math

import torch

from agentrl.config import ConfigError


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


FUSED_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu")  # device types torch has a fused AdamW kernel for


def build_optimizer(params, optimizer_config) -> torch.optim.Optimizer:
    """AdamW over `params`, torch's fused kernel as `optimizer.fused` says (see `use_fused`)."""
    params = list(params)
    optimizer = torch.optim.AdamW(
        params,
        lr=optimizer_config.lr,
        betas=tuple(optimizer_config.betas),
        weight_decay=optimizer_config.weight_decay,
        fused=True if use_fused(params, optimizer_config.fused) else None,
    )
    optimizer.register_load_state_dict_pre_hook(_keep_kernel_choice)
    return optimizer


def use_fused(params, fused) -> bool:
    """Whether AdamW runs fused: `auto` where torch has the kernel for every parameter's device and dtype (floating
    point on FUSED_DEVICES), `true` always (refused, naming the field, where it has none), `false` never."""
    unsupported = sorted(
        {
            f"{p.dtype} on {p.device.type}"
            for p in params
            if p.device.type not in FUSED_DEVICES or not p.is_floating_point()
        }
    )
    if fused is True and unsupported:
        raise ConfigError(
            f"optimizer.fused=true, but torch has no fused AdamW for parameters of {', '.join(unsupported)}; set "
            "optimizer.fused=auto (fused where it can be) or false"
        )
    return fused is True or (fused == "auto" and not unsupported)


def _keep_kernel_choice(optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
    """Before a checkpoint's optimizer state loads: its param groups carry the kernel choice of the run that saved it
    (`fused`, `foreach`), which would replace this run's (optimizer.fused may differ between them); keep this run's,
    so that the steps are also placed as this run's kernel wants them."""
    groups = [
        {**saved, "fused": current["fused"], "foreach": current["foreach"]}
        for saved, current in zip(state_dict["param_groups"], optimizer.param_groups, strict=True)
    ]
    return {**state_dict, "param_groups": groups}


def build_scheduler(optimizer, scheduler_config, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """`total_steps`: optimizer steps in the whole run (training steps x updates per step)."""
    schedule = lr_lambda(
        scheduler_config.decay, scheduler_config.warmup_steps, total_steps, scheduler_config.min_lr_ratio
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
