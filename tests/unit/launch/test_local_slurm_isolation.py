"""Which local Slurm cluster a command means, and what keeps one cluster's `up`/`down` off another's: the owner
record, ClusterName, and how `down` finds (and stops) the cluster's processes. No Slurm daemon starts here
(tests/integration/launch/test_local_slurm_isolation.py runs two real clusters)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clustertrain.cli.local_slurm import app
from clustertrain.core.errors import LaunchError
from clustertrain.launch.slurm_cluster import LocalSlurmCluster
from clustertrain.launch.slurm_cluster_paths import state_dir_for
from clustertrain.launch.slurm_cluster_procs import cluster_processes, stop_processes
from tests.support.files import snapshot


def foreign_record(root: Path) -> Path:
    """A cluster.json of a cluster started on another host (a home directory shared between machines)."""
    root.mkdir(parents=True)
    owner = {"pid": 4242, "uid": 1001, "user": "alice", "host": "other-host", "started": "2026-11-27T09:00:00"}
    (root / "cluster.json").write_text(json.dumps({"version": 1, "owner": owner, "spec": {"nodes": 2},
                                                   "pids": {"slurmctld": 1, "munged": 1}}))
    return root


def test_which_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("CLUSTERTRAIN_LOCAL_SLURM_DIR", raising=False)
    base = tmp_path / ".clustertrain" / "local-slurm"
    assert state_dir_for() == base / "default"
    assert state_dir_for("ci-1") == base / "ci-1"
    assert state_dir_for(None, tmp_path / "x") == tmp_path / "x"
    monkeypatch.setenv("CLUSTERTRAIN_LOCAL_SLURM_DIR", str(tmp_path / "mine"))
    assert state_dir_for() == tmp_path / "mine"  # one script's own cluster, as before
    assert state_dir_for("ci-1") == base / "ci-1"  # an explicit name wins
    for bad in ("", "../x", "A", "a b", "a/b", "x" * 41):
        with pytest.raises(LaunchError, match="must be 1-40 lowercase letters") as err:
            state_dir_for(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(LaunchError, match="both say which cluster; give one"):
        state_dir_for("a", tmp_path)


def test_each_state_dir_is_its_own_slurm_cluster_name(tmp_path):
    one, two = LocalSlurmCluster(tmp_path / "one", nodes=1), LocalSlurmCluster(tmp_path / "two", nodes=1)
    assert one.paths.cluster_name != two.paths.cluster_name
    assert one.paths.cluster_name == LocalSlurmCluster(tmp_path / "one", nodes=3).paths.cluster_name
    for cluster in (one, two):
        assert f"ClusterName={cluster.paths.cluster_name}" in cluster.render_conf(1, [2]).splitlines()


@pytest.mark.parametrize("action", ["up", "down", "jobs"])
def test_a_cluster_of_another_host_is_refused_in_one_line_and_left_alone(tmp_path, action):
    root = foreign_record(tmp_path / "shared")
    before = snapshot(tmp_path)
    with pytest.raises(LaunchError) as err:
        getattr(LocalSlurmCluster(root, nodes=2), action)()
    message = str(err.value)
    assert "\n" not in message and "was started on host other-host" in message
    assert "started by alice (uid 1001, pid 4242)" in message and "down --state-dir" in message
    assert snapshot(tmp_path) == before


def test_cli_says_which_cluster_and_refuses_both(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("CLUSTERTRAIN_LOCAL_SLURM_DIR", raising=False)
    runner = CliRunner()
    shown = runner.invoke(app, ["env", "--name", "ci-1"])
    assert shown.exit_code == 0, shown.output
    assert f"export SLURM_CONF={tmp_path}/.clustertrain/local-slurm/ci-1/slurm.conf" in shown.stdout.splitlines()
    both = runner.invoke(app, ["down", "--name", "ci-1", "--state-dir", str(tmp_path)])
    assert both.exit_code == 2 and both.output.strip().count("\n") == 0 and "give one" in both.output
    bad = runner.invoke(app, ["up", "--name", "Bad Name"])
    assert bad.exit_code == 2 and "--name 'Bad Name'" in bad.output and not (tmp_path / ".clustertrain").exists()
    nothing = runner.invoke(app, ["down", "--name", "ci-1"])  # nothing runs: nothing to ask about
    assert nothing.exit_code == 0 and nothing.output == "stopped\n"


def test_cli_status_names_the_owner(tmp_path):
    root = foreign_record(tmp_path / "shared")
    result = CliRunner().invoke(app, ["status", "--state-dir", str(root)])
    assert result.exit_code == 1
    assert "owner:     started by alice (uid 1001, pid 4242) on other-host at 2026-11-27T09:00:00" in result.output


def test_cluster_processes_are_its_jobs_and_daemons_only(tmp_path):
    """A job of this cluster is found by its environment (also outside its step's tree); a job of another cluster
    and a shell that only exported this cluster's SLURM_CONF are not."""
    mine = LocalSlurmCluster(tmp_path / "mine", nodes=1).paths
    other = LocalSlurmCluster(tmp_path / "other", nodes=1).paths
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    stubborn = ["bash", "-c", "trap '' TERM; exec sleep 60"]
    envs = {
        "job by conf": {"SLURM_JOB_ID": "7", "SLURM_CONF": str(mine.conf)},
        "job by cluster name": {"SLURM_JOB_ID": "8", "SLURM_CLUSTER_NAME": mine.cluster_name},
        "other cluster's job": {"SLURM_JOB_ID": "7", "SLURM_CONF": str(other.conf),
                                "SLURM_CLUSTER_NAME": other.cluster_name},
        "user's shell": {"SLURM_CONF": str(mine.conf)},
    }
    procs = {what: subprocess.Popen(stubborn, env={**base, **extra}, start_new_session=True)
             for what, extra in envs.items()}
    try:
        time.sleep(0.3)  # exec'd: the environment psutil reads is the one given
        found = {p.pid for p in cluster_processes(mine)}
        assert found & {p.pid for p in procs.values()} == {procs["job by conf"].pid, procs["job by cluster name"].pid}
        assert os.getpid() not in found and os.getppid() not in found
        left = stop_processes([p for p in cluster_processes(mine)], grace=0.5)  # they ignore SIGTERM: SIGKILL
        assert left == []
        assert procs["job by conf"].wait(5) == -9 and procs["job by cluster name"].wait(5) == -9
        assert procs["other cluster's job"].poll() is None and procs["user's shell"].poll() is None
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_a_slurmstepd_is_found_by_its_working_directory_only(tmp_path):
    """slurmstepd shows no environment and no state dir on its command line; it runs in slurmd's directory, the
    state dir -- exactly that one: a cluster whose state dir lies inside this one's is not this one's."""
    outer = LocalSlurmCluster(tmp_path / "outer", nodes=1).paths
    inner = LocalSlurmCluster(tmp_path / "outer" / "default", nodes=1).paths
    other = LocalSlurmCluster(tmp_path / "other", nodes=1).paths
    for d in (outer.root, inner.root, other.root):
        d.mkdir(parents=True, exist_ok=True)
    stepd = tmp_path / "bin" / "slurmstepd"  # a program called slurmstepd, as the real one is
    stepd.parent.mkdir()
    shutil.copy(shutil.which("sleep"), stepd)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    procs = {d: subprocess.Popen([str(stepd), "60"], cwd=d, env=clean) for d in (outer.root, inner.root, other.root)}
    try:
        time.sleep(0.3)
        for paths in (outer, inner, other):
            assert [p.pid for p in cluster_processes(paths)] == [procs[paths.root].pid]
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_cluster_processes_spare_the_caller(tmp_path):
    """`down` run from inside one of the cluster's jobs does not kill itself or the shell it runs in."""
    paths = LocalSlurmCluster(tmp_path / "c", nodes=1).paths
    env = {**os.environ, "SLURM_JOB_ID": "3", "SLURM_CONF": str(paths.conf)}
    code = ("from pathlib import Path; from clustertrain.launch.slurm_cluster_procs import cluster_processes;"
            "from clustertrain.launch.slurm_cluster_paths import LocalSlurmPaths;"
            f"print(len(cluster_processes(LocalSlurmPaths(Path({str(paths.root)!r})))))")
    out = subprocess.run(["bash", "-c", f"{sys.executable} -c {json.dumps(code)}"], env=env, capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"  # itself (python) and its shell (bash) carry the job's environment
