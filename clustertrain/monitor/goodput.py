"""Goodput: where a run's allocated node-hours went, across every restart (``clustertrain status``, the report).

Pure functions over the run's records: the attempts of ``usage.json`` (one per start of the ranks: a requeue, a
resubmission, a resume each add one; :class:`clustertrain.core.run_events.Attempt`), the times of its events, and
its Slurm job records (``jobs.jsonl``, format: :mod:`clustertrain.core.job_records`; read here with the lenient JSON-lines
reader, only ``job_id``, ``submitted`` and ``ended``, so the monitor stage imports nothing of launch).

Each attempt's **allocated time** runs from its allocation start ``a`` (``allocated``, else ``started``) to its end
``e``: ``ended``; else *now* while its ranks run (the last attempt of a live run); else the latest sign that the
allocation was still held — its last heartbeat ``last``, a later event of the watchdog (a hang or a lost rank it
declared: :data:`HELD_SIGNS`), the job's recorded end (``jobs.jsonl``) for the job's last attempt — before the
next attempt's allocation began. Allocated time x nodes (``len(nodes)`` or 1) is node-time, accounted as exactly these
parts, which add up to it:

- **overhead** (restart overhead): ``a`` -> ``first_step`` (the first step finished: start-up, checkpoint load and
  the first step); an attempt with no finished step is all overhead;
- **stall**: ``stall_s``, the seconds training waited for checkpoint saves (at most the trained time left below);
- **lost** (lost work): an attempt that did not end COMPLETED or STOPPED loses the steps after its last committed
  checkpoint: ``max(saved_at, first_step)`` -> its last sign of progress ``L`` (``last``, within ``[a, e]``); with no
  checkpoint, ``first_step`` -> ``L``. An asynchronous save is committed while later steps train, so ``saved_at``
  can be moments before the failure although steps were lost: the lost time is at least those steps
  (``step - saved_step``) x ``step_time_s`` (never more than ``first_step`` -> ``L``). A running attempt has lost
  nothing yet;
- **idle**: ``L`` -> ``e``: after the last sign of progress until the attempt ended (hang detection, teardown,
  waiting for a backup); none while the attempt runs;
- **productive**: the rest, ``L - first_step - lost - stall`` (never below 0: the stall is capped to keep the sum
  exact).

**Queue wait** is not allocated time and is shown beside it: the job's submission (``jobs.jsonl`` ``submitted``), or
for a requeue the end of the job's previous attempt, -> the attempt's ``allocated``; unknown (None) for local runs
and attempts without ``allocated``. **Goodput** = productive / allocated node-hours over every attempt of the run
(:class:`Goodput`), or of every model of a project (:meth:`Goodput.combine`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from clustertrain.core.run_events import Attempt, Event, EventKind, read_jsonl
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.states import State

#: the parts of allocated time (each an ``<part>_s`` of :class:`AttemptGoodput`, ``<part>_h`` of :class:`Goodput`)
PARTS = ("productive", "overhead", "stall", "lost", "idle")
#: events that show an allocation was still held after the ranks' last heartbeat (the watchdog's verdicts)
HELD_SIGNS = (EventKind.HANG, EventKind.RANK_LOST, EventKind.NODE_SUSPECT)
_NORMAL_ENDS = (State.COMPLETED, State.STOPPED)


@dataclass(frozen=True)
class JobTimes:
    """What ``jobs.jsonl`` says of one Slurm job's times."""

    job_id: str
    submitted: float
    ended: float | None = None


@dataclass(frozen=True)
class AttemptGoodput:
    """One attempt's allocated time split into :data:`PARTS` (wall seconds; x ``nodes`` for node-time)."""

    job_id: str | None
    state: str
    nodes: int
    start: float                 # the allocation start
    end: float                   # the end counted (now while it runs)
    running: bool
    productive_s: float
    overhead_s: float
    stall_s: float
    lost_s: float
    idle_s: float
    queue_s: float | None        # submitted (or the job's previous attempt's end) -> allocated; not allocated time
    lost_steps: int              # steps trained after the last committed checkpoint, when the attempt failed

    @property
    def allocated_s(self) -> float:
        return self.end - self.start

    def part_s(self, part: str) -> float:
        return getattr(self, f"{part}_s")

    @property
    def outcome(self) -> str:
        """running | completed | stopped | failed | killed (it ended without recording how: no ``ended``)."""
        if self.running:
            return "running"
        return "killed" if self.state == State.RUNNING else self.state.lower()


