"""The project's suspect nodes: nodes blamed for a hang, a lost rank, a crash Slurm attributes to them or failed GPU
health, which the project's jobs exclude until the entry expires or is cleared.

One file per project, ``<storage.runs>/<project>/suspects.jsonl``
(:meth:`clustertrain.core.storage_layout.StorageLayout.suspects_file`), shared by every model's jobs and by ``clustertrain
nodes``. Append-only JSON lines, each one ``os.write`` on an ``O_APPEND`` descriptor (no lock: several jobs may add
at once); the list is the fold of the lines, oldest first. Two kinds of line::

    {"version": 1, "time": 1795000000.0, "node": "node2", "host": "ip-10-0-1-23", "source": "hang",
     "reason": "rank 1 stuck in collective at step 7 for 41 s", "job": "42", "model": "tiny", "expires": 1795086400.0}
    {"version": 1, "time": 1795000500.0, "clear": "node2", "by": "clustertrain nodes clear"}

``source``: ``hang`` | ``rank_lost`` | ``crash`` (Slurm named the node of a rank killed by a signal) |
``node_fail`` | ``gpu_health`` | ``manual``. ``host`` is the machine's own host name when it is known: on
ParallelCluster a Slurm node name is a slot that a replacement instance takes over, so an entry whose node now has
another host (``scontrol show node``'s NodeHostName) no longer applies (:func:`still_applies`). ``clear`` names a
node or ``*`` (all); it ends the entries written before it. An entry is active from ``time`` until ``expires``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import Field, ValidationError

from clustertrain.core.run_events import read_jsonl
from clustertrain.core.schema import StoredModel

SOURCES = ("hang", "rank_lost", "crash", "node_fail", "gpu_health", "manual")


class Suspect(StoredModel):
    """One node on the list (see the module docstring)."""

    version: int = 1
    time: float = Field(default_factory=time.time, description="When it was blamed (Unix seconds).")
    node: str = Field(..., description="Slurm node name.")
    host: str | None = Field(None, description="The machine's host name when it was blamed.")
    source: str = Field("manual", description="hang | rank_lost | crash | node_fail | gpu_health | manual.")
    reason: str = Field("", description="One line: why.")
    job: str | None = Field(None, description="The job that blamed it.")
    model: str | None = Field(None, description="That job's model.")
    expires: float = Field(..., description="When the entry ends (Unix seconds).")


class Clear(StoredModel):
    version: int = 1
    time: float = Field(default_factory=time.time)
    clear: str = Field(..., description="A node name, or * for all.")
    by: str = ""


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    finally:
        os.close(fd)


def add_suspect(path: Path, node: str, *, source: str, reason: str, ttl_h: float, host: str | None = None,
                job: str | None = None, model: str | None = None, now: float | None = None) -> Suspect:
    """Put ``node`` on the list for ``ttl_h`` hours; returns the entry written."""
    now = time.time() if now is None else now
    entry = Suspect(time=now, node=node, host=host, source=source, reason=" ".join(reason.split())[:300], job=job,
                    model=model, expires=now + ttl_h * 3600)
    _append(path, entry.model_dump_json())
    return entry


def clear_suspects(path: Path, nodes: list[str] | None = None, by: str = "clustertrain nodes clear",
                   now: float | None = None) -> list[str]:
    """End the entries of ``nodes`` (None: all); returns the nodes that were active and are cleared now."""
    now = time.time() if now is None else now
    active = active_suspects(path, now)
    targets = list(active) if nodes is None else nodes
    for node in (["*"] if nodes is None else nodes):
        _append(path, Clear(time=now, clear=node, by=by).model_dump_json())
    return [n for n in targets if n in active]


def read_suspects(path: Path) -> list[Suspect | Clear]:
    """Every line that parses, oldest first (a damaged line is skipped)."""
    out: list[Suspect | Clear] = []
    for raw in read_jsonl(path):
        try:
            out.append(Clear.model_validate(raw) if "clear" in raw else Suspect.model_validate(raw))
        except ValidationError:
            continue
    return sorted(out, key=lambda e: e.time)


def active_suspects(path: Path, now: float | None = None) -> dict[str, Suspect]:
    """node -> its newest entry that is neither expired nor cleared, by node name."""
    now = time.time() if now is None else now
    active: dict[str, Suspect] = {}
    for entry in read_suspects(path):
        if isinstance(entry, Clear):
            if entry.clear == "*":
                active.clear()
            else:
                active.pop(entry.clear, None)
        else:
            active[entry.node] = entry
    return {n: s for n, s in sorted(active.items()) if s.expires > now}


def still_applies(suspect: Suspect, current_host: str | None) -> bool:
    """Whether the entry still describes the machine behind its node name: False when both host names are known
    and differ (the slot holds a replacement instance now)."""
    if not (suspect.host and current_host):
        return True
    return suspect.host.split(".")[0] == current_host.split(".")[0]  # a full name and a short one are one host
