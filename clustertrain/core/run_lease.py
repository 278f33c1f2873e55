"""One writer per run directory: the lease.

``RUN_DIR/lease.json`` names who may write the run directory now; ``RUN_DIR/.lease.lock`` is the file a live process
holder keeps an exclusive ``flock`` on for as long as it lives (never replaced, so the lock stays on one inode).

``lease.json`` (:class:`Lease`; written with a rename, under the lock)::

    {"version": 1, "clustertrain": "0.1.0", "kind": "process", "host": "ip-10-0-1-5", "pid": 4242,
     "job": null, "since": 1795000000.0, "command": "run"}
    {"version": 1, "clustertrain": "0.1.0", "kind": "slurm", "host": "head", "pid": 4250,
     "job": "42", "since": 1795000100.0, "command": "submit"}

``kind`` is ``process`` while a ``clustertrain run`` (or a ``submit`` between preparing the run and ``sbatch``) writes
the run directory: the holder is that process, alive exactly while it holds the lock. ``slurm`` once ``submit`` has
queued the job: the holder is the job, and with it the chain that carries the run on — the same id after a requeue,
and the successor its end marker names after a watchdog resubmission (``jobs/<id>.end`` ``next_job``,
:mod:`clustertrain.core.job_records`). A job chain is alive while its newest job is pending, running or requeued in
Slurm; a chain whose newest job wrote its end marker without a successor, or that Slurm has forgotten, has ended.

Taking the lease (:func:`take`, ``run`` and ``submit`` before they write anything in the run directory): a live holder
is a :class:`LeaseHeld` error naming it (pid and host, or job id) and the command that ends it; nothing is written. A
stale one (its process gone, its job chain ended) is taken over, and :attr:`Taken.note` says so. A Slurm holder that
cannot be checked (no controller answers) counts as alive: the safe side. The ranks of a Slurm job check the lease
(:func:`check_for_job`): a run directory leased to another live job or process is refused; one whose holder is gone,
or a job of their own chain (``CLUSTERTRAIN_LEASE_JOB``, which a watchdog resubmission passes on), trains.

What this relies on across nodes: an exclusive ``flock`` on a file of a shared Lustre file system is seen by every
client when the file system is mounted with ``-o flock`` (FSx for Lustre mounts so by default, as ParallelCluster
does); a lock dies with its process, so a crashed ``run`` leaves a lease that the next taker finds stale.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Literal

from pydantic import Field

from clustertrain.core.errors import ClusterTrainError
from clustertrain.core.job_records import read_end_marker
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import StoredRecord, read_record, write_record

LEASE = "lease.json"
LOCK = ".lease.lock"
#: the job whose lease a job of the same chain works under (the batch script passes it on when it resubmits itself)
LEASE_JOB_ENV = "CLUSTERTRAIN_LEASE_JOB"
#: Slurm states of a job that still carries its run (pending, running, requeued)
ALIVE_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
                          "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "SPECIAL_EXIT", "RESV_DEL_HOLD", "STOPPED"})


class LeaseHeld(ClusterTrainError):
    """The run directory is another live writer's."""


class Lease(StoredRecord):
    """``lease.json`` (format in the module docstring)."""

    kind: Literal["process", "slurm"] = Field(..., description="process: a live clustertrain process; slurm: a job chain.")
    host: str = Field(..., description="Host of the process that took it.")
    pid: int = Field(..., description="Its process id.")
    job: str | None = Field(None, description="The Slurm job (kind slurm).")
    since: float = Field(..., description="When it was taken (Unix seconds).")
    command: str = Field("", description="The command that took it: run, submit, train.")

    def holder(self) -> str:
        if self.kind == "slurm":
            return f"Slurm job {self.job}"
        return f"pid {self.pid} on {self.host} (clustertrain {self.command})"


#: job id -> its Slurm state, or None when Slurm no longer knows it; raises OSError when no controller answers
SlurmState = Callable[[str], "str | None"]


def squeue_state(job: str, env: dict[str, str] | None = None) -> str | None:
    """The job's state as ``squeue`` shows it, None when Slurm no longer lists it. OSError: no controller answers."""
    try:
        proc = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, **(env or {})})
    except (OSError, subprocess.SubprocessError) as e:
        raise OSError(f"squeue: {e}") from None
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return None
        raise OSError(" ".join(proc.stderr.split())[:200] or f"squeue exited {proc.returncode}")
    states = proc.stdout.split()
    return states[0] if states else None


