"""Fault injection for rehearsals and tests, read from the environment once, by the per-rank entry point.

    CLUSTERTRAIN_INJECT_FAILURE=RANK:STEP     that rank raises before STEP (a crashed rank)
    CLUSTERTRAIN_INJECT_NAN=RANK:STEP         that rank's loss at STEP is NaN (the run must stop at STEP)
    CLUSTERTRAIN_INJECT_SLOW_DATA=RANK:SECONDS that rank sleeps SECONDS in its data path every step (a straggler)
    CLUSTERTRAIN_INJECT_HANG=RANK:STEP        that rank, at the start of STEP, waits in a receive no peer answers
                                              and stays there (a rank stuck in communication; the peers wait for
                                              it in their next collective); once per run
                                              directory, so the restarted job trains through

Unset: nothing is injected. A malformed value is one ConfigError line.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from clustertrain.core.errors import ConfigError
from clustertrain.train.callbacks import Callback

FAILURE_ENV = "CLUSTERTRAIN_INJECT_FAILURE"
NAN_ENV = "CLUSTERTRAIN_INJECT_NAN"
SLOW_DATA_ENV = "CLUSTERTRAIN_INJECT_SLOW_DATA"
HANG_ENV = "CLUSTERTRAIN_INJECT_HANG"
#: the point-to-point tag of the injected hang's receive (no rank ever sends with it)
HANG_TAG = 31337


@dataclass(frozen=True)
class Injections:
    """What this rank is told to do wrong."""

    fail_at_step: int | None = None
    nan_at_step: int | None = None
    slow_data_s: float = 0.0
    hang_at_step: int | None = None

    @classmethod
    def from_environ(cls, rank: int, environ: Mapping[str, str] | None = None) -> "Injections":
        env = os.environ if environ is None else environ
        fail = _for_rank(env, FAILURE_ENV, rank, "RANK:STEP, e.g. 1:5", int)
        nan = _for_rank(env, NAN_ENV, rank, "RANK:STEP, e.g. 0:7", int)
        slow = _for_rank(env, SLOW_DATA_ENV, rank, "RANK:SECONDS, e.g. 1:0.2", float)
        hang = _for_rank(env, HANG_ENV, rank, "RANK:STEP, e.g. 1:5", int)
        return cls(fail_at_step=fail, nan_at_step=nan, slow_data_s=slow or 0.0, hang_at_step=hang)

    def at_step_start(self) -> bool:
        """Whether an injection acts at the start of a step (:class:`FaultInjection`)."""
        return self.fail_at_step is not None or self.hang_at_step is not None


def _for_rank(env: Mapping[str, str], name: str, rank: int, form: str, kind: type) -> int | float | None:
    value = env.get(name)
    if not value:
        return None
    try:
        want, _, amount = value.partition(":")
        want_rank, parsed = int(want), kind(amount)
    except ValueError:
        raise ConfigError(f"{name}={value!r}: expected {form}") from None
    return parsed if want_rank == rank else None


class FaultInjection(Callback):
    """The injections that act at the start of a step, as a loop callback (:mod:`clustertrain.train.callbacks`):
    a failure raises; a hang waits for a message no peer sends (on the control group: the peers reach their next
    collective and wait there for this rank) and stays in it, once per run directory (a marker file), so
    that the run's restart trains through. NaN and slow data act inside the step (the loss scale, the data feed).
    ``phase``: sets the rank's heartbeat phase (the loop's callbacks), ``collective`` while it hangs."""

    def __init__(self, injections: Injections, run_dir: Path, rank: int, control, phase: Callable[[str], None]):
        self.injections, self.run_dir, self.rank, self.control, self.set_phase = injections, run_dir, rank, control, phase

    def step_started(self, step: int) -> None:
        if self.injections.fail_at_step is not None and step >= self.injections.fail_at_step:
            raise RuntimeError(f"injected failure at step {step} (CLUSTERTRAIN_INJECT_FAILURE)")
        if self.injections.hang_at_step == step:
            self._hang(step)

    def _hang(self, step: int) -> None:
        marker = Path(self.run_dir) / ".injected-hang"
        if marker.exists():
            return
        marker.touch()
        self.set_phase("collective")
        print(f"[clustertrain] rank {self.rank}: injected hang at step {step} (CLUSTERTRAIN_INJECT_HANG)",
              file=sys.stderr, flush=True)
        if self.control.distributed:
            import torch
            import torch.distributed as dist

            # a receive no peer ever sends, on the control group: the peers' next collective then waits for this rank.
            # Not a collective: on CPU ranks the control group is the default group, where an all-reduce of one float
            # would be matched against the peers' gradient all-reduce (gloo: "collective mismatch") and crash instead
            world = dist.get_world_size(self.control.group)
            peer = (dist.get_rank(self.control.group) + 1) % world
            dist.recv(torch.zeros(1), group_src=peer, group=self.control.group, tag=HANG_TAG)
        while True:  # a single process, or the collective timed out: stay stuck all the same
            time.sleep(60)
