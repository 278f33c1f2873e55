"""`status` on a cluster configured like ParallelCluster (JobCompType=jobcomp/none; MinJobAge short here, 300 s
there): after slurmctld has forgotten a job, the run directory's own records give its final state.

On the old code `status` then failed with "cannot read finished jobs: JobCompType is 'jobcomp/none'"."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clustertrain.launch.config import LaunchConfig
from clustertrain.launch.jobs import read_end_marker, read_records
from clustertrain.launch.slurm import SlurmLauncher, submit_project
from clustertrain.launch.slurm_query import JobGone, query_job
from clustertrain.project import load_project
from clustertrain.rundir import RunPaths
from tests.support.slurm import client_env, local_slurm_cluster
from tests.support.training import metrics, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pcluster_like_slurm(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("pcslurm"), nodes=2, jobcomp="none", min_job_age=2)


def forgotten(cluster, job_id: str) -> bool:
    try:
        query_job(job_id, cluster.env())
        return False
    except JobGone:
        return True


def status_cli(cluster, path, model: str) -> tuple[int, dict]:
    """`clustertrain status PROJECT --model MODEL --json`: its exit code and the model's row."""
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "status", str(path), "--model", model, "--json"],
                          capture_output=True, text=True, env=client_env(cluster), timeout=60)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    [row] = json.loads(proc.stdout)
    return proc.returncode, row


def job_of(row: dict) -> tuple:
    return row["job_id"], row["state"], row["job_state"], row["exit_code"], row["restarts"]


def test_status_after_slurm_forgot_completed_failed_and_cancelled_jobs(pcluster_like_slurm, slurm_project):
    cluster = pcluster_like_slurm
    path = slurm_project(models=("done", "crash", "stop"), steps=4, ckpt=2, name="pc")
    project = load_project(path, ["models.stop.training.max_steps=100000"])
    launch = LaunchConfig(exclusive=False)
    plain = SlurmLauncher(env=cluster.env(), launch=launch)
    crashing = SlurmLauncher(env={**cluster.env(), "CLUSTERTRAIN_INJECT_FAILURE": "0:2"}, launch=launch)
    [done] = submit_project(project, "done", None, True, plain)
    [crash] = submit_project(project, "crash", None, True, crashing)
    [stop] = submit_project(project, "stop", None, True, plain)
    wait_for(lambda: any(r["step"] >= 2 for r in metrics(stop.run_dir)), 120)
    subprocess.run(["scancel", stop.job_id], check=True, env=client_env(cluster))
    # nobody asks for a status while the controller still knows the jobs: jobs.jsonl records no end
    assert wait_for(lambda: all(forgotten(cluster, s.job_id) for s in (done, crash, stop)), 120, interval=0.5)
    assert [r.state for s in (done, crash, stop) for r in read_records(RunPaths(s.run_dir))] == [None, None, None]

    assert read_end_marker(RunPaths(done.run_dir), done.job_id).state == "COMPLETED"
    code, ok = status_cli(cluster, path, "done")
    assert code == 0 and job_of(ok) == (done.job_id, "completed", "COMPLETED", 0, 0) and ok["step"] == 4, ok
    assert ok["job_detail"] == "COMPLETED"
    code, failed = status_cli(cluster, path, "crash")
    assert code == 1 and job_of(failed)[:3] == (crash.job_id, "failed", "FAILED") and failed["job_detail"] == "FAILED", failed
    code, cancelled = status_cli(cluster, path, "stop")
    assert code == 1 and job_of(cancelled)[:4] == (stop.job_id, "failed", "CANCELLED", 143), cancelled
    assert cancelled["job_detail"] == "CANCELLED"
    # the status seen is now also in jobs.jsonl
    assert [r.state for s in (done, crash, stop) for r in read_records(RunPaths(s.run_dir))] == \
        ["COMPLETED", "FAILED", "CANCELLED"]


def test_a_job_that_left_no_marker_is_reported_failed_not_an_error(pcluster_like_slurm, slurm_project):
    cluster = pcluster_like_slurm
    path = slurm_project(models=("gone",), steps=2, ckpt=2, name="pc2")
    project = load_project(path)
    slurm = SlurmLauncher(env=cluster.env(), launch=LaunchConfig(exclusive=False))
    [sub] = submit_project(project, None, None, True, slurm)
    assert wait_for(lambda: forgotten(cluster, sub.job_id), 120, interval=0.5)
    marker = RunPaths(sub.run_dir).root / "jobs" / f"{sub.job_id}.end"
    marker.unlink()  # as after SIGKILL or a node failure: the script never reached its end
    st = slurm.status(slurm.attach(RunPaths(sub.run_dir)))
    assert st.state == "FAILED" and "without an end marker" in st.detail and st.extra["source"] == "run-dir"
