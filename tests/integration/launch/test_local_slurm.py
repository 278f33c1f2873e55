"""The local Slurm cluster against real slurmctld/slurmd/munged processes, read through slurm_query."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import psutil
import pytest

from clustertrain.core.errors import LaunchError
from clustertrain.launch.slurm_cluster import LocalSlurmCluster
from clustertrain.launch.slurm_query import find_jobcomp, list_jobs, query_job, query_nodes
from tests.support.slurm import client_env, local_slurm_cluster, poll_until, sbatch, wait_job, wait_output

pytestmark = pytest.mark.slow


def processes_referring_to(state_dir: Path) -> list[str]:
    """Live (non-zombie) processes whose command line, environment or working directory names ``state_dir``.
    The working directory is what finds a slurmstepd: it rewrites its command line (``slurmstepd: [1.batch]``),
    /proc shows it no environment, and its parent is init; it runs in slurmd's directory, the state dir."""
    found, needle = [], str(state_dir)
    for proc in psutil.process_iter(["cmdline", "environ", "cwd", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            continue
        cmdline = " ".join(proc.info["cmdline"] or ())
        environ = proc.info["environ"] or {}
        if needle in cmdline or needle in (proc.info["cwd"] or "") or any(needle in v for v in environ.values()):
            found.append(f"{proc.pid}: {cmdline}")
    return found


def kill_all(described: list[str]) -> None:
    """SIGKILL the ``"<pid>: <command line>"`` processes (what a failed check left behind)."""
    for line in described:
        try:
            psutil.Process(int(line.split(":")[0])).kill()
        except psutil.Error:
            pass


def test_cluster_is_up_and_up_is_idempotent(local_slurm):
    status = local_slurm.status()
    assert status.running and status.nodes == {"node1": "IDLE", "node2": "IDLE"}
    nodes = query_nodes(local_slurm.env())
    assert [(n.name, n.addr) for n in nodes] == [("node1", "127.0.0.1"), ("node2", "127.0.0.1")]
    again = LocalSlurmCluster(local_slurm.paths.root, nodes=2).up()
    assert again.pids == status.pids  # reused, not restarted
    with pytest.raises(LaunchError, match="already runs with"):
        LocalSlurmCluster(local_slurm.paths.root, nodes=3).up()
    assert find_jobcomp(local_slurm.env()) == local_slurm.paths.jobcomp


def test_two_node_job_completes_on_both_nodes(local_slurm, tmp_path):
    # each task writes the node Slurm ran it on (slurmd's SLURMD_NODENAME) to its own file: the job's log also
    # holds srun's own messages ("step creation temporarily disabled, retrying (Requested nodes are busy)")
    job_id = sbatch(local_slurm, tmp_path, f"srun --output={tmp_path}/task-%t.node printenv SLURMD_NODENAME\n",
                    "--nodes=2", "--ntasks-per-node=1", "-J", "two nodes")
    final = wait_job(local_slurm, job_id)  # NodeList of `scontrol show job`, expanded
    assert (final.state, final.exit_code, final.nodes, final.name) == ("COMPLETED", 0, ("node1", "node2"), "two nodes")
    ran_on = {p.name: p.read_text().strip() for p in tmp_path.glob("task-*.node")}
    assert sorted(ran_on.values()) == list(final.nodes), (ran_on, (tmp_path / f"slurm-{job_id}.out").read_text())
    from_squeue = {j.job_id: j for j in list_jobs(local_slurm.env())}[job_id]
    assert (from_squeue.state, from_squeue.nodes, from_squeue.exit_code) == ("COMPLETED", ("node1", "node2"), 0)


def test_usr2_reaches_the_batch_script_trap(local_slurm, tmp_path):
    script = "trap 'echo got USR2; exit 0' USR2\necho ready\nfor i in $(seq 300); do sleep 0.1; done\nexit 9\n"
    job_id = sbatch(local_slurm, tmp_path, script, "-J", "trap")
    out = tmp_path / f"slurm-{job_id}.out"
    wait_output(out, "ready")
    assert query_job(job_id, local_slurm.env()).state == "RUNNING"
    subprocess.run(["scancel", "--signal=USR2", "--batch", job_id], check=True, env=client_env(local_slurm))
    final = wait_job(local_slurm, job_id, timeout=15)
    assert (final.state, final.exit_code) == ("COMPLETED", 0)
    assert "got USR2" in out.read_text()


def test_failing_job_ends_failed_with_its_exit_code(local_slurm, tmp_path):
    job_id = sbatch(local_slurm, tmp_path, "echo failing\nexit 3\n", "-J", "fail")
    final = wait_job(local_slurm, job_id)
    assert (final.state, final.exit_code, final.signal, final.source) == ("FAILED", 3, 0, "scontrol")
    assert final.end_time >= final.start_time
    # After MinJobAge the controller forgets the job and query_job falls back to jobcomp/filetxt. Waiting
    # >= 60 s is too slow for a test, so ask for an id the live controller does not know and point at a
    # copy of the live jobcomp file whose record of this job carries that id.
    gone = str(int(job_id) + 100_000)
    text = local_slurm.paths.jobcomp.read_text()
    assert f"JobId={job_id} " in text
    copy = tmp_path / "jobcomp.txt"
    copy.write_text(re.sub(rf"^JobId={job_id} ", f"JobId={gone} ", text, flags=re.M))
    record = query_job(gone, local_slurm.env(), jobcomp_path=copy)
    assert (record.source, record.state, record.exit_code, record.name) == ("jobcomp", "FAILED", 3, "fail")
    assert (record.start_time, record.end_time) == (final.start_time, final.end_time)
    with pytest.raises(LaunchError, match="unknown to the controller"):
        query_job(str(int(job_id) + 200_000), local_slurm.env())


def test_second_cluster_with_gpus_and_down_leaves_nothing(local_slurm, tmp_path):
    # a state dir too long for Unix socket paths under spool/: slurm.conf names a short link instead
    gen = local_slurm_cluster(tmp_path / ("long-" * 16), nodes=1, gpus_per_node=2)
    cluster = next(gen)
    try:
        assert cluster.paths.root != local_slurm.paths.root
        assert cluster.paths.short_root.resolve() == cluster.paths.root
        job_id = sbatch(cluster, tmp_path, 'echo "cvd=$CUDA_VISIBLE_DEVICES"\n', "--gpus-per-node=2")
        assert wait_job(cluster, job_id).state == "COMPLETED"
        assert "cvd=0,1" in (tmp_path / f"slurm-{job_id}.out").read_text()
        sleeper = sbatch(cluster, tmp_path, "echo ready\nsleep 300\n")
        wait_output(tmp_path / f"slurm-{sleeper}.out", "ready")
        assert processes_referring_to(cluster.paths.root)  # the check below can see what it looks for
    finally:
        next(gen, None)  # runs cluster.down()
    # down() returns once it has stopped what it stops; wait for the event (every process gone), not a fixed time
    left = poll_until(lambda: processes_referring_to(cluster.paths.root), lambda procs: not procs, timeout=30.0)
    kill_all(left)  # not left running after a failure (a `sleep 300` and its slurmstepd, which ignores SIGTERM)
    assert left == [], "cluster.down() left these processes of the cluster and its jobs alive 30 s later"
    assert not cluster.paths.short_root.is_symlink()
    assert not cluster.status().running
    assert local_slurm.status().nodes == {"node1": "IDLE", "node2": "IDLE"}  # the other cluster is untouched
