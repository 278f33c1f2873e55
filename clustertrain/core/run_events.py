"""What a run records about itself while it trains, beside ``metrics.jsonl``: events, per-rank step timing and
usage (where each file lies: :class:`clustertrain.core.run_paths.RunPaths`). Every reader here is lenient: a missing
file is nothing recorded, a line cut short by a kill is skipped.

``events.jsonl`` (rank 0's alarms; :func:`append_event`) and ``monitor/<node>.events.jsonl`` (each node's
sampler: GPU events; one writer per file, so no two nodes append to one file on a shared file system). One
:class:`Event` per line, read together, oldest first, by :func:`read_events`::

    {"version": 1, "time": 1795000123.4, "kind": "straggler", "severity": "warning", "step": 120,
     "message": "rank 3 on node-2 is slow in data: 0.412 s/step vs 0.011 s median, 3 logged steps in a row",
     "rank": 3, "node": "node-2", "gpu": null, "part": "data", "value": 0.412, "threshold": 0.0165}

Kinds (:class:`EventKind`): ``nonfinite`` (error: the run stopped), ``loss_spike``, ``throughput_drop``,
``straggler``, ``stop_signal``, ``preempt_save`` (``value``: seconds from the signal to the committed checkpoint,
``threshold``: the seconds the signal gave), ``checkpoint`` (``value``: seconds training stalled for the save,
``threshold``: seconds until it was committed) (rank 0); severities: ``info`` for the routine ones (``checkpoint``,
``stop_signal``, a ``preempt_save`` that landed within the signal's grace), ``warning`` for a late ``preempt_save``
and the alarms, ``error`` where the run stopped or a GPU failed; ``gpu_temperature``, ``gpu_throttle``, ``gpu_ecc``,
``gpu_xid``, ``sampler_failed`` (the sampler); ``hang``, ``rank_lost``, ``node_suspect`` (the watchdog,
:mod:`clustertrain.monitor.hang_watchdog`); ``tracker_down`` (warning: an experiment tracker failed, once per
tracker and attempt; :mod:`clustertrain.monitor.trackers`).

``timing/rank<R>.jsonl`` (each rank its own; :class:`TimingRow`, version 2): one line per logged step, the mean per
step over the steps since the previous logged one (:class:`clustertrain.train.timing.StepTimer`)::

    {"version": 2, "step": 120, "steps": 10, "rank": 3, "node": "node-2", "data_s": 0.012, "forward_s": 0.061,
     "backward_s": 0.122, "optimizer_s": 0.018, "comm_s": 0.004, "compute_s": 0.201, "step_s": 0.23,
     "time": 1795000123.4}

The parts (:data:`PARTS`): ``data_s`` fetching the step's micro-batches (and copying them to the GPU);
``forward_s`` the forward passes (the rank's own work: what the straggler rule compares); ``backward_s`` the
backward passes, with the gradient collectives DDP/FSDP overlap with them as far as they are not hidden (a rank that
waits there for a slow peer shows it here); ``optimizer_s`` clipping and AdamW (the norm's own reduction is comm
when the layout needs one); ``comm_s`` exposed communication: waiting in the loop's own collectives (the
gradient-norm reduction under FSDP/TP/PP, the metrics gather, the step-boundary stop check); ``step_s`` the whole
step. On a GPU every part is measured on the device's timeline with CUDA events (what the device spent between the
part's marks, idle time waiting for the CPU included: the part's *exposed* time), so the parts add up to the step.
``compute_s`` = forward + backward + optimizer, written for readers of version 1.

Version 1 rows (no ``version`` field: before per-part timing) carry ``data_s``, ``forward_s``, ``compute_s`` (forward,
backward and optimizer together) and ``comm_s``; they read as ``backward_s = compute_s - forward_s`` (backward and
optimizer together) and ``optimizer_s = 0``.

``usage.json`` (:class:`Usage`; rank 0 writes it when the ranks start, at logged steps at most every 5 s, and when
they end):
one :class:`Attempt` per start of the ranks (a requeue, a resume), so GPU-hours and cost add up across them::

    {"version": 1, "clustertrain": "0.1.0", "attempts": [{"started": 1795000000.0, "last": 1795000123.4,
     "ended": null, "state": "RUNNING", "job_id": "4242", "nodes": ["node-1", "node-2"], "gpus": 16,
     "world_size": 16, "step_start": 0, "step": 120, "pid": 777, "host": "node-1"}]}

``gpus`` counts the attempt's GPUs, or its ranks when it trains on CPUs; ``last`` is the last time rank 0 was
seen alive (a killed attempt's end). For the goodput account (:mod:`clustertrain.monitor.goodput`) an attempt also
records ``allocated`` (when its allocation began), ``first_step`` (when its first step finished), ``stall_s``
(seconds training waited for checkpoint saves), ``saved_step``/``saved_at`` (its last committed checkpoint) and
``step_time_s`` (the mean step time at the last logged step).
"""

