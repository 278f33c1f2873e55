"""The non-finite check without a host sync (:class:`clustertrain.train.optim.NonFiniteSkip`): a step whose gradient
norm is NaN is skipped on the device by the fused AdamW's ``found_inf`` — parameters, moments and step count
unchanged — and so is every later step until the loop, at its next log row or checkpoint, reads the flag and stops
naming the step (end to end: tests/integration/train/test_monitoring.py, NaN injected at step 7).

The sync count is structural, on CPU: every way Python reads a tensor's value onto the host (``item``, ``bool``,
``float``, ``int``, ``tolist``) is patched to count while the trainer's own step (:func:`clustertrain.train.step.train_step`,
with the read-ahead :class:`clustertrain.train.feed.BatchFeed`) runs — from the first forward to the end of the
optimizer step, i.e. everything between two forwards but the stop agreement, which reads a CPU (gloo) flag, not the
device. On a GPU each of those reads is a device-to-host sync; none is left."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from clustertrain.core.parallel_layout import resolve_layout
from clustertrain.train.config import ArchConfig, ParallelismConfig, TrainingConfig
from clustertrain.train.feed import BatchFeed
from clustertrain.train.optim import NonFiniteSkip, build_optimizer
from clustertrain.train.parallel import build_parallel_model
from clustertrain.train.step import StepParts, train_step

ARCH = ArchConfig(layers=2, hidden=32, heads=4, seq_len=16, mlp="swiglu")
CFG = TrainingConfig(max_steps=4, micro_batch=2, global_batch=4, lr=1e-2, min_lr=1e-3, warmup_steps=1)


class Samples:
    """An in-memory token array read as GPTSamples is (``batch(start, count)``: count rows of seq_len + 1 tokens)."""

    def __init__(self):
        self.tokens = np.random.default_rng(0).integers(0, 64, (64, ARCH.seq_len + 1), dtype=np.int64)

    def batch(self, start: int, count: int) -> np.ndarray:
        return self.tokens[start:start + count]


def trainer_like(nan_at_step: int | None = None) -> SimpleNamespace:
    """The trainer's step (:func:`train_step`) with the real model, optimizer, skip and a read-ahead data feed."""
    layout = resolve_layout(ParallelismConfig(), 1, on_gpu=False)
    pm = build_parallel_model(ARCH, 64, layout, torch.device("cpu"), seed=1)
    parts = StepParts(pm, build_optimizer(pm.model, CFG), NonFiniteSkip(torch.device("cpu")), CFG)
    feed = BatchFeed(Samples(), global_batch=4, micro_batch=2, dp_rank=0, accum=2, device=torch.device("cpu"),
                     prefetch=True)
    return SimpleNamespace(pm=pm, optimizer=parts.optimizer, nonfinite=parts.nonfinite, parts=parts, feed=feed,
                           nan_at_step=nan_at_step, step=0)


def run_step(t) -> None:
    scale = float("nan") if t.nan_at_step == t.step + 1 else 0.5
    train_step(t.parts, t.step, t.feed.step_batches(t.step), scale)
    t.step += 1


def state(t) -> list[torch.Tensor]:
    opt = t.optimizer
    return [p.detach().clone() for p in t.pm.model.parameters()] + [
        v.clone() for p in t.pm.model.parameters() for v in opt.state[p].values()]


def test_no_host_read_between_forwards(monkeypatch):
    t = trainer_like()
    run_step(t)  # the first step creates AdamW's state
    reads: list[str] = []
    for name in ("item", "__bool__", "__float__", "__int__", "__index__", "tolist"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name):
            reads.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    run_step(t)
    run_step(t)
    monkeypatch.undo()
    assert reads == []
    # the counter does count: the check the loop makes at a log row is one such read
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda self, _r=torch.Tensor.__bool__: reads.append("b") or _r(self))
    assert t.nonfinite.first() is None and reads == ["b"]


def test_a_nan_step_and_the_steps_after_it_are_not_applied():
    t = trainer_like(nan_at_step=2)
    run_step(t)
    good = state(t)
    run_step(t)  # step 2: NaN loss scale, so a NaN gradient norm
    run_step(t)  # step 3: finite, but the loop has not stopped yet: skipped as well
    assert all(torch.equal(a, b) for a, b in zip(good, state(t)))
    step, value = t.nonfinite.first()
    assert step == 2 and value != value  # NaN


def test_a_finite_step_is_applied():
    t = trainer_like()
    run_step(t)
    before = state(t)
    run_step(t)
    assert not torch.equal(before[0], state(t)[0]) and t.nonfinite.first() is None
