"""Local backend: the ranks of one run as worker processes on this machine.

Each rank gets the torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1,
MASTER_PORT=a free port) and runs the same per-rank entry point that ``srun`` runs on a cluster,
with its output in ``RUN_DIR/logs/rank<R>.log``. :meth:`LocalLauncher.wait` watches them: if any
rank dies, the others are stopped within seconds and the failure names the rank and its last
lines. SIGINT/SIGTERM to the launcher are forwarded as SIGTERM, so the ranks save and stop.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from clustertrain.launch.backend import JobStatus
from clustertrain.launch.prepare import RunSpec

POLL_S = 0.5
KILL_GRACE_S = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child before exec
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def rank_command(spec: RunSpec) -> list[str]:
    return [sys.executable, "-m", "clustertrain", "train", "--run-dir", str(spec.paths.root), "--model", spec.entry.name]


@dataclass
class LocalJob:
    spec: RunSpec
    procs: list[subprocess.Popen]
    started: float
    failure: str | None = None
    stop_signal: str | None = None
    log_offsets: dict[int, int] = field(default_factory=dict)


@dataclass
class WaitResult:
    state: str  # COMPLETED | STOPPED | FAILED
    exit_code: int
    message: str


class LocalLauncher:
    """Runs every rank of a run as a local process (one node)."""

    def __init__(self) -> None:
        self.jobs: dict[str, LocalJob] = {}

    def submit(self, spec: RunSpec) -> str:
        cluster = spec.project.cluster
        world = cluster.ranks_per_node
        port = cluster.master_port or free_port()
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        procs = []
        for rank in range(world):
            env = dict(base, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
            log = open(spec.paths.rank_log(rank), "ab")
            log.write(f"=== clustertrain rank {rank}/{world} started {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n".encode())
            log.flush()
            procs.append(subprocess.Popen(rank_command(spec), env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent))
            log.close()
        job_id = f"local-{procs[0].pid}"
        self.jobs[job_id] = LocalJob(spec, procs, time.time())
        return job_id

    def status(self, job_id: str) -> JobStatus:
        job = self.jobs[job_id]
        codes = [p.poll() for p in job.procs]
        if job.failure:
            return JobStatus(job_id, "FAILED", 1, job.failure)
        if any(c not in (None, 0) for c in codes):
            return JobStatus(job_id, "FAILED", next(c for c in codes if c not in (None, 0)))
        if all(c == 0 for c in codes):
            return JobStatus(job_id, "STOPPED" if job.stop_signal else "COMPLETED", 0)
        return JobStatus(job_id, "RUNNING")

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
        _stop_all(self.jobs[job_id].procs, signal.SIGKILL)

    # ------------------------------------------------------------------
    def wait(self, job_id: str, on_tick: Callable[[], None] | None = None) -> WaitResult:
        """Block until every rank has exited. Forward SIGINT/SIGTERM; stop everything when one rank fails."""
        job = self.jobs[job_id]
        forwarded: list[int] = []

        def forward(signum: int, frame: object) -> None:
            forwarded.append(signum)
            job.stop_signal = signal.Signals(signum).name
            sig = signal.SIGKILL if len(forwarded) > 2 else signal.SIGTERM
            _stop_all(job.procs, sig)

        old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while True:
                codes = [p.poll() for p in job.procs]
                if on_tick:
                    on_tick()
                bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    rank, code = bad[0]
                    time.sleep(0.5)  # peers failing for the same reason exit together; report the first
                    _stop_all(job.procs, signal.SIGTERM)
                    _wait_all(job.procs, KILL_GRACE_S)
                    job.failure = _describe_failure(job.spec, rank, code)
                    return WaitResult("FAILED", 2 if code == 2 else 1, job.failure)
                if all(c == 0 for c in codes):
                    state = "STOPPED" if job.stop_signal else "COMPLETED"
                    return WaitResult(state, 0, "")
                time.sleep(POLL_S)
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


def _stop_all(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass


def _wait_all(procs: list[subprocess.Popen], grace: float) -> None:
    deadline = time.time() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
    _stop_all(procs, signal.SIGKILL)
    for p in procs:
        p.wait()


def _describe_failure(spec: RunSpec, rank: int, code: int) -> str:
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    tail = tail_lines(spec.paths.rank_log(rank), 15)
    errors = [ln for ln in tail if ln.startswith("error: ")]
    if code == 2 and errors:
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
