"""The watchdog of one start of the ranks: it reads every rank's heartbeat, and when the rules of
:mod:`clustertrain.monitor.hang_rules` find a hang or a lost rank it collects the evidence, blames the node, and ends the
ranks, so a hang never burns the rest of the time limit. Locally the launcher runs it in its wait loop
(:class:`clustertrain.launch.local.LocalLauncher`); in a Slurm job the batch script runs ``clustertrain watchdog``
as a one-task step beside the ranks' step (``srun --overlap``, in the ranks' container image) and acts on what it
decides (``launch/templates/sbatch.sh.j2``).

An incident, step by step (:meth:`Watchdog.handle`):

1. ``RUN_DIR/incidents/<UTC time>/`` is made and every rank is asked to dump its stacks (``heartbeat/request.json``,
   :mod:`clustertrain.core.heartbeat_files`); the watchdog waits for the stacks of every rank still alive, at most
   ``2 x heartbeat_s + 10`` s, before anything may exit (a rank that exits first makes its peers fail before they
   could write theirs).
2. ``incident.json`` is written (format below), a ``hang`` or ``rank_lost`` event goes to ``events.jsonl``, and each
   blamed node goes on the project's suspect list (:mod:`clustertrain.monitor.suspects`) with a ``node_suspect``
   event.
3. Every rank is asked to exit (code 75); the launcher or the batch script stops any rank that does not.

``incident.json``::

    {"version": 2, "id": "20261123-101112", "time": 1795000200.0, "kind": "hang", "job": "42",
     "message": "rank 1 on node2 is stuck in forward of step 7 on its GPU for 41 s (bound 30 s: ...); ...",
     "step": 7, "phase": "forward", "ranks": [1], "nodes": ["node2"], "waited_s": 41.2, "bound_s": 30.0,
     "stacks": ["stacks/rank0.txt", "stacks/rank1.txt"], "missing_stacks": [],
     "flight": {"files": ["flight/rank0", "flight/rank1"], "ranks": [1], "collective": "nccl:all_reduce",
                "seq": 412, "group": "0:default_pg", "dumps": [0, 1], "error": ""}}

``flight`` (version 2; version 1 had the list of files only): the flight recorder's dumps of the incident and what
torch's analyser found in them (:mod:`clustertrain.monitor.flight`): ``ranks`` never joined ``collective`` number
``seq`` of ``group``; null when no rank dumped one (the recorder off, or no collective recorded). The dumps are
``flight/rank<R>`` (the beacons', at the dump request) or, where none is there, NCCL's own
``RUN_DIR/flight/rank<R>`` written when a collective outlived the process-group timeout. When the heartbeats blamed
no rank (every rank, host and GPU, stopped at the same place) and the analyser names ranks, those ranks and their
nodes are the verdict's; the message ends with the analyser's one line (not when it could not read the dumps:
then ``error`` says why).

The verdict (Slurm): ``RUN_DIR/jobs/<job id>.verdict``, ``key=value`` lines like the end marker
(:mod:`clustertrain.core.job_records`), written atomically when the watchdog ends; the batch script reads it with
``sed`` after a failed step::

    version=1
    action=restart        # restart: run the job again (excluding `exclude`) | stop: running it again will not help
    exclude=node2         # nodes the next run must not use (comma-separated; empty: none)
    reason=rank 1 on node2 is stuck in collective of step 7 for 41 s (...)
    incident=RUN_DIR/incidents/20261123-101112

``restart`` follows an incident, or a rank that Slurm reports killed by a signal (``srun: error: NODE: task N:
Killed`` before srun terminates the step: the lines after it are the ranks srun itself killed) or a node failure;
those nodes are blamed (``crash`` / ``node_fail``). A failure the ranks explained themselves (their heartbeat ends in
``error``: bad input, a diverged run, a full disk) or a plain exception is ``stop``: it would fail the same way again.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from clustertrain.monitor.config import MonitorConfig
from clustertrain.monitor.flight import FlightVerdict, analyse
from clustertrain.monitor.hang_rules import POLL_S, Verdict, blame_ranks, dead_after, evidence_wait_s, judge
from clustertrain.core.heartbeat_files import Request, read_heartbeats, write_request
from clustertrain.core.run_events import Event, EventKind, Severity, append_event
from clustertrain.monitor.suspects import add_suspect
from clustertrain.core.run_paths import RunPaths, write_atomic

#: the watchdog process's exit code after it ended the ranks of an incident (the batch script then stops the step)
EXIT_INCIDENT = 3
SRUN_TASK = re.compile(r"^srun: error: (\S+): tasks? ([0-9,\-]+): (.+)$")
SRUN_NODE_FAIL = re.compile(r"^srun: error: Node failure on (\S+)")
SRUN_STEP_END = re.compile(r"Terminating StepId=|Force Terminated|STEP \S+ ON \S+ CANCELLED")


@dataclass
class Incident:
    id: str
    dir: Path
    verdict: Verdict
    stacks: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    flight: FlightVerdict | None = None
    flight_dir: Path | None = None


@dataclass(frozen=True)
class Decision:
    """What the batch script does after a failed step (see the verdict format)."""

    action: str                   # restart | stop
    exclude: list[str]
    reason: str
    incident: Path | None = None

    def text(self) -> str:
        reason = " ".join(self.reason.split())
        return (f"version=1\naction={self.action}\nexclude={','.join(self.exclude)}\nreason={reason}\n"
                f"incident={self.incident or ''}\n")


def verdict_path(paths: RunPaths, job: str) -> Path:
    return paths.root / "jobs" / f"{job}.verdict"


def srun_blame(text: str) -> list[tuple[str, str]]:
    """(node, what) for each task Slurm reports killed by a signal, or node that failed, before srun began
    terminating the step (later lines are ranks srun itself killed)."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        if SRUN_STEP_END.search(line):
            break
        m = SRUN_TASK.match(line.strip())
        if m and not m.group(3).startswith("Exited with exit code"):
            out.append((m.group(1), f"task {m.group(2)}: {m.group(3)}"))
        m = SRUN_NODE_FAIL.match(line.strip())
        if m:
            out.append((m.group(1), "node failure"))
    return out


