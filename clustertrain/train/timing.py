"""Per-rank step timing: where each rank's time per step goes (data, compute, comm), from timestamps around what
the loop already does. Each rank appends one line per logged step to ``RUN_DIR/timing/rank<R>.jsonl`` (format:
:mod:`clustertrain.core.run_events`, ``TimingRow``); at the same logged step every rank's means travel to rank 0
with the loss, in the one gather that replaces the loss all-reduce (:meth:`StepTimer.gather`), so the timing adds
no collective of its own.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from clustertrain.train.alarms import RankTiming

PARTS = ("data", "forward", "compute", "comm")  # forward is also part of compute


class StepTimer:
    """Accumulates this rank's time per part over the steps since the last logged one."""

    def __init__(self, rank: int, node: str, path: Path | None):
        self.rank, self.node, self.path = rank, node, path  # path None: keep the sums, write nothing
        self._sums = dict.fromkeys(PARTS, 0.0)
        self._step_sum = 0.0
        self._steps = 0
        self._events: list = []  # CUDA (start, end) events of this interval's forward passes
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sums[name] += time.perf_counter() - t0

    def add(self, name: str, seconds: float) -> None:
        self._sums[name] += seconds

    def end_step(self, step_s: float) -> None:
        self._step_sum += step_s
        self._steps += 1

    @contextmanager
    def forward(self, device: torch.device) -> Iterator[None]:
        """Time a forward pass: wall time on CPU; on a GPU, CUDA events (the kernels run after the call returns),
        read at the next logged step, where the loop synchronises anyway."""
        if device.type != "cuda":
            with self.part("forward"):
                yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            yield
        finally:
            end.record()
            self._events.append((start, end))

    def means(self) -> list[float]:
        """data, forward, compute, comm, step: mean seconds per step over the interval."""
        for start, end in self._events:
            end.synchronize()
            self._sums["forward"] += start.elapsed_time(end) / 1000
        self._events.clear()
        n = max(1, self._steps)
        return [self._sums[p] / n for p in PARTS] + [self._step_sum / n]

    def gather(self, loss: float, group, world_size: int) -> tuple[list[float], list[RankTiming]]:
        """Every rank's loss and timing means at a logged step (a collective on the CPU ``group``; every rank calls
        it). Returns the losses by rank and the timings by rank."""
        mine = torch.tensor([loss, *self.means()], dtype=torch.float64)
        if world_size > 1 and dist.is_initialized():
            rows = [torch.empty_like(mine) for _ in range(world_size)]
            dist.all_gather(rows, mine, group=group)
        else:
            rows = [mine]
        return [float(r[0]) for r in rows], [RankTiming(i, "", *(float(v) for v in r[1:])) for i, r in enumerate(rows)]

    def log(self, step: int) -> None:
        """Write this rank's line for ``step`` and start a new interval."""
        if self._file is not None:
            data, forward, compute, comm, step_s = self.means()
            row = {"step": step, "steps": self._steps, "rank": self.rank, "node": self.node, "data_s": round(data, 6),
                   "forward_s": round(forward, 6), "compute_s": round(compute, 6), "comm_s": round(comm, 6),
                   "step_s": round(step_s, 6), "time": time.time()}
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        self._sums = dict.fromkeys(PARTS, 0.0)
        self._step_sum = 0.0
        self._steps = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
