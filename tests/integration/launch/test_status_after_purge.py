"""`status` on a cluster configured like ParallelCluster (JobCompType=jobcomp/none; MinJobAge short here, 300 s
there): after slurmctld has forgotten a job, the run directory's own records give its final state.

On the old code `status` then failed with "cannot read finished jobs: JobCompType is 'jobcomp/none'"."""

from __future__ import annotations

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


def status_cli(cluster, path, model: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clustertrain", "status", str(path), "--model", model],
                          capture_output=True, text=True, env=client_env(cluster), timeout=60)


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
    ok = status_cli(cluster, path, "done")
    assert ok.returncode == 0 and f"done: job {done.job_id} COMPLETED [COMPLETED], exit 0, restarts 0, step 4" in ok.stdout, \
        ok.stdout + ok.stderr
    failed = status_cli(cluster, path, "crash")
    assert failed.returncode == 1 and f"crash: job {crash.job_id} FAILED [FAILED]" in failed.stdout, failed.stdout + failed.stderr
    cancelled = status_cli(cluster, path, "stop")
    assert cancelled.returncode == 1 and f"stop: job {stop.job_id} CANCELLED [CANCELLED], exit 143" in cancelled.stdout, \
        cancelled.stdout + cancelled.stderr
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