class Watchdog:
    """Watches one start of the ranks (see the module docstring). ``suspects``: the project's suspect list (None:
    blame nobody, e.g. on one machine); ``expected``: rank -> node where the scheduler placed each rank."""

    def __init__(self, paths: RunPaths, config: MonitorConfig, world_size: int, *, job: str | None = None,
                 model: str | None = None, suspects: Path | None = None, expected: dict[int, str] | None = None,
                 poll_s: float = POLL_S, log: Callable[[str], None] | None = None):
        self.paths, self.config, self.world_size = paths, config, world_size
        self.job, self.model, self.suspects, self.expected = job, model, suspects, expected or {}
        self.poll_s = poll_s
        self.log = log or (lambda m: print(f"clustertrain watchdog: {m}", file=sys.stderr, flush=True))
        self.started = time.time()
        self.incident: Incident | None = None
        self.verdict_file: Path | None = None  # where handle() writes the batch script's verdict (Slurm)
        self._next = 0.0

    def check(self, now: float | None = None) -> Incident | None:
        """Judge the heartbeats (at most every ``poll_s``); on a verdict, handle it. Returns the new incident."""
        now = time.time() if now is None else now
        if self.incident is not None or now < self._next:
            return None
        self._next = now + self.poll_s
        verdict = judge(read_heartbeats(self.paths), self.world_size, now, self.config, self.started, self.expected)
        return self.handle(verdict) if verdict is not None else None

    def all_done(self) -> bool:
        beats = read_heartbeats(self.paths)
        return len(beats) == self.world_size and all(b.done for b in beats.values())

    def handle(self, verdict: Verdict, end_ranks: bool = True) -> Incident:
        """Collect the evidence of ``verdict``, blame its nodes, and (``end_ranks``) ask every rank to exit."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        where = self.paths.incidents / stamp
        where.mkdir(parents=True, exist_ok=True)
        self.log(f"{verdict.kind}: {verdict.message}; collecting every rank's stack in {where}")
        incident = Incident(stamp, where, verdict)
        self.incident = incident
        write_request(self.paths, Request(id=stamp, dir=str(where), dump=True, exit=False))
        incident.stacks, incident.missing = self._wait_for_stacks(where)
        self._read_flight(incident)
        self._record(incident)
        if self.verdict_file is not None:
            write_atomic(self.verdict_file, self.decide().text())
        if end_ranks:
            write_request(self.paths, Request(id=f"{stamp}-exit", dir=str(where), dump=False, exit=True))
            self.log(f"asked every rank to exit; the incident is in {where}")
            self._wait_for_exit()
        return incident

    def _read_flight(self, incident: Incident) -> None:
        """torch's analyser over the ranks' flight recorder dumps (see the ``flight`` field); when the heartbeats
        blamed no rank, the ranks that never joined the stuck collective are the verdict's."""
        for where in (incident.dir / "flight", self.paths.root / "flight"):
            found = analyse(where)
            if found is not None:
                incident.flight, incident.flight_dir = found, where
                break
        if incident.flight is None:
            return
        v, found = incident.verdict, incident.flight
        self.log(found.summary())
        update: dict = {} if found.error else {"message": f"{v.message}; {found.summary()}"}
        if v.kind == "hang" and not v.ranks and found.ranks:
            update.update(ranks=found.ranks, nodes=blame_ranks(read_heartbeats(self.paths), found.ranks, self.expected))
        incident.verdict = replace(v, **update)

    def _wait_for_exit(self) -> None:
        """Until no rank is alive any more (each left a last record or went quiet), at most
        :func:`~clustertrain.monitor.hang_rules.evidence_wait_s`: whatever is still running then is stopped by the
        launcher or the batch script."""
        deadline = time.time() + evidence_wait_s(self.config)
        while time.time() < deadline:
            beats = read_heartbeats(self.paths).values()
            if not any(not b.done and time.time() - b.alive <= 2 * self.config.heartbeat_s for b in beats):
                return
            time.sleep(0.5)

    def _wait_for_stacks(self, where: Path) -> tuple[list[int], list[int]]:
        deadline = time.time() + evidence_wait_s(self.config)
        while True:
            beats = read_heartbeats(self.paths)
            alive = [r for r, b in beats.items() if not b.done and time.time() - b.alive <= dead_after(self.config)]
            have = [r for r in range(self.world_size) if (where / "stacks" / f"rank{r}.txt").is_file()]
            if all(r in have for r in alive) or time.time() > deadline:
                return have, [r for r in range(self.world_size) if r not in have]
            time.sleep(0.2)

    def _record(self, incident: Incident) -> None:
        v = incident.verdict
        flight = None
        if incident.flight is not None and incident.flight_dir is not None:
            files = sorted(incident.flight_dir / f"rank{r}" for r in incident.flight.dumps)
            flight = {"files": [str(p.relative_to(incident.dir)) if p.is_relative_to(incident.dir) else str(p)
                                for p in files], **incident.flight.to_dict()}
        record = {"version": 2, "id": incident.id, "time": time.time(), "detected": v.detected, "kind": v.kind,
                  "job": self.job,
                  "message": v.message, "step": v.step, "phase": v.phase, "ranks": v.ranks, "nodes": v.nodes,
                  "waited_s": round(v.waited_s, 1), "bound_s": round(v.bound_s, 1),
                  "stacks": [f"stacks/rank{r}.txt" for r in incident.stacks], "missing_stacks": incident.missing,
                  "flight": flight}
        write_atomic(incident.dir / "incident.json", json.dumps(record, indent=1) + "\n")
        kind = EventKind.HANG if v.kind == "hang" else EventKind.RANK_LOST
        append_event(self.paths.events, Event(kind=kind, severity=Severity.ERROR, step=v.step, message=v.message,
                                              rank=v.ranks[0] if v.ranks else None,
                                              node=v.nodes[0] if v.nodes else None, value=round(v.waited_s, 1),
                                              threshold=round(v.bound_s, 1)))
        self.blame([(n, v.kind, v.message, v.hosts.get(n)) for n in v.nodes])

    def blame(self, nodes: list[tuple[str, str, str, str | None]]) -> None:
        """Put (node, source, reason, host) on the project's suspect list, with a ``node_suspect`` event each."""
        if self.suspects is None:
            return
        for node, source, reason, host in nodes:
            try:
                add_suspect(self.suspects, node, source=source, reason=reason, ttl_h=self.config.suspect_ttl_h,
                            host=host, job=self.job, model=self.model)
            except OSError as e:
                self.log(f"could not add {node} to the suspect list {self.suspects} ({e})")
                continue
            append_event(self.paths.events, Event(kind=EventKind.NODE_SUSPECT, node=node, message=(
                f"{node} is on the project's suspect list for {self.config.suspect_ttl_h:g} h ({source}): {reason}")))
            self.log(f"{node} goes on the suspect list ({source}); the next run excludes it")

    def decide(self, srun_output: str = "") -> Decision:
        """The batch script's next move after the ranks' step failed (see the verdict format)."""
        if self.incident is not None:
            v = self.incident.verdict
            return Decision("restart", v.nodes, v.message, self.incident.dir)
        blamed = srun_blame(srun_output)
        if blamed:
            nodes = list(dict.fromkeys(n for n, _ in blamed))
            reason = "Slurm reports " + "; ".join(f"{n}: {what}" for n, what in blamed)
            hosts = self._hosts()
            self.blame([(n, "node_fail" if what == "node failure" else "crash", reason, hosts.get(n))
                        for n, what in dict(blamed).items()])
            return Decision("restart", nodes, reason)
        beats = read_heartbeats(self.paths)
        if any(b.phase == "error" for b in beats.values()):
            return Decision("stop", [], "a rank stopped with its own error (see its `error:` line): running the job "
                            "again would fail the same way")
        return Decision("stop", [], "the ranks failed with an exception that names no node (see the job log)")

    def _hosts(self) -> dict[str, str]:
        return {b.node: b.host for b in read_heartbeats(self.paths).values() if b.host}


