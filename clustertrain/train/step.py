"""One optimizer step of the built-in trainer, and nothing else: the layout's forward and backward over the step's
micro-batches (:meth:`clustertrain.train.parallel.ParallelModel.forward_backward_step`), the gradient norm and clip,
the device-side non-finite check (:class:`clustertrain.train.optim.NonFiniteSkip`), the learning rate and AdamW.

No value is read back to the host here: the loss and the norm stay device tensors (the loop reads them at a log
row, where it synchronises anyway), so on a GPU the CPU queues the next step's work while the device runs this one.
``part(name)`` wraps each part (the trainer's timer and heartbeat phase: :meth:`clustertrain.train.trainer.Trainer.part`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from clustertrain.train.optim import NonFiniteSkip, lr_at, set_lr

Part = Callable[[str], AbstractContextManager]


def no_part(name: str) -> AbstractContextManager:
    return nullcontext()


@dataclass
class StepParts:
    """What a step works on: the parallel model, its optimizer, the non-finite skip and the training section."""

    pm: object  # ParallelModel
    optimizer: torch.optim.Optimizer
    nonfinite: NonFiniteSkip
    cfg: object  # TrainingConfig
    norm_part: str = "optimizer"  # "comm" when the norm needs a collective (FSDP, TP or PP)
    #: called before the optimizer changes parameters in place: an async checkpoint's overlapped staging copy of
    #: them must be done (:meth:`clustertrain.train.checkpoint.CheckpointManager.staged`; at once when none is)
    before_optimizer: Callable[[], None] | None = None


def train_step(parts: StepParts, step: int, batches: Sequence, scale: float,
               part: Part = no_part) -> tuple[torch.Tensor, torch.Tensor]:
    """Train step ``step + 1`` (``step`` finished so far) on ``batches`` with loss scale ``scale`` (1/accum, or
    NaN to inject a non-finite step); returns (the step's summed loss, the gradient norm), both on the device."""
    loss_sum = parts.pm.forward_backward_step(batches, scale, part=part)
    cfg = parts.cfg
    with part(parts.norm_part):
        grad_norm = parts.pm.clip_grad_norm_(cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
    with part("optimizer"):
        # tested on the device: a non-finite step is skipped there, and every rank stops at the next log row or
        # checkpoint naming it (Trainer.check_finite) — no host sync between two forwards
        parts.nonfinite.record(step + 1, grad_norm, parts.optimizer)
        set_lr(parts.optimizer, lr_at(step, cfg))
        if parts.before_optimizer is not None:
            parts.before_optimizer()
        parts.optimizer.step()
        parts.optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm
