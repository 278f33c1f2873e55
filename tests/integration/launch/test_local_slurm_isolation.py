"""Two local Slurm clusters on this machine at once: each submits and cancels, `up` never touches a cluster it
did not start, and `down` on one leaves the other's jobs running and nothing of its own -- not even a job that
ignores SIGTERM and an orphan it left in a new session (checked with psutil)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from clustertrain.cli.local_slurm import app
from clustertrain.core.errors import LaunchError
from clustertrain.launch.slurm_cluster import LocalSlurmCluster
from clustertrain.launch.slurm_cluster_procs import wait_for
from clustertrain.launch.slurm_query import query_job
from clustertrain.launch.slurmcli import slurm_unreachable
from tests.support.slurm import client_env, sbatch, wait_job, wait_output

pytestmark = pytest.mark.slow

#: a batch script that ignores SIGTERM, with a child that does too and an orphan in a session of its own
#: (its parent subshell exits at once); every pid goes to pids-<job> so the test knows them without asking Slurm
STUBBORN = """trap '' TERM
echo $$ >> pids-$SLURM_JOB_ID
( exec sleep 3001 ) &
echo $! >> pids-$SLURM_JOB_ID
( ( exec setsid sleep 3002 ) & echo $! >> pids-$SLURM_JOB_ID )
echo ready
while :; do sleep 1; done
"""


def live(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def of_cluster(cluster: LocalSlurmCluster) -> list[str]:
    """Live processes whose command line, environment or working directory names the cluster's state dir or its
    ClusterName (a slurmstepd shows only its working directory: slurmd's, the state dir)."""
    found, needles = [], (str(cluster.paths.root), cluster.paths.cluster_name)
    for proc in psutil.process_iter(["cmdline", "environ", "cwd", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            continue
        text = " ".join([*(proc.info["cmdline"] or ()), *(proc.info["environ"] or {}).values(), proc.info["cwd"] or ""])
        if any(n in text for n in needles):
            found.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or ())}")
    return found


def stubborn_job(cluster: LocalSlurmCluster, workdir: Path) -> tuple[str, list[int]]:
    job_id = sbatch(cluster, workdir, STUBBORN, "-J", "stubborn")
    wait_output(workdir / f"slurm-{job_id}.out", "ready")
    pids = [int(p) for p in (workdir / f"pids-{job_id}").read_text().split()]
    assert len(pids) == 3 and all(live(p) for p in pids), pids
    pids.append(psutil.Process(pids[0]).ppid())  # the job's slurmstepd
    assert psutil.Process(pids[3]).name() == "slurmstepd"
    orphan = psutil.Process(pids[2])
    assert orphan.ppid() != pids[0] and os.getsid(pids[2]) == pids[2]  # really left its job's tree and session
    return job_id, pids


def cancel_one(cluster: LocalSlurmCluster, workdir: Path) -> None:
    job_id = sbatch(cluster, workdir, "echo ready\nsleep 300\n", "-J", "short")
    wait_output(workdir / f"slurm-{job_id}.out", "ready")
    subprocess.run(["scancel", job_id], check=True, env=client_env(cluster), timeout=30)
    assert wait_job(cluster, job_id).state == "CANCELLED"


def down_on_a_terminal(root: Path, answer: str) -> tuple[int, str]:
    """`clustertrain local-slurm down` with a terminal: answer its question; return its exit code and output."""
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "clustertrain", "local-slurm", "down", "--state-dir", str(root)],
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out, answered, deadline = b"", False, time.monotonic() + 60
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            out += chunk
        if not answered and b"stop the cluster?" in out:
            os.write(master, answer.encode() + b"\n")
            answered = True
    os.close(master)
    return proc.wait(30), out.decode(errors="replace")


