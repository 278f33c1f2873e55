"""The trainer's alarm rules, as pure functions of what rank 0 logs (no I/O, no torch): a loss spike, a drop in
tokens/s, and a straggler among the ranks. Rank 0 feeds them every logged step
(:class:`clustertrain.train.run_recorder.RunWatch`) and writes what they return to ``events.jsonl``
(:mod:`clustertrain.core.run_events`). Each rule fires when its condition starts and re-arms when it clears, so a
long bad stretch is one event, not one per step. Thresholds: the ``monitor:`` section (:class:`MonitorConfig`).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from clustertrain.monitor.config import MonitorConfig
from clustertrain.core.run_events import Event, EventKind, Severity

#: fewer logged values than this in the window: too early to call anything a spike or a drop
MIN_HISTORY = 5
#: a rank is slow in a part only by more than this share of the median step time (timer noise on tiny parts)
MIN_GAP_SHARE = 0.05
#: the parts a rank can be slow in by itself, and the time that measures each: a rank's forward pass is its own
#: compute (no collective in it under DDP), while its backward also holds the wait for slower peers inside the
#: overlapped gradient collectives, so comparing whole compute times would blame the fast ranks
OWN_PARTS = {"data": "data_s", "compute": "forward_s"}


class LossSpike:
    """A logged loss above ``loss_spike_factor`` x the median of the previous ``loss_window`` logged losses."""

    def __init__(self, config: MonitorConfig):
        self.factor = config.loss_spike_factor
        self.window: deque[float] = deque(maxlen=config.loss_window)
        self.active = False

    def check(self, step: int, loss: float) -> Event | None:
        event = None
        if len(self.window) >= MIN_HISTORY:
            median = statistics.median(self.window)
            limit = self.factor * median
            spiking = median > 0 and loss > limit
            if spiking and not self.active:
                event = Event(kind=EventKind.LOSS_SPIKE, step=step, value=loss, threshold=limit,
                              message=f"loss spike at step {step}: {loss:.4g} is above {self.factor:g} x the median "
                                      f"{median:.4g} of the last {len(self.window)} logged steps")
            self.active = spiking
        if not self.active:  # a spike does not raise the baseline it is measured against
            self.window.append(loss)
        return event


class ThroughputDrop:
    """Tokens/s below ``throughput_drop`` x the median of the previous ``loss_window`` logged values. The first
    logged step (start-up, compilation) is not counted."""

    def __init__(self, config: MonitorConfig):
        self.fraction = config.throughput_drop
        self.window: deque[float] = deque(maxlen=config.loss_window)
        self.active = False
        self.seen = 0

    def check(self, step: int, tokens_per_s: float) -> Event | None:
        self.seen += 1
        if self.seen == 1:
            return None
        event = None
        if len(self.window) >= MIN_HISTORY:
            median = statistics.median(self.window)
            limit = self.fraction * median
            dropped = tokens_per_s < limit
            if dropped and not self.active:
                event = Event(kind=EventKind.THROUGHPUT_DROP, step=step, value=tokens_per_s, threshold=limit,
                              message=f"throughput drop at step {step}: {tokens_per_s:,.0f} tokens/s is below "
                                      f"{self.fraction:g} x the median {median:,.0f} of the last {len(self.window)} logged steps")
            self.active = dropped
        if not self.active:  # a drop does not drag the baseline down with it
            self.window.append(tokens_per_s)
        return event


@dataclass(frozen=True)
class RankTiming:
    """One rank's mean time per step over a logged interval (what rank 0 gathers): the parts of
    :data:`clustertrain.core.run_events.PARTS`, then the whole step."""

    rank: int
    node: str
    data_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    comm_s: float
    step_s: float

    @property
    def compute_s(self) -> float:
        """forward + backward + optimizer."""
        return self.forward_s + self.backward_s + self.optimizer_s

    def part(self, name: str) -> float:
        """The time that measures part ``name`` (see OWN_PARTS)."""
        return getattr(self, OWN_PARTS[name])


@dataclass(frozen=True)
class Spread:
    """The metrics row's view of the ranks at one logged step."""

    slowest_rank: int
    slowest_node: str
    slowest_part: str      # data | compute: where the slowest rank is furthest above its peers
    spread_s: float        # max - min over ranks of their own time (data + forward)


def spread(timings: list[RankTiming]) -> Spread | None:
    if not timings:
        return None
    medians = {p: statistics.median(t.part(p) for t in timings) for p in OWN_PARTS}
    slowest, part, excess = timings[0], "data", float("-inf")
    for t in timings:
        for p in OWN_PARTS:
            if t.part(p) - medians[p] > excess:
                slowest, part, excess = t, p, t.part(p) - medians[p]
    own = [t.data_s + t.forward_s for t in timings]
    return Spread(slowest.rank, slowest.node, part, max(own) - min(own))


class Stragglers:
    """A rank whose data or compute time per step (compute measured by its forward pass: OWN_PARTS) is above
    ``straggler_factor`` x the median of all ranks (and by more than 5% of the median step time) at
    ``straggler_steps`` logged steps in a row. Only a rank's own work is compared: the ranks that wait for a slow
    one show it as communication or inside backward, which is the symptom, not the cause."""

    def __init__(self, config: MonitorConfig):
        self.factor = config.straggler_factor
        self.needed = config.straggler_steps
        self.streak: dict[tuple[int, str], int] = {}

    def check(self, step: int, timings: list[RankTiming]) -> list[Event]:
        if len(timings) < 2:
            return []
        floor = MIN_GAP_SHARE * statistics.median(t.step_s for t in timings)
        events = []
        for p in OWN_PARTS:
            median = statistics.median(t.part(p) for t in timings)
            limit = max(self.factor * median, median + floor)
            for t in timings:
                key = (t.rank, p)
                if t.part(p) <= limit:
                    self.streak.pop(key, None)
                    continue
                self.streak[key] = self.streak.get(key, 0) + 1
                if self.streak[key] == self.needed:
                    events.append(Event(
                        kind=EventKind.STRAGGLER, severity=Severity.WARNING, step=step, rank=t.rank, node=t.node, part=p,
                        value=t.part(p), threshold=limit,
                        message=f"straggler: rank {t.rank} on {t.node} is slow in {p}: {OWN_PARTS[p].removesuffix('_s')} "
                                f"{t.part(p):.3f} s/step vs {median:.3f} s median of {len(timings)} ranks, "
                                f"{self.needed} logged steps in a row"))
        return events
