"""Per-rank step timing: where each rank's time per step goes — data, forward, backward, optimizer and exposed
communication (:data:`PARTS`) — from marks around what the loop already does. Each rank appends one line per logged
step to ``RUN_DIR/timing/rank<R>.jsonl`` (format: :class:`clustertrain.core.run_events.TimingRow`); at the same logged
step every rank's means travel to rank 0 with the loss, in the one gather that replaces the loss all-reduce
(:meth:`StepTimer.gather`), so the timing adds no collective of its own.

How a part is measured:

* On CPU, wall time (``time.perf_counter``) between the marks.
* On a GPU, CUDA events recorded on the current stream at each mark (``torch.cuda.Event(enable_timing=True)``,
  ``Event.record`` / ``Event.elapsed_time``: torch/cuda/streams.py), read at the logged step, where the loop
  synchronises anyway: no host sync in between. The CPU runs ahead of the device, so wall time would measure how
  fast Python queues kernels; the events measure the device's timeline instead. What lies between two marks on the
  device is the work queued between them *plus any time the device sat idle waiting for the CPU to queue more*:
  a part the CPU is slow in (reading a batch, waiting in a CPU collective such as the stop agreement or the metrics
  gather) shows only as far as it starved the device — its *exposed* time. Gradient collectives that DDP/FSDP2 run
  on their own streams show in ``backward`` as far as the compute stream waited for them; the norm all-reduce and
  the loop's own collectives are ``comm``.

Parts may nest (a batch read lazily inside a forward): the inner part's time is taken out of the outer one, so the
parts of a step add up to the time between the first mark and the last one and nothing is counted twice.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from clustertrain.core.run_events import PARTS, TIMING_VERSION, TimingRow
from clustertrain.train.alarms import RankTiming

__all__ = ["PARTS", "StepTimer"]


class StepTimer:
    """Accumulates this rank's time per part over the steps since the last logged one. ``device``: where the step
    computes (a CUDA device: the parts are timed with CUDA events); ``path`` None: keep the sums, write nothing."""

    def __init__(self, rank: int, node: str, path: Path | None, device: torch.device | str | None = None):
        self.rank, self.node, self.path = rank, node, path
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        self._sums = dict.fromkeys(PARTS, 0.0)
        self._step_sum = 0.0
        self._steps = 0
        self._stack: list[str] = []           # the parts entered and not yet left, innermost last
        self._open = None                     # the mark where the innermost part's current segment began
        self._segments: list[tuple[str, object, object]] = []  # CUDA: (part, start event, end event), unread
        self._free: list = []                 # CUDA events already read, recorded again by the next marks
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")

    # -- the loop's side ---------------------------------------------------------------------------------
    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block as part ``name`` (of :data:`PARTS`)."""
        if name not in self._sums:
            raise ValueError(f"timing part {name!r} is not one of {', '.join(PARTS)}")
        mark = self._mark()
        if self._stack:  # the outer part pauses
            self._close(self._stack[-1], mark)
        self._stack.append(name)
        self._open = mark
        try:
            yield
        finally:
            mark = self._mark()
            self._close(self._stack.pop(), mark)
            self._open = mark  # the outer part, if any, resumes here

    def end_step(self, step_s: float) -> None:
        """A step took ``step_s`` seconds (the loop's clock)."""
        self._step_sum += step_s
        self._steps += 1

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record()  # on the current stream (torch/cuda/streams.py Event.record)
        return event

    def _close(self, name: str, mark) -> None:
        if self.cuda:
            self._segments.append((name, self._open, mark))
        else:
            self._sums[name] += mark - self._open

    # -- at a logged step (the loop has synchronised the device) ------------------------------------------
    def _read_events(self) -> None:
        if not self._segments:
            return
        reused = set()
        for name, start, end in self._segments:
            end.synchronize()  # done already: the loop synchronised the device before this logged step
            self._sums[name] += start.elapsed_time(end) / 1000
            for e in (start, end):
                if id(e) not in reused and e is not self._open:  # the open mark is still needed
                    reused.add(id(e))
                    self._free.append(e)
        self._segments.clear()

    def means(self) -> list[float]:
        """Mean seconds per step over the interval: one per part of :data:`PARTS`, then the whole step."""
        self._read_events()
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
        means = self.means()
        if self._file is not None:
            parts = {f"{p}_s": round(v, 6) for p, v in zip(PARTS, means)}
            row = TimingRow(version=TIMING_VERSION, step=step, steps=self._steps, rank=self.rank, node=self.node, step_s=round(means[-1], 6),
                            time=time.time(), **parts)
            self._file.write(row.model_dump_json() + "\n")
            self._file.flush()
        self._sums = dict.fromkeys(PARTS, 0.0)
        self._step_sum = 0.0
        self._steps = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