@pytest.fixture
def two_clusters(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (slurmctld/slurmd run as SlurmUser=root)")
    a = LocalSlurmCluster(tmp_path / "a", nodes=1, cpus_per_node=2)
    b = LocalSlurmCluster(tmp_path / "b", nodes=1, cpus_per_node=2)
    try:
        a.up()
        b.up()
        yield a, b
    finally:
        for cluster in (a, b):
            try:
                cluster.down()
            except LaunchError:
                pass


def test_two_clusters_never_affect_each_other_and_down_leaves_nothing(two_clusters, tmp_path):
    a, b = two_clusters
    wa, wb = tmp_path / "wa", tmp_path / "wb"
    wa.mkdir()
    wb.mkdir()
    assert a.paths.cluster_name != b.paths.cluster_name
    assert f"ClusterName={a.paths.cluster_name}" in a.paths.conf.read_text().splitlines()
    record = a.paths.read_record()
    assert record["owner"]["pid"] == os.getpid() and record["owner"]["uid"] == os.getuid()
    assert set(record["node_ports"].values()).isdisjoint(b.paths.read_record()["node_ports"].values())
    assert slurm_unreachable(a.env()) is None and slurm_unreachable(b.env()) is None
    job_a, pids_a = stubborn_job(a, wa)
    job_b, pids_b = stubborn_job(b, wb)
    cancel_one(a, wa)  # a cancel on one cluster ...
    cancel_one(b, wb)
    assert query_job(job_a, a.env()).state == "RUNNING" and query_job(job_b, b.env()).state == "RUNNING"  # ... only
    assert all(live(p) for p in pids_a + pids_b)

    # `up` with other options does not restart a running cluster; with a daemon gone it does not restart it either
    with pytest.raises(LaunchError, match="already runs with .*started by .* it is not restarted") as err:
        LocalSlurmCluster(b.paths.root, nodes=2, cpus_per_node=2).up()
    assert "\n" not in str(err.value) and f"down --state-dir {b.paths.root}" in str(err.value)
    slurmd_a = a.paths.read_record()["pids"]["slurmd-node1"]
    os.kill(slurmd_a, signal.SIGKILL)
    assert wait_for(lambda: not live(slurmd_a), 10)
    with pytest.raises(LaunchError, match="is partly running .* `up` does not restart a cluster it did not start"):
        LocalSlurmCluster(a.paths.root, nodes=1, cpus_per_node=2).up()
    assert all(live(p) for p in pids_a + pids_b)  # nothing was touched

    # `down` without a terminal and without --yes names the jobs and stops nothing
    runner = CliRunner()
    refused = runner.invoke(app, ["down", "--state-dir", str(a.paths.root)])
    assert refused.exit_code == 2, refused.output
    assert refused.output.strip().count("\n") == 0 and "Traceback" not in refused.output
    assert f"job {job_a} 'stubborn' of root, RUNNING" in refused.output and "--yes" in refused.output
    assert all(live(p) for p in pids_a) and a.status().pids["slurmctld"]

    # on a terminal it lists them and asks; "n" stops nothing
    code, asked = down_on_a_terminal(a.paths.root, "n")
    assert code == 1 and f"job {job_a} 'stubborn' of root, RUNNING" in asked and "stop the cluster? [y/N]" in asked
    assert all(live(p) for p in pids_a) and a.status().pids["slurmctld"]

    done = runner.invoke(app, ["down", "--state-dir", str(a.paths.root), "--yes"])
    assert done.exit_code == 0, done.output
    assert f"cancelled job {job_a} 'stubborn' of root, RUNNING" in done.output and "stopped" in done.output
    assert [p for p in pids_a if live(p)] == []
    assert of_cluster(a) == []
    assert not a.status().running
    gone = slurm_unreachable(a.env())
    assert f"SLURM_CONF={a.paths.conf} (controller 127.0.0.1:{record['ctld_port']})" in gone and "is DOWN" in gone

    # the other cluster: its job still runs, every process of it alive, and it still takes and cancels jobs
    assert query_job(job_b, b.env()).state == "RUNNING" and all(live(p) for p in pids_b)
    assert b.status().nodes == {"node1": "MIXED"}
    cancel_one(b, wb)
    assert [j.job_id for j in b.jobs()] == [job_b]
    started = time.monotonic()
    assert [j.job_id for j in b.down()] == [job_b]
    assert [p for p in pids_b if live(p)] == [] and of_cluster(b) == []
    assert time.monotonic() - started < 40