def newest_of_chain(paths: RunPaths, job: str) -> tuple[str, bool]:
    """(the newest job of the chain that starts at ``job``, whether that job has ended by its own end marker)."""
    seen = {job}
    while True:
        marker = read_end_marker(paths, job)
        if marker is None:
            return job, False
        if not marker.next_job or marker.next_job in seen:
            return job, True
        job = marker.next_job
        seen.add(job)


def chain_alive(paths: RunPaths, job: str, state: SlurmState) -> tuple[bool, str]:
    """Whether the chain of ``job`` still carries the run, and its newest job. OSError: Slurm cannot be asked."""
    newest, ended = newest_of_chain(paths, job)
    if ended:
        return False, newest
    slurm = state(newest)
    return slurm is not None and slurm.split()[0] in ALIVE_STATES, newest


@dataclass
class Taken:
    """A lease this process holds (:func:`take`): keep it until the run's writers are done, then :meth:`release`
    (or :meth:`hand_to_job` once ``sbatch`` queued the job)."""

    paths: RunPaths
    lease: Lease
    note: str | None = None
    _fd: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self._fd is not None:  # a holder dropped without release() lets go when it is collected, as at exit
            self._closer = weakref.finalize(self, os.close, self._fd)

    def hand_to_job(self, job: str) -> None:
        """The run is a Slurm job's now: record it, then let go of the lock."""
        self.lease = self.lease.model_copy(update={"kind": "slurm", "job": str(job)})
        write_record(self.paths.root / LEASE, self.lease)
        self.release()

    def release(self) -> None:
        """Let go of the lock (a process lease then reads as stale: its holder no longer holds it)."""
        if self._fd is not None:
            self._closer()
            self._fd = None


def read_lease(paths: RunPaths) -> Lease | None:
    try:
        return read_record(paths.root / LEASE, Lease)
    except (ClusterTrainError, ValueError):  # a damaged lease names nobody: it is stale
        return None


def _try_lock(paths: RunPaths, create: bool) -> int | None:
    """An fd holding the exclusive lock on the run's lock file, or None while another process holds it."""
    lock = paths.root / LOCK
    if not create and not lock.exists():
        return -1  # no lock file: no live process holds the run
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _refusal(paths: RunPaths, lease: Lease | None, fix: str) -> LeaseHeld:
    who = lease.holder() if lease is not None else "another process"
    return LeaseHeld(f"{paths.root}: in use by {who}; {fix}")


def _process_fix(lease: Lease | None) -> str:
    if lease is None:
        return "wait for it to end"
    return (f"wait for it to end or stop it (kill {lease.pid} on {lease.host}), or use another --run-dir")


def _job_fix(job: str, newest: str) -> str:
    which = f"job {newest} (it carries on job {job})" if newest != job else f"job {job}"
    return (f"wait for {which} to end, or cancel it (`clustertrain cancel PROJECT --model MODEL` or `scancel {newest}`), "
            "or use another --run-dir")


def holder_problem(paths: RunPaths, lease: Lease | None, state: SlurmState, own_job: str | None = None) -> str | None:
    """Why a Slurm lease still holds (None: it does not, or it is ``own_job``'s chain). Assumes the lock is free."""
    if lease is None or lease.kind != "slurm" or lease.job is None or lease.job == own_job:
        return None
    try:
        alive, newest = chain_alive(paths, lease.job, state)
    except OSError as e:
        return (f"{paths.root}: leased to Slurm job {lease.job}, and no Slurm controller answers to say whether it still "
                f"runs ({e}); reach the cluster (eval \"$(clustertrain local-slurm env)\" or its SLURM_CONF), or when "
                f"that job is gone, remove {paths.root / LEASE}")
    if own_job is not None and newest == own_job:
        return None
    return f"{paths.root}: in use by Slurm job {newest}; {_job_fix(lease.job, newest)}" if alive else None


