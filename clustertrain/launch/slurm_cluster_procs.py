"""The processes of a local Slurm cluster, through psutil: which are ours, stopping them, waiting.

A daemon is *ours* when it is alive and names this cluster's state directory: ``slurm.conf`` on its
command line (slurmctld, slurmd), munged's ``--socket=`` there, or ``SLURM_CONF`` in the environment of
a Slurm daemon (slurmstepd inherits it). That guards against pid reuse and against another cluster
on the same machine. Zombies count as gone: a stopped daemon whose parent has not reaped it yet
(or whose parent is a container's init that never does) is not running.

:func:`cluster_processes` adds what ``down()`` must leave nothing of: the processes of this cluster's jobs
(``SLURM_JOB_ID`` in the environment with this cluster's ``SLURM_CONF`` or ``SLURM_CLUSTER_NAME``, also
after they left their step: orphans, new sessions), its slurmstepd processes and everything under them and
under its slurmd. A slurmstepd shows neither: it rewrites its command line (``slurmstepd: [1.batch]``),
/proc shows it no environment and its parent is init (slurmd double-forks it); it is found by its working
directory, slurmd's, which is the state directory itself (exactly: a cluster whose state dir lies inside
another's is not the other's). Another cluster's differ in all of these; a user's shell with this ``SLURM_CONF`` exported is not
a job (no ``SLURM_JOB_ID``), and the caller and its ancestors are never counted.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from clustertrain.core.errors import LaunchError
from clustertrain.launch.slurm_cluster_paths import LocalSlurmPaths

DAEMON_NAMES = ("munged", "slurmctld", "slurmd", "slurmstepd")
_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def alive(pid: int) -> bool:
    """True when the process exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() not in _GONE
    except (psutil.Error, ValueError):
        return False


def is_ours(pid: object, paths: LocalSlurmPaths) -> bool:
    """The pid is alive and is a daemon started for this state dir (see the module docstring)."""
    if not isinstance(pid, int) or not alive(pid):
        return False
    try:
        proc = psutil.Process(pid)
        args = proc.cmdline()
        if str(paths.conf) in args or f"--socket={paths.munge_socket}" in args:
            return True
        return proc.name() in DAEMON_NAMES and proc.environ().get("SLURM_CONF") == str(paths.conf)
    except psutil.Error:
        return False


def cluster_processes(paths: LocalSlurmPaths) -> list[psutil.Process]:
    """Every live process of this cluster: its daemons, its jobs' processes and the trees under its slurmd and
    slurmstepd processes (see the module docstring); never this process or one of its ancestors. Each has
    ``.info["name"]``."""
    me = psutil.Process()
    spare = {me.pid, *(p.pid for p in me.parents())}
    conf, name, root = str(paths.conf), paths.cluster_name, os.path.realpath(paths.root)
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["name", "environ", "status", "cwd"]):
        if proc.pid in spare or proc.info["status"] in _GONE:
            continue
        env = proc.info["environ"] or {}
        job = "SLURM_JOB_ID" in env and (env.get("SLURM_CONF") == conf or env.get("SLURM_CLUSTER_NAME") == name)
        step = proc.info["name"] == "slurmstepd" and proc.info["cwd"] is not None and (
            os.path.realpath(proc.info["cwd"]) == root)
        if job or step or (proc.info["name"] in DAEMON_NAMES and is_ours(proc.pid, paths)):
            found[proc.pid] = proc
    for proc in [p for p in found.values() if p.info["name"] in ("slurmd", "slurmstepd")]:
        try:
            children = proc.children(recursive=True)
        except psutil.Error:
            continue
        for child in children:
            if child.pid in spare or child.pid in found:
                continue
            try:
                child.info = {"name": child.name()}  # as process_iter sets it: every returned process has .info
            except psutil.Error:
                continue
            found[child.pid] = child
    return [p for p in found.values() if alive(p.pid)]


def stop_processes(procs: list[psutil.Process], grace: float = 3.0) -> list[psutil.Process]:
    """SIGTERM to all of ``procs``, SIGKILL to those alive ``grace`` s later; return those still alive 5 s after
    that (none, unless a process is stuck in the kernel)."""
    for send, wait in (("terminate", grace), ("kill", 5.0)):
        for proc in procs:
            try:
                getattr(proc, send)()
            except psutil.Error:
                pass
        wait_for(lambda: all(_gone(p, None) for p in procs), wait)
        procs = [p for p in procs if not _gone(p, None)]
        if not procs:
            break
    return procs


def find_ours(paths: LocalSlurmPaths, names: set[str]) -> list[int]:
    """Pids of this cluster's live processes called one of ``names``."""
    me = os.getpid()
    return [p.pid for p in psutil.process_iter(["name"])
            if p.pid != me and p.info["name"] in names and is_ours(p.pid, paths)]


def stop(pid: int, child: subprocess.Popen | None = None, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; return once the process is gone. ``child`` is its
    Popen when this process started it (polled, so it is reaped and never lingers as a zombie)."""
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return
    for send, wait in ((proc.terminate, grace), (proc.kill, 5.0)):
        try:
            send()
        except psutil.Error:
            break
        if wait_for(lambda: _gone(proc, child), wait):
            break
    if child is not None:
        child.poll()


def _gone(proc: psutil.Process, child: subprocess.Popen | None) -> bool:
    if child is not None and child.poll() is not None:
        return True
    try:
        return not proc.is_running() or proc.status() in _GONE
    except psutil.Error:
        return True


def wait_for(cond: Callable[[], bool], timeout: float, what: str | None = None, log: Path | None = None) -> bool:
    """Poll ``cond`` until true (returns True) or ``timeout`` s passed: then False, or with ``what`` a
    :class:`LaunchError` naming it and the tail of ``log``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            if what is None:
                return False
            raise LaunchError(f"local Slurm: {what} not ready after {timeout:.0f}s; {log_tail(log)}")
        time.sleep(0.05)
    return True


def log_tail(log: Path | None, lines: int = 3) -> str:
    """The last non-empty lines of ``log`` on one line, for an error message."""
    try:
        tail = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-lines:]
    except (OSError, AttributeError):
        return f"no log at {log}"
    return f"last lines of {log}: " + " | ".join(tail) if tail else f"{log} is empty"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def total_memory_mb() -> int:
    """This machine's memory in MiB (what each emulated node declares as RealMemory)."""
    return max(1, psutil.virtual_memory().total >> 20)
