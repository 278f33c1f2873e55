"""What the ranks agree on at each step boundary, on the CPU: whether to stop, and which asynchronous checkpoint
every rank has finished writing (so it is committed at the same step everywhere).

**One control group.** The agreement, the gathered node names and the logged loss/timings travel on one CPU
process group: the default group itself when it is gloo (CPU ranks: no second group, so no second all-pairs
connection through the TCP store at start), else one gloo group over the world made at the first use (GPU ranks:
NCCL's default group would make every such exchange a device round trip). ``dist.new_group`` is collective, so the
first use must come at the same point on every rank: it does, the trainer's first gather of node names.

**Without a per-step sync point.** Each step boundary starts an all-reduce (MIN) of this rank's two numbers —
0 when it has a stop request, and the step of its finished async save (else -1) — and reads the one started a
boundary earlier (long finished by then). Ranks therefore agree at the same step, at the cost of one step of delay.
Megatron-LM's ``AsyncCallsQueue`` all-reduces "is done" the same way before finalising a save.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class Control:
    """The stop and async-commit agreement of one run of the ranks."""

    def __init__(self) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        self._group = None
        self._made = False
        self._flag: torch.Tensor | None = None
        self._work = None

    @property
    def group(self):
        """The CPU group (None: the default group, which is gloo) — made on first use when the default is not gloo."""
        if self.distributed and not self._made:
            self._made = True
            if dist.get_backend() != "gloo":
                self._group = dist.new_group(backend="gloo")
        return self._group

    def gather_objects(self, mine) -> list:
        """Every rank's ``mine``, by rank (one collective on the control group)."""
        if not self.distributed:
            return [mine]
        out: list = [None] * dist.get_world_size()
        dist.all_gather_object(out, mine, group=self.group)
        return out

    def start(self, stop_requested: bool, finished_step: int) -> None:
        """Start this boundary's agreement (asynchronously): this rank's stop request and finished async save."""
        if not self.distributed:  # one process agrees with itself at once: the trainer asks it directly
            return
        self._flag = torch.tensor([0 if stop_requested else 1, finished_step], dtype=torch.int32)
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MIN, group=self.group, async_op=True)

    def finish(self) -> tuple[bool, int]:
        """The answer of the agreement in flight: (some rank asked to stop, the step of the async save every rank
        has finished writing, or -1). (False, -1) when none is in flight."""
        if self._flag is None:
            return False, -1
        if self._work is not None:
            self._work.wait()
            self._work = None
        no_stop, finished = (int(v) for v in self._flag.tolist())
        self._flag = None
        return no_stop == 0, finished
