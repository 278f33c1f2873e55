"""AdamW with decay only on matrices (DTensor shards included), the device-side skip of a non-finite step
(:class:`NonFiniteSkip`), and the learning-rate schedule as a pure function of the step."""

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
    # fused: the one implementation whose step takes a ``found_inf`` flag (GradScaler's hook) and skips the whole
    # update on the device when it is set — parameters, moments and step count unchanged (NonFiniteSkip)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=True)


class NonFiniteSkip:
    """The non-finite check without a host sync: each step's global gradient norm is tested on the device, and the
    fused AdamW skips its update there when ``found`` is set (``optimizer.found_inf``, read by
    ``torch.optim.AdamW.step``). ``found`` is sticky: once a step was non-finite no later step applies either, so the
    parameters stay those of the last good step until :meth:`first` — a host sync, taken only where the loop syncs
    anyway (a log row, a checkpoint) — reports the step, and the run stops naming it."""

    def __init__(self, device: torch.device):
        self.found = torch.zeros((), device=device)                       # 1.0 once a step was non-finite
        self.step = torch.zeros((), dtype=torch.int64, device=device)     # the first such step (1-based)
        self.value = torch.zeros((), device=device)                       # its gradient norm

    def record(self, step: int, grad_norm: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Device ops only: note ``step``'s norm, and arm ``optimizer``'s skip for it (and every later step)."""
        first = ~torch.isfinite(grad_norm) & (self.found == 0)
        self.step = torch.where(first, step, self.step)
        self.value = torch.where(first, grad_norm.detach().float(), self.value)
        self.found = torch.maximum(self.found, first.float())
        optimizer.found_inf = self.found

    def first(self) -> tuple[int, float] | None:
        """(step, gradient norm) of the first non-finite step, or None — a host sync."""
        if not bool(self.found):
            return None
        return int(self.step), float(self.value)


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
