"""Fault drills on a real local Slurm cluster (3 emulated nodes; a 2-node job leaves one spare): a rank hung inside
a collective, a rank killed with SIGKILL, a node lost mid-run. Each must end the job quickly, name the rank and node,
blame the node, and go on in a new job that excludes it and resumes from the last complete checkpoint.

The hang drill runs with the project's default watchdog settings (heartbeat 5 s, floor 30 s): the acceptance bound
is max(3 x step time, 60 s) from the hang to the end of the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clustertrain.launch.config import LaunchConfig
from clustertrain.core.job_records import read_end_marker, read_records
from clustertrain.launch.slurm import SlurmLauncher, submit_project
from clustertrain.launch.slurm_query import query_job
from clustertrain.core.run_events import read_events
from clustertrain.monitor.suspects import active_suspects
from clustertrain.resolve import load_project
from clustertrain.core.run_paths import RunPaths
from tests.support.slurm import local_slurm_cluster
from tests.support.training import metrics, wait_for

pytestmark = pytest.mark.slow

PROJECT = """
name: {name}
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1, threads_per_worker: 1}}
storage: {{root: {root}}}
launch: {{exclusive: false}}
{monitor}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: {steps}, micro_batch: 4, global_batch: 8, lr: 3.0e-3, min_lr: 3.0e-4,
               checkpoint_every: 4, keep_last: 3, log_every: 1, seed: 7, async_checkpoint: false}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("drills"), nodes=3)


def submit(cluster, tmp_path: Path, name: str, steps: int = 30, monitor: str = "", **env) -> tuple[Path, str]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(PROJECT.format(name=name, root=json.dumps(str(tmp_path / "fsx")), steps=steps, monitor=monitor))
    project = load_project(path)
    slurm = SlurmLauncher(env={**cluster.env(), **env}, launch=LaunchConfig(exclusive=False))
    [sub] = submit_project(project, None, None, resume=True, launcher=slurm)
    return sub.run_dir, sub.job_id


def follow(cluster, run: Path, job: str, timeout: float) -> str:
    """Wait for ``job`` to end and return the job that carries the run on (its end marker's next_job)."""
    marker = wait_for(lambda: read_end_marker(RunPaths(run), job), timeout, interval=0.2)
    assert marker.next_job, f"job {job} ended {marker.state} without a successor:\n{output(run, job)}"
    return marker.next_job


def finish(cluster, run: Path, job: str, timeout: float = 120) -> None:
    marker = wait_for(lambda: read_end_marker(RunPaths(run), job), timeout, interval=0.2)
    assert marker.state == "COMPLETED", output(run, job)


def output(run: Path, job: str) -> str:
    record = next(r for r in read_records(RunPaths(run)) if r.job_id == job)
    return Path(record.output).read_text(errors="replace") if Path(record.output).exists() else "(no output)"


def rank_node(run: Path, rank: int) -> str:
    return json.loads((RunPaths(run).rank_heartbeat(rank)).read_bytes())["node"]


def assert_resumed_without(cluster, run: Path, job: str, node: str, checkpoint_step: int) -> None:
    state = query_job(job, cluster.env())
    assert node not in state.nodes, state
    finish(cluster, run, job)
    log = output(run, job)
    assert f"resumed from {run / 'checkpoints' / f'step_{checkpoint_step:08d}'}" in log, log[-3000:]
    assert [r["step"] for r in metrics(run)][-1] == 30
    assert node in active_suspects(RunPaths(run).root.parent / "suspects.jsonl")