@dataclass(frozen=True)
class Goodput:
    """The account of a run (or of a project, :meth:`combine`): node-hours per part, queue wait, goodput %."""

    allocated_h: float
    productive_h: float
    overhead_h: float
    stall_h: float
    lost_h: float
    idle_h: float
    queue_s: float | None        # summed queue wait (wall seconds) of the attempts where it is known
    percent: float | None        # productive / allocated x 100 (None with no allocated time)
    restarts: int                # attempts - 1
    attempts: list[AttemptGoodput] = field(default_factory=list)

    @classmethod
    def of(cls, attempts: Sequence[AttemptGoodput]) -> "Goodput":
        hours = {p: sum(a.part_s(p) * a.nodes for a in attempts) / 3600 for p in PARTS}
        allocated = sum(a.allocated_s * a.nodes for a in attempts) / 3600
        waits = [a.queue_s for a in attempts if a.queue_s is not None]
        return cls(allocated_h=allocated, **{f"{p}_h": hours[p] for p in PARTS},
                   queue_s=sum(waits) if waits else None,
                   percent=hours["productive"] / allocated * 100 if allocated > 0 else None,
                   restarts=max(0, len(attempts) - 1), attempts=list(attempts))

    @classmethod
    def combine(cls, runs: Iterable["Goodput | None"]) -> "Goodput":
        """The project's account: every attempt of every run (``restarts`` sums each run's)."""
        runs = [g for g in runs if g is not None]
        total = cls.of([a for g in runs for a in g.attempts])
        return replace(total, restarts=sum(g.restarts for g in runs), attempts=[])

    def hours(self, part: str) -> float:
        return getattr(self, f"{part}_h")


def read_job_times(paths: RunPaths) -> dict[str, JobTimes]:
    """job id -> its times from ``jobs.jsonl`` (none for a local run; a damaged line is skipped)."""
    out = {}
    for raw in read_jsonl(paths.jobs):
        job, submitted, ended = raw.get("job_id"), raw.get("submitted"), raw.get("ended")
        if isinstance(job, str) and _is_num(submitted):
            out[job] = JobTimes(job, float(submitted), float(ended) if _is_num(ended) else None)
    return out


def _is_num(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def account(attempts: Sequence[Attempt], now: float, live: bool = False, jobs: dict[str, JobTimes] | None = None,
            signs: Sequence[float] = ()) -> Goodput:
    """The goodput of a run's ``attempts`` (oldest first). ``live``: the last attempt's ranks run now (it counts to
    ``now``); ``jobs``: :func:`read_job_times`; ``signs``: times the run recorded something (its events), which show
    that an attempt killed without an end still held its allocation then."""
    jobs = jobs or {}
    starts = [_alloc_start(a) for a in attempts]
    out: list[AttemptGoodput] = []
    for i, a in enumerate(attempts):
        running = live and i == len(attempts) - 1 and a.ended is None and a.state == State.RUNNING
        until = starts[i + 1] if i + 1 < len(attempts) else now
        last_of_job = not any(b.job_id == a.job_id for b in attempts[i + 1:])
        end = now if running else _end(a, starts[i], until, jobs.get(a.job_id or "") if last_of_job else None, signs)
        previous = next((g.end for g in reversed(out) if g.job_id is not None and g.job_id == a.job_id), None)
        out.append(_split(a, starts[i], end, running, _queue(a, jobs.get(a.job_id or ""), previous)))
    return Goodput.of(out)


def _alloc_start(a: Attempt) -> float:
    return min(a.allocated, a.started) if a.allocated is not None else a.started


def _end(a: Attempt, start: float, until: float, job: JobTimes | None, signs: Sequence[float]) -> float:
    """When an attempt that is not running stopped holding its allocation (see the module docstring)."""
    if a.ended is not None:
        return max(start, a.ended)
    candidates = [*signs, *([job.ended] if job is not None and job.ended is not None else [])]
    return max(start, a.last, *(t for t in candidates if a.last < t <= until))


def _queue(a: Attempt, job: JobTimes | None, previous_end: float | None) -> float | None:
    if a.allocated is None or job is None:
        return None
    return max(0.0, a.allocated - max(job.submitted, previous_end or job.submitted))


def _split(a: Attempt, start: float, end: float, running: bool, queue: float | None) -> AttemptGoodput:
    """One attempt's parts (the module docstring's rules); they add up to ``end - start``."""
    nodes = len(a.nodes) or 1
    if a.first_step is None:
        return AttemptGoodput(a.job_id, str(a.state), nodes, start, end, running, 0.0, end - start, 0.0, 0.0, 0.0,
                              queue, 0)
    progress = end if running else min(max(a.last, start), end)
    first = min(max(a.first_step, start), progress)
    failed = not running and a.state not in _NORMAL_ENDS
    saved = a.saved_step if a.saved_step is not None else a.step_start
    lost_steps = max(0, a.step - saved) if failed else 0
    lost = 0.0
    if failed:
        kept = min(max(a.saved_at if a.saved_at is not None else first, first), progress)
        lost = min(progress - first, max(progress - kept, lost_steps * (a.step_time_s or 0.0)))
    stall = min(max(0.0, a.stall_s), progress - first - lost)
    productive = progress - first - lost - stall
    return AttemptGoodput(a.job_id, str(a.state), nodes, start, end, running, productive, first - start, stall, lost,
                          end - progress, queue, lost_steps)


def run_goodput(paths: RunPaths, attempts: Sequence[Attempt], events: Sequence[Event], live: bool,
                now: float) -> Goodput | None:
    """:func:`account` of a run directory's records (its job records, and the watchdog's events as signs of a held
    allocation: :data:`HELD_SIGNS`); None when it has no attempt."""
    if not attempts:
        return None
    signs = [e.time for e in events if e.kind in HELD_SIGNS]
    return account(attempts, now, live, read_job_times(paths), signs)
