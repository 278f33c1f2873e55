"""Fault injection for rehearsals and tests, read from the environment once, by the per-rank entry point.

    CLUSTERTRAIN_INJECT_FAILURE=RANK:STEP     that rank raises before STEP (a crashed rank)
    CLUSTERTRAIN_INJECT_NAN=RANK:STEP         that rank's loss at STEP is NaN (the run must stop at STEP)
    CLUSTERTRAIN_INJECT_SLOW_DATA=RANK:SECONDS that rank sleeps SECONDS in its data path every step (a straggler)
    CLUSTERTRAIN_INJECT_HANG=RANK:STEP        that rank, at the start of STEP, enters a collective its peers never
                                              join and stays there (a rank stuck in an all-reduce; the peers wait
                                              for it in their gradient all-reduce); once per run
                                              directory, so the restarted job trains through

Unset: nothing is injected. A malformed value is one ConfigError line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from clustertrain.core.errors import ConfigError

FAILURE_ENV = "CLUSTERTRAIN_INJECT_FAILURE"
NAN_ENV = "CLUSTERTRAIN_INJECT_NAN"
SLOW_DATA_ENV = "CLUSTERTRAIN_INJECT_SLOW_DATA"
HANG_ENV = "CLUSTERTRAIN_INJECT_HANG"


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
