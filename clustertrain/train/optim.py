"""AdamW with decay only on matrices (DTensor shards included), and the learning-rate schedule as a pure
function of the step."""

from __future__ import annotations

import math

import torch
from torch import nn

from clustertrain.train.config import TrainingConfig


def build_optimizer(model: nn.Module, cfg: TrainingConfig) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=True)


def lr_at(step: int, cfg: TrainingConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine/linear/constant decay to min_lr."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.schedule == "linear":
        factor = 1.0 - progress
    else:
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * factor


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The learning rate of every parameter group for the coming step: a pure function of the step
    (:func:`lr_at`), so nothing about the schedule needs saving and any layout resumes it exactly."""
    for group in optimizer.param_groups:
        group["lr"] = lr
