"""Helpers for tests that run real training: real worker processes over torch.distributed (gloo)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


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
    out = subprocess.run(["ps", "-eo", "pid,ppid"], capture_output=True, text=True).stdout.split("\n")[1:]
    return [int(line.split()[0]) for line in out if line.strip() and int(line.split()[1]) == launcher_pid]


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
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], 10)


def processes_mentioning(text: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append(int(proc.name))
    return found