def test_a_rank_hung_in_an_all_reduce_ends_the_job_within_the_bound_and_the_restart_excludes_its_node(
        cluster, tmp_path):
    run, job = submit(cluster, tmp_path, "hang", CLUSTERTRAIN_INJECT_HANG="1:10")
    successor = follow(cluster, run, job, timeout=150)
    [incident] = [json.loads(p.read_text()) for p in (run / "incidents").glob("*/incident.json")]
    node = incident["nodes"][0]
    assert (incident["kind"], incident["ranks"], incident["phase"], incident["step"]) == ("hang", [1], "collective", 10)
    assert f"rank 1 on {node} is stuck in collective of step 10" in incident["message"]
    assert incident["missing_stacks"] == [] and len(incident["stacks"]) == 2
    stack = (run / "incidents" / incident["id"] / "stacks" / "rank1.txt").read_text()
    assert "in _hang" in stack and "in recv" in stack  # the stuck rank's own Python stack: the receive nobody answers
    peer = (run / "incidents" / incident["id"] / "stacks" / "rank0.txt").read_text()
    assert "in _hang" not in peer  # the peer waits in its own collective for rank 1
    ended = read_end_marker(RunPaths(run), job).ended
    step_time = max(r["step_time_s"] for r in metrics(run) if r["step"] > 1)
    hung_at = incident["detected"] - incident["waited_s"]
    assert ended - hung_at <= max(3 * step_time, 60), (ended - hung_at, incident)
    assert "submitting the job again (failure restart 1 of 3, restart 1) without " + node in output(run, job)
    assert_resumed_without(cluster, run, successor, node, checkpoint_step=8)
    kinds = [e.kind for e in read_events(RunPaths(run))]
    assert "hang" in kinds and "node_suspect" in kinds


def test_a_rank_killed_with_sigkill_is_blamed_on_its_node_and_the_run_resumes_elsewhere(cluster, tmp_path):
    run, job = submit(cluster, tmp_path, "kill", monitor="monitor: {heartbeat_s: 1}")
    wait_for(lambda: any(r["step"] >= 9 for r in metrics(run)), 90)
    pid = json.loads(RunPaths(run).rank_heartbeat(1).read_bytes())["pid"]
    node = rank_node(run, 1)
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    successor = follow(cluster, run, job, timeout=60)
    assert read_end_marker(RunPaths(run), job).ended - killed < 60
    log = output(run, job)
    assert f"Slurm reports {node}: task 1: Killed" in log, log[-3000:]
    saved = max(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))
    assert_resumed_without(cluster, run, successor, node, checkpoint_step=saved if saved < 30 else 8)


def _node_processes(job: str, node: str) -> list[int]:
    """The ranks of ``job`` on emulated ``node`` and the slurmstepd above them."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            env = proc.joinpath("environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if f"SLURMD_NODENAME={node}".encode() in env and f"SLURM_JOB_ID={job}".encode() in env:
            out.append(int(proc.name))
            parent = int(proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
            if Path(f"/proc/{parent}/cmdline").read_bytes().startswith(b"slurmstepd"):
                out.append(parent)
    return out


def test_a_lost_node_fails_the_job_within_60s_and_the_run_resumes_without_it(cluster, tmp_path):
    """Last in the module: the killed node stays down for the rest of this cluster's life. A 1 s heartbeat (as the
    SIGKILL drill's) keeps the watchdog's waits short: a rank is lost after 3 x 1 + 5 s of silence, and the waits for
    stacks and exits after it are 2 x 1 + 10 s at most (clustertrain/monitor/hang_rules.py, hang_watchdog.py)."""
    run, job = submit(cluster, tmp_path, "lost", monitor="monitor: {heartbeat_s: 1}")
    wait_for(lambda: any(r["step"] >= 9 for r in metrics(run)), 90)
    node = rank_node(run, 1)
    slurmd = subprocess.run(["pgrep", "-f", f"slurmd .*-N {node}$"], capture_output=True, text=True).stdout.split()
    victims = [int(p) for p in slurmd] + _node_processes(job, node)
    assert slurmd and len(victims) >= 3, victims
    lost = time.time()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    successor = follow(cluster, run, job, timeout=90)
    assert read_end_marker(RunPaths(run), job).ended - lost < 60
    events = [e for e in read_events(RunPaths(run)) if e.kind == "rank_lost"]
    assert events and events[0].node == node and "no heartbeat" in events[0].message
    saved = max(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*") if int(p.name[5:]) < 30)
    assert_resumed_without(cluster, run, successor, node, checkpoint_step=saved)
