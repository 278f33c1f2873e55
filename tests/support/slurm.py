"""A real local Slurm cluster for tests: start, submit, wait.

``local_slurm_cluster(base)`` starts a :class:`LocalSlurmCluster` in ``base/local-slurm`` (slurm-wlm and
munge must be installed: ``bash scripts/test.sh`` installs them), yields it and stops it at the end. ``sbatch`` submits a
script text, ``wait_job`` polls :func:`query_job` until the job has finished, ``wait_output`` polls a
job's output file, ``poll_until`` any other condition: tests wait on the event, never for a fixed time. Slurm needs
root here (daemons run as SlurmUser=root); elsewhere the tests skip.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from clustertrain.launch.slurm_cluster import LocalSlurmCluster
from clustertrain.launch.slurm_query import JobState, query_job

T = TypeVar("T")


def local_slurm_cluster(base: Path, nodes: int = 2, **kwargs) -> Iterator[LocalSlurmCluster]:
    """Start a cluster under ``base``, yield it, stop it (also when the test failed)."""
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (slurmctld/slurmd run as SlurmUser=root)")
    cluster = LocalSlurmCluster(base / "local-slurm", nodes=nodes, **kwargs)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


def client_env(cluster: LocalSlurmCluster) -> dict[str, str]:
    return {**os.environ, **cluster.env()}


def sbatch(cluster: LocalSlurmCluster, workdir: Path, script: str, *options: str) -> str:
    """Submit ``script`` (a bash body) from ``workdir`` with output to ``workdir/slurm-<id>.out``; return the id."""
    path = workdir / f"job-{time.monotonic_ns()}.sh"
    path.write_text("#!/bin/bash\n" + script)
    proc = subprocess.run(["sbatch", "--parsable", "-o", str(workdir / "slurm-%j.out"), *options, str(path)],
                          capture_output=True, text=True, env=client_env(cluster), cwd=workdir, timeout=30)
    assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
    return proc.stdout.strip().split(";")[0]


def wait_job(cluster: LocalSlurmCluster, job_id: str, timeout: float = 30.0) -> JobState:
    """Poll until the job has finished; fail the test with its last state otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        state = query_job(job_id, cluster.env())
        if state.finished:
            return state
        if time.monotonic() > deadline:
            pytest.fail(f"Slurm job {job_id} did not finish in {timeout:.0f}s: {state}")
        time.sleep(0.1)


def wait_output(path: Path, text: str, timeout: float = 30.0) -> str:
    """Poll a job's output file until it contains ``text``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.05)
    pytest.fail(f"{path} never contained {text!r}")


def poll_until(poll: Callable[[], T], done: Callable[[T], bool], timeout: float = 30.0, interval: float = 0.1) -> T:
    """Call ``poll`` until ``done`` accepts its value or ``timeout`` s have passed; return the last value, for the
    caller to assert on (so the failure shows what was still there)."""
    deadline = time.monotonic() + timeout
    while True:
        value = poll()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(interval)
