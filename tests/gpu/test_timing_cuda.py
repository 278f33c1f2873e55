"""Per-part step timing on a GPU (train/timing.py): CUDA events at the part marks, read at the logged step; every
part is non-zero and the parts add up to the step (the device's timeline), and a part the CPU is slow in shows as
far as the device waited for it. Skips without CUDA; run by ``scripts/gpu-check.sh``."""

from __future__ import annotations

import time

import pytest
import torch

from clustertrain.core.run_events import PARTS
from clustertrain.train.timing import StepTimer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_cuda_parts_are_non_zero_and_sum_to_the_step():
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    w = torch.nn.Linear(4096, 4096, device=dev)
    opt = torch.optim.AdamW(w.parameters(), lr=1e-4)
    host = torch.randn(512, 4096).pin_memory()
    timer = StepTimer(0, "gpu", None, dev)
    steps = 6
    w(host[:8].to(dev)).square().mean().backward()  # AdamW's state is made by its first step: not what is timed
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for i in range(steps):
        with timer.part("data"):
            if i == 0:
                time.sleep(0.05)  # a slow read while the device is idle: exposed in full
            x = host.to(dev, non_blocking=True)
        with timer.part("forward"):
            y = x
            for _ in range(8):
                y = torch.tanh(w(y))
            loss = y.square().mean()
        with timer.part("backward"):
            loss.backward()
        with timer.part("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        with timer.part("comm"):
            torch.cuda._sleep(1_000_000)  # stands in for the norm all-reduce: device time between the marks
    torch.cuda.synchronize(dev)  # the loop's sync at a logged step
    wall = time.perf_counter() - t0
    for _ in range(steps):
        timer.end_step(wall / steps)
    means = timer.means()
    parts, step = dict(zip(PARTS, means)), means[-1]
    assert all(v > 0 for v in parts.values()), parts
    assert parts["data"] * steps >= 0.045  # the sleep is exposed: the device had nothing queued
    assert parts["backward"] > parts["optimizer"] and parts["forward"] > 0.1 * parts["backward"]
    assert abs(sum(parts.values()) - step) < 0.1 * step, (parts, step)