from __future__ import annotations

import json
import os
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from clustertrain.core.errors import RunDirError
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import StoredRecord, read_record, write_record
from clustertrain.core.schema import StoredModel
from clustertrain.core.states import State


class EventKind(StrEnum):
    NONFINITE = "nonfinite"
    LOSS_SPIKE = "loss_spike"
    THROUGHPUT_DROP = "throughput_drop"
    STRAGGLER = "straggler"
    GPU_TEMPERATURE = "gpu_temperature"
    GPU_THROTTLE = "gpu_throttle"
    GPU_ECC = "gpu_ecc"
    GPU_XID = "gpu_xid"
    SAMPLER_FAILED = "sampler_failed"
    HANG = "hang"                    # the watchdog: no progress past the bound (names the ranks behind)
    RANK_LOST = "rank_lost"          # the watchdog: a rank's heartbeat stopped (process or node gone)
    NODE_SUSPECT = "node_suspect"    # a node went on the project's suspect list (clustertrain.monitor.suspects)
    STOP_SIGNAL = "stop_signal"      # rank 0 got the stop signal (preemption, time limit, scancel --signal)
    PREEMPT_SAVE = "preempt_save"    # the checkpoint saved because of it is committed: value = seconds after the signal
    CHECKPOINT = "checkpoint"        # a checkpoint committed: value = seconds training stalled for it, threshold = save s
    TRACKER_DOWN = "tracker_down"    # an experiment tracker failed (clustertrain.monitor.trackers): training goes on


class Severity(StrEnum):
    INFO = "info"          # routine: a checkpoint committed, a stop signal, a preemption save that landed
    WARNING = "warning"
    ERROR = "error"


class Event(StoredModel):
    """One event of a run (see the module docstring)."""

    version: int = Field(1, description="Number of the record's format.")
    time: float = Field(default_factory=time.time, description="When it happened (Unix seconds).")
    kind: str = Field(..., description="An EventKind (kept as text: a newer clustertrain may add kinds).")
    severity: Severity = Field(Severity.WARNING, description="info | warning | error.")
    step: int | None = Field(None, description="The training step it is about.")
    message: str = Field(..., description="One line for people.")
    rank: int | None = Field(None, description="The rank it is about.")
    node: str | None = Field(None, description="The node it is about.")
    gpu: int | None = Field(None, description="The GPU index on that node.")
    part: str | None = Field(None, description="Straggler: data | compute | comm.")
    value: float | None = Field(None, description="The measured value.")
    threshold: float | None = Field(None, description="The limit it crossed.")


def append_event(path: Path, event: Event) -> None:
    """Append ``event`` as one line (one ``write`` on an ``O_APPEND`` descriptor: a reader never sees half of
    another writer's line interleaved with it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (event.model_dump_json() + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; a missing file is none, a damaged or cut line is skipped."""
    return read_jsonl_counted(path)[0]


def read_jsonl_counted(path: Path) -> tuple[list[dict[str, Any]], int]:
    """:func:`read_jsonl`, and how many non-blank lines were skipped (a line cut by a kill, damage)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:  # missing, a directory, unreadable: nothing recorded
        return [], 0
    out, skipped = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        if isinstance(value, dict):
            out.append(value)
        else:
            skipped += 1
    return out, skipped


def read_events(paths: RunPaths) -> list[Event]:
    """Rank 0's events and every node sampler's, oldest first."""
    files = [paths.events, *sorted(paths.monitor.glob("*.events.jsonl"))] if paths.monitor.is_dir() else [paths.events]
    events = []
    for f in files:
        for raw in read_jsonl(f):
            try:
                events.append(Event.model_validate(raw))
            except ValidationError:
                continue
    return sorted(events, key=lambda e: e.time)


class TimingRow(StoredModel):
    """One rank's timing of one logged step (see the module docstring)."""

    version: int = 1              # a row without the field was written before version 2
    step: int
    steps: int = 1
    rank: int
    node: str
    data_s: float
    forward_s: float = 0.0
    backward_s: float | None = None
    optimizer_s: float | None = None
    comm_s: float
    compute_s: float | None = None
    step_s: float
    time: float

    def model_post_init(self, __context: Any) -> None:
        if self.backward_s is None:  # version 1: compute held forward, backward and optimizer
            self.backward_s = max(0.0, (self.compute_s or 0.0) - self.forward_s)
        if self.optimizer_s is None:
            self.optimizer_s = 0.0
        if self.compute_s is None:
            self.compute_s = self.forward_s + self.backward_s + self.optimizer_s


