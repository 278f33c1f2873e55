"""`status` on a cluster configured like ParallelCluster (JobCompType=jobcomp/none; MinJobAge short here, 300 s
there): after slurmctld has forgotten a job, the run directory's own records give its final state.

On the old code `status` then failed with "cannot read finished jobs: JobCompType is 'jobcomp/none'".

Both tests read the jobs of one module fixture (:func:`forgotten_jobs`): four jobs submitted at once, each left
alone until slurmctld has forgotten it. The nodes declare 4 CPUs (the emulation's declaration, not this machine's),
so the four 1-CPU-per-node jobs run side by side instead of two by two, and the controller forgets them in one
MinJobAge wait instead of two."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clustertrain.launch.config import LaunchConfig
from clustertrain.core.job_records import read_end_marker, read_records
from clustertrain.launch.slurm import SlurmLauncher, submit_project
from clustertrain.launch.slurm_query import JobGone, query_job
from clustertrain.resolve import load_project
from clustertrain.core.run_paths import RunPaths
from tests.integration.launch.conftest import TINY_MODEL, TINY_SLURM
from tests.support.slurm import client_env, local_slurm_cluster
from tests.support.training import metrics, wait_for

pytestmark = pytest.mark.slow

MODELS = ("done", "crash", "stop", "gone")


@pytest.fixture(scope="module")
def pcluster_like_slurm(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("pcslurm"), nodes=2, cpus_per_node=len(MODELS),
                                   jobcomp="none", min_job_age=2)


def forgotten(cluster, job_id: str) -> bool:
    try:
        query_job(job_id, cluster.env())
        return False
    except JobGone:
        return True


@pytest.fixture(scope="module")
def forgotten_jobs(pcluster_like_slurm, tmp_path_factory):
    """Submit, at once: ``done`` (completes its 4 steps), ``crash`` (rank 0 raises before step 2), ``stop`` (endless,
    cancelled after step 2) and ``gone`` (2 steps; its end marker is for the second test to delete); wait until the
    controller has forgotten all four. Nobody asks for a status meanwhile. Returns (project file, submissions)."""
    cluster, base = pcluster_like_slurm, tmp_path_factory.mktemp("pc")
    path = base / "pc.yaml"
    path.write_text(TINY_SLURM.format(name="pc", root=json.dumps(str(base / "fsx")),  # the Slurm backend tests' project
                                      models="".join(TINY_MODEL.format(model=m, steps=4, ckpt=2) for m in MODELS)))
    project = load_project(path, ["models.stop.training.max_steps=100000", "models.gone.training.max_steps=2"])
    launch = LaunchConfig(exclusive=False)
    plain = SlurmLauncher(env=cluster.env(), launch=launch)
    crashing = SlurmLauncher(env={**cluster.env(), "CLUSTERTRAIN_INJECT_FAILURE": "0:2"}, launch=launch)
    subs = {}
    for model in MODELS:
        [subs[model]] = submit_project(project, model, None, True, crashing if model == "crash" else plain)
    stop = subs["stop"]
    wait_for(lambda: any(r["step"] >= 2 for r in metrics(stop.run_dir)), 120)
    subprocess.run(["scancel", stop.job_id], check=True, env=client_env(cluster))
    assert wait_for(lambda: all(forgotten(cluster, s.job_id) for s in subs.values()), 120, interval=0.5)
    return path, subs


def status_cli(cluster, path, model: str) -> tuple[int, dict]:
    """`clustertrain status PROJECT --model MODEL --json`: its exit code and the model's row."""
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "status", str(path), "--model", model, "--json"],
                          capture_output=True, text=True, env=client_env(cluster), timeout=60)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    [row] = json.loads(proc.stdout)
    return proc.returncode, row


def job_of(row: dict) -> tuple:
    return row["job_id"], row["state"], row["job_state"], row["exit_code"], row["restarts"]


def test_status_after_slurm_forgot_completed_failed_and_cancelled_jobs(pcluster_like_slurm, forgotten_jobs):
    cluster = pcluster_like_slurm
    path, subs = forgotten_jobs
    done, crash, stop = subs["done"], subs["crash"], subs["stop"]
    # nobody asked for a status while the controller still knew the jobs: jobs.jsonl records no end
    assert all(forgotten(cluster, s.job_id) for s in (done, crash, stop))
    assert [r.state for s in (done, crash, stop) for r in read_records(RunPaths(s.run_dir))] == [None, None, None]

    assert read_end_marker(RunPaths(done.run_dir), done.job_id).state == "COMPLETED"
    code, ok = status_cli(cluster, path, "done")
    assert code == 0 and job_of(ok) == (done.job_id, "completed", "COMPLETED", 0, 0) and ok["step"] == 4, ok
    assert ok["job_detail"] == "COMPLETED"
    code, failed = status_cli(cluster, path, "crash")
    assert code == 1 and job_of(failed)[:3] == (crash.job_id, "failed", "FAILED") and failed["job_detail"] == "FAILED", failed
    code, cancelled = status_cli(cluster, path, "stop")
    assert code == 1 and job_of(cancelled)[:4] == (stop.job_id, "cancelled", "CANCELLED", 143), cancelled
    assert cancelled["job_detail"] == "CANCELLED"
    # the status seen is now also in jobs.jsonl
    assert [r.state for s in (done, crash, stop) for r in read_records(RunPaths(s.run_dir))] == \
        ["COMPLETED", "FAILED", "CANCELLED"]


def test_a_job_that_left_no_marker_is_reported_failed_not_an_error(pcluster_like_slurm, forgotten_jobs):
    cluster = pcluster_like_slurm
    _, subs = forgotten_jobs
    sub = subs["gone"]
    slurm = SlurmLauncher(env=cluster.env(), launch=LaunchConfig(exclusive=False))
    assert forgotten(cluster, sub.job_id)
    marker = RunPaths(sub.run_dir).root / "jobs" / f"{sub.job_id}.end"
    marker.unlink()  # as after SIGKILL or a node failure: the script never reached its end
    st = slurm.status(slurm.attach(RunPaths(sub.run_dir)))
    assert st.state == "FAILED" and "without an end marker" in st.detail and st.extra["source"] == "run-dir"