def placement(nodes: list[str], ranks_per_node: int) -> dict[int, str]:
    """rank -> node for Slurm's block distribution (``--ntasks-per-node``: ranks fill one node, then the next)."""
    return {n * ranks_per_node + i: node for n, node in enumerate(nodes) for i in range(ranks_per_node)}


def step_ended_path(paths: RunPaths) -> Path:
    """Touched by the batch script when the ranks' step has ended: the watchdog then decides and leaves. (A file, not
    a signal: srun answers SIGTERM by killing its step, not by passing it on.)"""
    return paths.heartbeat / "step-ended"


def serve(dog: Watchdog, job: str, output: Path | None = None, offset: int = 0) -> int:
    """A Slurm job's watchdog process: watch until the ranks' step has ended (:func:`step_ended_path`, or SIGTERM at
    the job's end), then write the verdict for the batch script and return 0; after an incident, return
    :data:`EXIT_INCIDENT` (the verdict is written before the ranks are asked to exit; the batch script then stops
    the step if it is still running)."""
    import signal
    import threading

    dog.verdict_file = verdict_path(dog.paths, job)
    ended = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: ended.set())
    for sig in (signal.SIGUSR1, signal.SIGUSR2):  # `scancel --signal` reaches every step: the stop signal is not ours
        signal.signal(sig, signal.SIG_IGN)
    while not ended.is_set() and not step_ended_path(dog.paths).exists():
        if dog.check() is not None:
            return EXIT_INCIDENT
        ended.wait(0.5)
    if dog.all_done():
        decision = Decision("stop", [], "the ranks finished")
    else:
        decision = dog.decide(read_output_since(output, offset) if output else "")
    write_atomic(verdict_path(dog.paths, job), decision.text())
    return 0


def read_output_since(path: Path, offset: int) -> str:
    """The job output written since byte ``offset`` (this start of the job; the file is appended to across
    restarts)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


