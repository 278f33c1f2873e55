"""Rank 0's record of a run while it trains: ``status.json`` says RUNNING from the first step and the final state at
the end (written by the run itself, not inferred later), ``usage.json`` gets one attempt per start of the ranks with
a heartbeat at logged steps (at most every ``HEARTBEAT_S``), and the alarms of :mod:`clustertrain.train.alarms` go to ``events.jsonl``
(formats: :mod:`clustertrain.core.run_records`, :mod:`clustertrain.core.run_events`). Recording never stops training: a
write that fails is reported once on stderr and skipped.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import asdict, replace
from typing import Any

from clustertrain.train.alarms import LossSpike, RankTiming, Stragglers, ThroughputDrop, spread
from clustertrain.monitor.config import MonitorConfig
from clustertrain.core.run_events import Attempt, Event, EventKind, Severity, append_event, read_usage, write_usage
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import RunStatus, write_status_record
from clustertrain.core.states import State

#: usage.json's heartbeat is written at a logged step at most this often (a killed attempt loses at most this much)
HEARTBEAT_S = 5.0
#: set by the batch script (its start: when the allocation began) and by the local launcher (Unix seconds)
ALLOCATED_ENV = "CLUSTERTRAIN_ALLOCATED_AT"
#: set by the batch script: seconds the stop signal gives before the time limit (launch.signal_grace_s)
GRACE_ENV = "CLUSTERTRAIN_SIGNAL_GRACE_S"


def _env_float(name: str) -> float | None:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


def node_name() -> str:
    """This node's name as Slurm calls it (SLURMD_NODENAME, also under emulated nodes), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def job_id() -> str:
    """The Slurm job id, or ``local-<rank 0's pid>`` (the local launcher's job id)."""
    return os.environ.get("SLURM_JOB_ID") or f"local-{os.getpid()}"


class RunWatch:
    def __init__(self, paths: RunPaths, config: MonitorConfig, nodes: list[str], gpus: int, world_size: int, step: int):
        self.paths, self.config, self.nodes = paths, config, nodes
        self._warned = False
        now = time.time()
        self.attempt = Attempt(started=now, last=now, job_id=job_id(), nodes=list(dict.fromkeys(nodes)), gpus=gpus,
                               world_size=world_size, step_start=step, step=step, pid=os.getpid(), host=node_name(),
                               allocated=_env_float(ALLOCATED_ENV))
        self.usage = read_usage(paths)
        self.usage.attempts.append(self.attempt)
        self._guard(write_usage, paths, self.usage)
        self._written = now
        self._guard(write_status_record, paths, RunStatus(state=State.RUNNING, step=step, pid=os.getpid(), time=now))
        self.rules = (LossSpike(config), ThroughputDrop(config))
        self.stop_saved_s: float | None = None
        self.stragglers = Stragglers(config)

    def logged(self, row: dict[str, Any], timings: list[RankTiming]) -> dict[str, Any]:
        """A logged step: fields for its metrics row (the slowest rank and the spread), alarms to events.jsonl, the
        heartbeat to usage.json."""
        step = row["step"]
        self.attempt.step, self.attempt.last = step, time.time()
        if self.attempt.last - self._written >= HEARTBEAT_S:  # an fsynced rename: not at every step of a fast run
            self._written = self.attempt.last
            self._guard(write_usage, self.paths, self.usage)
        timings = [replace(t, node=self.nodes[t.rank] if t.rank < len(self.nodes) else "?") for t in timings]
        events = [self.rules[0].check(step, row["loss"]), self.rules[1].check(step, row["tokens_per_s"])]
        events += self.stragglers.check(step, timings)
        for event in events:
            if event is not None:
                self.event(event)
        s = spread(timings) if len(timings) > 1 else None
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(s).items()} if s else {}

    def stepped(self, step: int, step_time_s: float) -> None:
        """A step finished (every step; no I/O here): the attempt's first step, its latest progress."""
        now = time.time()
        if self.attempt.first_step is None:
            self.attempt.first_step = now
        self.attempt.step, self.attempt.last, self.attempt.step_time_s = step, now, round(step_time_s, 5)

    def stalled(self, seconds: float) -> None:
        """Training waited ``seconds`` for a checkpoint save (staging an async one, or all of a synchronous one)."""
        self.attempt.stall_s = round(self.attempt.stall_s + seconds, 4)

    def committed(self, step: int, path: Any, save_s: float | None, stop_received: float | None) -> None:
        """A checkpoint is complete: the attempt's last saved step, a ``checkpoint`` event with how long it took; when
        it is the save a stop signal asked for, a ``preempt_save`` event saying whether it landed in the time the
        signal gave (and the job log says it in one line)."""
        now = time.time()
        self.attempt.saved_step, self.attempt.saved_at = step, now
        self._guard(write_usage, self.paths, self.usage)
        self._written = now
        self.event(Event(kind=EventKind.CHECKPOINT, severity=Severity.INFO, step=step,
                         value=round(self.attempt.stall_s, 4),
                         threshold=None if save_s is None else round(save_s, 3),
                         message=f"checkpoint {getattr(path, 'name', path)} committed"
                                 + (f" {save_s:.1f} s after its save began" if save_s is not None else "")),
                   echo=False)
        if stop_received is None:
            return
        took, grace = now - stop_received, _env_float(GRACE_ENV)
        landed = grace is None or took <= grace
        if grace is None:
            message = f"the stop checkpoint {getattr(path, 'name', path)} was committed {took:.1f} s after the signal"
        else:
            message = (f"the stop checkpoint {getattr(path, 'name', path)} was committed {took:.1f} s after the signal, "
                       f"which gave {grace:.0f} s: " + ("landed before the kill" if landed else
                                                        "later than the signal allowed; raise launch.signal_grace_s"))
        severity = Severity.INFO if landed else Severity.WARNING  # a save that landed is routine
        self.event(Event(kind=EventKind.PREEMPT_SAVE, severity=severity, step=step, value=round(took, 3),
                         threshold=grace, message=message), echo=False)
        print(f"[clustertrain] {message}", flush=True)
        self.stop_saved_s = round(took, 3)

    def stop_signal(self, step: int, signal_name: str | None, received: float) -> None:
        """The ranks agreed to stop after ``step`` because of a signal (rank 0's or a peer's)."""
        self.event(Event(kind=EventKind.STOP_SIGNAL, severity=Severity.INFO, time=received, step=step,
                         message=f"{signal_name or 'a peer rank'} asked the ranks to save and stop after step {step}"),
                   echo=False)

    def event(self, event: Event, echo: bool = True) -> None:
        """Record ``event``; ``echo``: also say it on stderr (rank 0's log)."""
        self._guard(append_event, self.paths.events, event)
        if echo:
            print(f"[clustertrain] {event.severity}: {event.message}", file=sys.stderr, flush=True)

    def finish(self, state: State, step: int) -> None:
        """The attempt ended (usage.json); status.json's final record is written by the caller with its fields."""
        now = time.time()
        self.attempt.state, self.attempt.step, self.attempt.last, self.attempt.ended = state, step, now, now
        self._guard(write_usage, self.paths, self.usage)

    def fail(self, step: int, message: str) -> None:
        """The ranks failed: the attempt and status.json say FAILED, with ``message``."""
        self.finish(State.FAILED, step)
        self._guard(write_status_record, self.paths, RunStatus(state=State.FAILED, step=step, pid=os.getpid(),
                                                               time=time.time(), message=message))

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except OSError as e:
            if not self._warned:
                print(f"[clustertrain] warning: could not record the run's state ({e}); training goes on",
                      file=sys.stderr, flush=True)
                self._warned = True