#: the parts of a step a rank's time is split into (``<part>_s`` fields of :class:`TimingRow`), in step order
PARTS = ("data", "forward", "backward", "optimizer", "comm")
TIMING_VERSION = 2


def read_timing(paths: RunPaths) -> dict[int, list[TimingRow]]:
    """rank -> its timing rows, by step (for a step logged twice, after a resume, the later row)."""
    out: dict[int, list[TimingRow]] = {}
    if not paths.timing.is_dir():
        return out
    for f in sorted(paths.timing.glob("rank*.jsonl")):
        by_step: dict[int, TimingRow] = {}
        for raw in read_jsonl(f):
            try:
                row = TimingRow.model_validate(raw)
            except ValidationError:
                continue
            by_step[row.step] = row
        if by_step:
            rows = [by_step[s] for s in sorted(by_step)]
            out[rows[0].rank] = rows
    return dict(sorted(out.items()))


class Attempt(StoredModel):
    """One start of the ranks (see the module docstring)."""

    started: float = Field(..., description="When rank 0 started training (Unix seconds).")
    last: float = Field(..., description="The last time rank 0 was seen alive.")
    ended: float | None = Field(None, description="When the attempt ended (null while it runs, or when it was killed).")
    state: State = Field(State.RUNNING, description="RUNNING, then COMPLETED | STOPPED | FAILED.")
    job_id: str | None = Field(None, description="The Slurm job id (SLURM_JOB_ID), or local-<pid>.")
    nodes: list[str] = Field(default_factory=list, description="The nodes the ranks ran on.")
    gpus: int = Field(0, description="GPUs of the attempt (its ranks when on CPUs).")
    world_size: int = Field(1, description="Ranks.")
    step_start: int = Field(0, description="The step it resumed from.")
    step: int = Field(0, description="The last step it trained.")
    pid: int | None = Field(None, description="Rank 0's process id.")
    host: str | None = Field(None, description="Rank 0's node.")
    allocated: float | None = Field(None, description="When the job's allocation began (the batch script's start, "
                                    "CLUSTERTRAIN_ALLOCATED_AT; the local launcher's start).")
    first_step: float | None = Field(None, description="When the attempt's first step finished.")
    stall_s: float = Field(0.0, description="Seconds training stalled for checkpoint saves in this attempt.")
    saved_step: int | None = Field(None, description="The step of the last checkpoint this attempt committed.")
    saved_at: float | None = Field(None, description="When that checkpoint was committed.")
    step_time_s: float | None = Field(None, description="The mean step time at the last logged step.")

    def end_time(self, now: float) -> float:
        """When the attempt stopped costing: its end, ``now`` while it runs, else its last sign of life."""
        if self.ended is not None:
            return self.ended
        return now if self.state == State.RUNNING else self.last

    def gpu_hours(self, now: float, alive: bool = True) -> float:
        end = self.end_time(now) if alive else (self.ended or self.last)
        return max(0.0, end - self.started) / 3600 * self.gpus


class Usage(StoredRecord):
    attempts: list[Attempt] = Field(default_factory=list, description="Every start of the ranks, oldest first.")


def read_usage(paths: RunPaths) -> Usage:
    """The run's usage; none recorded (or a damaged file) reads as no attempts."""
    try:
        return read_record(paths.usage, Usage) or Usage()
    except RunDirError:  # a damaged usage.json costs the GPU-hours figure, never the run or a status
        return Usage()


def write_usage(paths: RunPaths, usage: Usage) -> None:
    write_record(paths.usage, usage)