def probe(paths: RunPaths, state: SlurmState = squeue_state) -> None:
    """:class:`LeaseHeld` (one line) while another live writer holds the run directory; writes nothing. ``run`` and
    ``submit`` probe before their slow checks (staging data), then :func:`take` before their first write."""
    if not (paths.root / LOCK).exists() and not (paths.root / LEASE).exists():
        return
    fd = _try_lock(paths, create=False)
    if fd is None:
        raise _refusal(paths, read_lease(paths), _process_fix(read_lease(paths)))
    try:
        problem = holder_problem(paths, read_lease(paths), state)
    finally:
        if fd != -1:
            os.close(fd)
    if problem is not None:
        raise LeaseHeld(problem)


def take(paths: RunPaths, command: str, state: SlurmState = squeue_state) -> Taken:
    """Take the run directory's lease for this process (module docstring): :class:`LeaseHeld` (one line) while another
    live writer holds it, nothing written then; a stale holder is taken over (:attr:`Taken.note`)."""
    exists = paths.root.is_dir()
    fd = _try_lock(paths, create=False) if exists else -1
    if fd is None:
        raise _refusal(paths, read_lease(paths), _process_fix(read_lease(paths)))
    try:
        previous = read_lease(paths) if exists else None
        problem = holder_problem(paths, previous, state)
        if problem is not None:
            raise LeaseHeld(problem)
        if fd == -1:
            paths.root.mkdir(parents=True, exist_ok=True)
            fd = _try_lock(paths, create=True)
            if fd is None:  # another taker got there between our look and our lock
                raise _refusal(paths, read_lease(paths), _process_fix(read_lease(paths)))
    except BaseException:
        if fd not in (None, -1):
            os.close(fd)
        raise
    lease = Lease(kind="process", host=socket.gethostname(), pid=os.getpid(), since=time.time(), command=command)
    write_record(paths.root / LEASE, lease)
    note = None
    if previous is not None:
        note = f"took over the lease of {paths.root} from {previous.holder()}, which no longer holds it"
    return Taken(paths, lease, note, fd)


def check_for_job(paths: RunPaths, job: str, chain_job: str | None = None, state: SlurmState = squeue_state,
                  wait_s: float = 120.0) -> str | None:
    """The ranks of Slurm job ``job`` (rank 0, before anything is written): refuse (:class:`LeaseHeld`) a run directory
    leased to another live job or process; take it over from a holder that has ended (returns a note). ``chain_job``:
    the job whose lease this chain works under. A process lease still held is waited for up to ``wait_s`` (a
    ``submit`` hands the lease to the job right after ``sbatch`` returns)."""
    deadline = time.monotonic() + wait_s
    while True:
        fd = _try_lock(paths, create=False)
        if fd is not None or time.monotonic() > deadline:
            break
        lease = read_lease(paths)
        if lease is not None and lease.kind == "slurm":  # handed to a job while we waited
            fd = -1
            break
        time.sleep(0.5)
    if fd is None:
        lease = read_lease(paths)
        raise _refusal(paths, lease, _process_fix(lease))
    try:
        lease = read_lease(paths)
        if lease is not None and lease.kind == "slurm" and lease.job in (job, chain_job):
            return None
        problem = holder_problem(paths, lease, state, own_job=job)
        if problem is not None:
            raise LeaseHeld(problem + f" (refused by Slurm job {job})")
        ours = lease is not None and lease.kind == "slurm" and lease.job is not None and \
            newest_of_chain(paths, lease.job)[0] == job  # this job carries the leased chain on
        write_record(paths.root / LEASE, Lease(kind="slurm", host=socket.gethostname(), pid=os.getpid(), job=str(job),
                                               since=time.time(), command="train"))
        if lease is None or ours:
            return None
        return f"took over the lease of {paths.root} from {lease.holder()}, which no longer holds it"
    finally:
        if fd not in (None, -1):
            os.close(fd)


def wait_for_job(paths: RunPaths, job: str, chain_job: str | None = None, wait_s: float = 180.0) -> None:
    """The other ranks of Slurm job ``job``: wait (reading only) until the lease names this job or its chain — rank 0
    checks and takes it (:func:`check_for_job`) — else :class:`LeaseHeld` (rank 0 has said why)."""
    deadline = time.monotonic() + wait_s
    while True:
        lease = read_lease(paths)
        if lease is not None and lease.kind == "slurm" and lease.job in (job, chain_job):
            return
        if time.monotonic() > deadline:
            raise LeaseHeld(f"{paths.root}: not leased to Slurm job {job} after {wait_s:.0f} s (rank 0 says why)")
        time.sleep(1.0)

