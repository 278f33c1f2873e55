"""What ``clustertrain status`` and the report say about a run's faults and how it survived them: the watchdog's
incidents (``RUN_DIR/incidents/<id>/incident.json``, format: :mod:`clustertrain.monitor.hang_watchdog`), the last
preemption save (the ``stop_signal`` and ``preempt_save`` events, :mod:`clustertrain.core.run_events`) and the
project's suspect nodes (:mod:`clustertrain.monitor.suspects`). Readers are lenient: a damaged incident record is
skipped, never an error.

A preemption save is told in one line: ``landed in 12.3 s of 300 s`` (the checkpoint was committed 12.3 s after the
stop signal, which gave 300 s: ``launch.signal_grace_s``), ``committed 320.0 s after the signal, later than the
300 s it gave``, or — when the newest ``stop_signal`` has no ``preempt_save`` after it and its attempt did not end
COMPLETED or STOPPED — ``did not land: the job was killed before the checkpoint was committed`` (while that attempt
still runs: ``saving since the stop signal ...``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain.core.run_events import Attempt, Event, EventKind
from clustertrain.monitor.suspects import active_suspects
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.states import State

if TYPE_CHECKING:
    from clustertrain.project import Project

#: events that are records of what happened, not alarms (status shows them in their own lines)
RECORD_KINDS = (EventKind.CHECKPOINT, EventKind.STOP_SIGNAL, EventKind.PREEMPT_SAVE)
DID_NOT_LAND = "did not land: the job was killed before the checkpoint was committed"


@dataclass(frozen=True)
class IncidentRecord:
    """One ``incident.json`` as read back (missing or mistyped fields take their empty value), and its directory."""

    dir: str
    time: float
    kind: str = "incident"
    id: str = ""
    job: str | None = None
    message: str = ""
    step: int | None = None
    phase: str | None = None
    ranks: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    stacks: list[str] = field(default_factory=list)
    missing_stacks: list[int] = field(default_factory=list)

    @classmethod
    def parse(cls, raw: dict[str, Any], where: Path) -> "IncidentRecord":
        def get(key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
            value = raw.get(key)
            return value if isinstance(value, kind) and not isinstance(value, bool) else default

        return cls(str(where), float(raw["time"]), get("kind", str, "incident"), get("id", str, ""),
                   get("job", str), " ".join(get("message", str, "").split()), get("step", int), get("phase", str),
                   get("ranks", list, []), get("nodes", list, []), get("stacks", list, []),
                   get("missing_stacks", list, []))


def read_incidents(paths: RunPaths) -> list[IncidentRecord]:
    """Every incident of the run, oldest first; a record that is not a JSON object with a ``time`` is left out."""
    out = []
    for record in sorted(paths.incidents.glob("*/incident.json")) if paths.incidents.is_dir() else []:
        try:
            raw = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get("time"), (int, float)):
            out.append(IncidentRecord.parse(raw, record.parent))
    return sorted(out, key=lambda r: r.time)


def newest_incident(paths: RunPaths, since: float | None) -> dict[str, Any] | None:
    """The newest incident at or after ``since`` (the start of the attempt running now, or the last one): its kind,
    one-line message, time and directory; None when there is none."""
    incidents = [r for r in read_incidents(paths) if since is None or r.time >= since]
    if not incidents:
        return None
    r = incidents[-1]
    return {"kind": r.kind, "message": r.message, "time": r.time, "dir": r.dir}


def incident_since(attempts: Sequence[Attempt]) -> float | None:
    """Where the current attempt's incidents begin: its allocation start (or rank 0's start)."""
    if not attempts:
        return None
    a = attempts[-1]
    return min(a.allocated, a.started) if a.allocated is not None else a.started


def preempt_line(events: Sequence[Event], attempts: Sequence[Attempt], live: bool) -> str | None:
    """The last preemption save in one line (the module docstring), or None when no stop signal was recorded."""
    stops = [e for e in events if e.kind == EventKind.STOP_SIGNAL]
    saves = [e for e in events if e.kind == EventKind.PREEMPT_SAVE]
    if stops and not any(s.time >= stops[-1].time for s in saves):
        i, attempt = _attempt_at(attempts, stops[-1].time)
        if attempt is not None and live and i == len(attempts) - 1 and attempt.ended is None:
            return f"saving since the stop signal at step {stops[-1].step}: not committed yet"
        if attempt is None or attempt.state not in (State.COMPLETED, State.STOPPED):
            return DID_NOT_LAND
    if not saves:
        return None
    took, grace = saves[-1].value, saves[-1].threshold
    if took is None:
        return "landed"
    if grace is None:
        return f"landed in {took:.1f} s"
    if took <= grace:
        return f"landed in {took:.1f} s of {grace:.0f} s"
    return f"committed {took:.1f} s after the signal, later than the {grace:.0f} s it gave"


def _attempt_at(attempts: Sequence[Attempt], t: float) -> tuple[int, Attempt | None]:
    """The attempt that was running at ``t``: the last one started at or before it."""
    found: tuple[int, Attempt | None] = (-1, None)
    for i, a in enumerate(attempts):
        if a.started <= t:
            found = (i, a)
    return found


def suspects_file(project: "Project") -> Path:
    from clustertrain.core.storage_layout import storage_layout

    return storage_layout(project).suspects_file()


def project_suspects(project: "Project", now: float | None = None) -> list[dict[str, Any]]:
    """The project's active suspect nodes: node, source, reason, until when (empty when none or unreadable)."""
    active = active_suspects(suspects_file(project), time.time() if now is None else now)
    return [{"node": s.node, "source": s.source, "reason": s.reason, "expires": s.expires, "job": s.job,
             "model": s.model} for s in active.values()]

