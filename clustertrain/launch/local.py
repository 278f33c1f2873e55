"""Local backend: the ranks of one run as worker processes on this machine.

The ranks are started by :func:`clustertrain.launch.local_ranks.start_local_ranks` (the torchrun-style
environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=
``cluster.master_port`` or a free port) and run the same per-rank entry point that ``srun`` runs on a
cluster, with their output in ``RUN_DIR/logs/rank<R>.log``. :meth:`LocalLauncher.wait` watches them: if any
rank dies, the others are stopped within seconds and the failure names the rank and its last
lines. It also runs the hang watchdog (:class:`clustertrain.monitor.hang_watchdog.Watchdog`) over the ranks' heartbeats:
a hang ends the run within the watchdog's bound, with the ranks behind named and every rank's stack in
``RUN_DIR/incidents/``. SIGINT/SIGTERM to the launcher are forwarded as SIGTERM, so the ranks save and stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from clustertrain.launch.backend import JobStatus
from clustertrain.launch.local_ranks import reap_ranks, start_local_ranks, stop_ranks
from clustertrain.launch.prepare import RunSpec
from clustertrain.core.heartbeat_files import clear_heartbeats
from clustertrain.monitor.hang_watchdog import Watchdog
from clustertrain.core.ranks import PEER_FAILED_RE
from clustertrain.core.states import State

POLL_S = 0.5
KILL_GRACE_S = 5.0


def rank_command(spec: RunSpec) -> list[str]:
    """Every rank's command: the built-in trainer's entry point, or Megatron-LM's ``pretrain_gpt.py`` with the
    project's arguments (:mod:`clustertrain.megatron.args`; the torchrun-style variables it reads are the ones
    :func:`start_local_ranks` sets)."""
    if spec.entry.framework == "megatron":
        from clustertrain.core.storage_layout import storage_layout
        from clustertrain.megatron.args import MegatronContext, megatron_args

        ctx = MegatronContext(spec.project, spec.entry, spec.project.cluster.ranks_per_node, spec.paths.root, spec.data,
                              storage_layout(spec.project).tensorboard_dir(spec.entry.name) or spec.paths.tensorboard)
        script = f"{spec.entry.megatron_options.path.rstrip('/')}/pretrain_gpt.py"
        return [sys.executable, script, *megatron_args(ctx)]
    return [sys.executable, "-m", "clustertrain", "train", "--run-dir", str(spec.paths.root), "--model", spec.entry.name]


@dataclass
class LocalJob:
    spec: RunSpec
    procs: list[subprocess.Popen]
    started: float
    failure: str | None = None
    stop_signal: str | None = None
    log_offsets: dict[int, int] = field(default_factory=dict)
    watchdog: Watchdog | None = None


@dataclass
class WaitResult:
    state: State  # COMPLETED | STOPPED | FAILED
    exit_code: int
    message: str


class LocalLauncher:
    """Runs every rank of a run as a local process (one node)."""

    def __init__(self) -> None:
        self.jobs: dict[str, LocalJob] = {}

    def submit(self, spec: RunSpec) -> str:
        cluster = spec.project.cluster
        clear_heartbeats(spec.paths)  # every heartbeat the watchdog reads is this start's
        now = time.time()
        extra = {"CLUSTERTRAIN_ALLOCATED_AT": f"{now:.3f}"}
        megatron = spec.entry.framework == "megatron"
        if megatron:
            from clustertrain.megatron.args import rank_environment

            extra.update(rank_environment(spec.entry))
        started = start_local_ranks(rank_command(spec), cluster.ranks_per_node, spec.paths.rank_log,
                                    port=cluster.master_port, extra_env=extra)
        procs = [started[r] for r in sorted(started)]
        job_id = f"local-{procs[0].pid}"
        # Megatron-LM's ranks write no heartbeats: no hang watchdog for them
        watchdog = None if megatron else Watchdog(spec.paths, spec.project.monitor, len(procs), job=job_id,
                                                  model=spec.entry.name)
        self.jobs[job_id] = LocalJob(spec, procs, now, watchdog=watchdog)
        return job_id

    def status(self, job_id: str) -> JobStatus:
        job = self.jobs[job_id]
        codes = [p.poll() for p in job.procs]
        if job.failure:
            return JobStatus(job_id, State.FAILED, 1, job.failure)
        if any(c not in (None, 0) for c in codes):
            return JobStatus(job_id, State.FAILED, next(c for c in codes if c not in (None, 0)))
        if all(c == 0 for c in codes):
            return JobStatus(job_id, State.STOPPED if job.stop_signal else State.COMPLETED, 0)
        return JobStatus(job_id, State.RUNNING)

    def logs(self, job_id: str, follow: bool = False, rank: int = 0) -> Iterator[str]:
        job = self.jobs[job_id]
        path = job.spec.paths.rank_log(rank)
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            while True:
                line = f.readline()
                if line:
                    yield line.rstrip("\n")
                elif not follow or job.procs[rank].poll() is not None:
                    return
                else:
                    time.sleep(POLL_S)

    def cancel(self, job_id: str) -> None:
        stop_ranks(self.jobs[job_id].procs, signal.SIGKILL)

    # ------------------------------------------------------------------
    def wait(self, job_id: str, on_tick: Callable[[], None] | None = None) -> WaitResult:
        """Block until every rank has exited. Forward SIGINT/SIGTERM; stop everything when one rank fails."""
        job = self.jobs[job_id]
        forwarded: list[int] = []

        def forward(signum: int, frame: object) -> None:
            forwarded.append(signum)
            job.stop_signal = signal.Signals(signum).name
            sig = signal.SIGKILL if len(forwarded) > 2 else signal.SIGTERM
            stop_ranks(job.procs, sig)

        old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while True:
                codes = [p.poll() for p in job.procs]
                if on_tick:
                    on_tick()
                if job.watchdog is not None and job.watchdog.check() is not None:
                    return self._end_incident(job)
                bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    time.sleep(0.5)  # peers failing for the same reason exit together
                    bad = [(r, c) for r, c in enumerate(p.poll() for p in job.procs) if c not in (None, 0)]
                    rank, code = _cause(job.spec, bad)
                    stop_ranks(job.procs, signal.SIGTERM)
                    reap_ranks(job.procs, KILL_GRACE_S)
                    job.failure = _describe_failure(job.spec, rank, code)
                    return WaitResult(State.FAILED, 2 if code == 2 else 1, job.failure)
                if all(c == 0 for c in codes):
                    return WaitResult(State.STOPPED if job.stop_signal else State.COMPLETED, 0, "")
                time.sleep(POLL_S)
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


    def _end_incident(self, job: LocalJob) -> WaitResult:
        """The watchdog found a hang or a lost rank and asked the ranks to exit: give them a moment, stop the rest."""
        incident = job.watchdog.incident
        reap_ranks(job.procs, 2 * job.spec.project.monitor.heartbeat_s + KILL_GRACE_S)  # then kills what is left
        job.failure = f"{incident.verdict.message}; every rank's stack is in {incident.dir}"
        return WaitResult(State.FAILED, 1, job.failure)


def _cause(spec: RunSpec, bad: list[tuple[int, int]]) -> tuple[int, int]:
    """The failed rank to report: the first whose last lines do not say a peer died before it (a rank blocked in
    a collective fails moments after the one that crashed, and may be seen first); else the first."""
    for rank, code in bad:
        if not any(PEER_FAILED_RE.search(line) for line in tail_lines(spec.paths.rank_log(rank), 15)):
            return rank, code
    return bad[0]


def _describe_failure(spec: RunSpec, rank: int, code: int) -> str:
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    tail = tail_lines(spec.paths.rank_log(rank), 15)
    errors = [ln for ln in tail if ln.startswith("error: ")]
    if errors:  # the entry point prints one `error:` line for a failure it explains (bad input, a diverged run)
        return errors[-1].removeprefix("error: ")
    return f"rank {rank} {how}; last lines of {spec.paths.rank_log(rank)}:\n" + "\n".join("  " + ln for ln in tail)


def tail_lines(path: Path, n: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            return f.read().decode("utf-8", errors="replace").splitlines()[-n:]
    except FileNotFoundError:
        return []
