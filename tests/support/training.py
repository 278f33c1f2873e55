"""Helpers for tests that run real training: real worker processes over torch.distributed (gloo)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil


def clustertrain(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "clustertrain", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **(env or {})}, start_new_session=True, **kw)


def run_cli(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    p = clustertrain(*args, env=env)
    out, _ = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, "")


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def wait_for(predicate, timeout: float, interval: float = 0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def worker_pids(launcher_pid: int) -> list[int]:
    """The launcher's direct children (the rank processes)."""
    try:
        return [child.pid for child in psutil.Process(launcher_pid).children()]
    except psutil.NoSuchProcess:
        return []


def _gone(pid: int) -> bool:
    """True when the process no longer exists or is a zombie (killed, not yet reaped)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and its workers at the same moment."""
    pids = worker_pids(proc.pid)
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    for pid in pids:
        wait_for(lambda: _gone(pid), 10)


def processes_mentioning(text: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``text``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        if text in cmd and proc.info["status"] not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            found.append(proc.pid)
    return found
