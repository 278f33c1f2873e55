"""The training twin of models that share a node (``examples/shared-twin.yaml``, issue 42): two models of a 1-GPU share
each (``models[].plan.gpus: 1``) through ``clustertrain submit`` on a local Slurm cluster of ONE emulated node with 2
fake GPUs and memory-based scheduling (``SelectTypeParameters=CR_CPU_Memory``, as ParallelCluster's
EnableMemoryBasedScheduling). Both jobs run at the same time on that node, each with its own GPU (Slurm's gres:
disjoint ``CUDA_VISIBLE_DEVICES`` / GRES indices), the host memory and CPUs their batch scripts ask for, and both
train to completion. The node declares g5.12xlarge's shape (48 vCPUs, RealMemory = 95 % of 192 GiB) so that the
shares' ``--mem``/``--cpus-per-task`` (clustertrain.plan.packing.job_share) are what Slurm schedules; the ranks are
CPU workers (gloo), as in the other twins."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertrain.launch.slurm import SlurmLauncher
from clustertrain.launch.slurmcli import run_slurm
from clustertrain.plan.packing import job_share
from clustertrain.core.run_paths import RunPaths
from clustertrain.resolve import load_project
from tests.support.slurm import client_env, local_slurm_cluster, sbatch, wait_job, wait_output
from tests.support.training import metrics

pytestmark = pytest.mark.slow
TWIN = Path(__file__).resolve().parents[3] / "examples" / "shared-twin.yaml"
G5_12XL_MB = int(192 * 1024 * 0.95)  # RealMemory ParallelCluster declares for a g5.12xlarge


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    # as the example's comment starts it: clustertrain local-slurm up --nodes 1 --gpus-per-node 2 --cpus-per-node 48
    # --memory-mb 186777 --memory-scheduling
    yield from local_slurm_cluster(tmp_path_factory.mktemp("shared"), nodes=1, cpus_per_node=48, gpus_per_node=2,
                                   gpu_type="a10g", memory_mb=G5_12XL_MB, memory_scheduling=True)


def _job(cluster, job_id: str) -> str:
    """``scontrol -d show job`` (one line; -d adds the per-node GRES indices), '' once Slurm forgot the job."""
    proc = run_slurm(["scontrol", "-d", "-o", "show", "job", job_id], env=cluster.env(), check=False, timeout=30)
    return proc.stdout if proc.returncode == 0 else ""


def _field(line: str, name: str) -> str:
    m = re.search(rf"(?:^|\s){name}=(\S*)", line)
    return m.group(1) if m else ""


def test_two_one_gpu_shares_train_side_by_side_on_one_node(one_node, tmp_path):
    conf = one_node.paths.conf.read_text()
    assert "SelectTypeParameters=CR_CPU_Memory" in conf and "CR_Core" not in conf
    sets = [f"storage.root={json.dumps(str(tmp_path / 'fsx'))}"]
    sub = subprocess.run([sys.executable, "-m", "clustertrain", "submit", str(TWIN), "--set", sets[0]],
                         capture_output=True, text=True, env=client_env(one_node), timeout=120)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    project = load_project(TWIN, sets)
    ids = dict(re.findall(r"^submitted (\S+): job (\d+) ", sub.stdout, re.M))
    assert set(ids) == {"model-a", "model-b"}, sub.stdout

    # watch both jobs: the same node, both RUNNING at one moment, then both gone
    seen: dict[str, str] = {}
    both_running = False
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        lines = {m: _job(one_node, j) for m, j in ids.items()}
        states = {m: _field(line, "JobState") for m, line in lines.items()}
        both_running |= all(s == "RUNNING" for s in states.values())
        for m, line in lines.items():
            if _field(line, "JobState") == "RUNNING":
                seen[m] = line
        if all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "") for s in states.values()):
            break
        time.sleep(0.5)
    assert both_running, f"the two shares never ran at the same time: {states}"
    assert set(seen) == {"model-a", "model-b"}
    slurm = SlurmLauncher(env=one_node.env())
    logs = {m: "\n".join(slurm.logs(j)) for m, j in ids.items()}
    for m, j in ids.items():
        final = slurm.status(j)
        assert (final.state, final.exit_code) == ("COMPLETED", 0), (m, final, logs[m][-3000:])
        assert "training complete at step 40" in logs[m], logs[m][-3000:]

    # placed together: one node, the planned share of it each (1 GPU, memory and CPUs in proportion), no --exclusive
    share = job_share(project, project.model("model-a"))
    assert share is not None and share.mem_mb == G5_12XL_MB // 2 and share.cpus_per_gpu == 24
    gres_idx = {}
    for m, line in seen.items():
        assert _field(line, "NodeList") == "node1", line
        assert _field(line, "OverSubscribe") != "NO", line                     # not --exclusive
        tres = _field(line, "AllocTRES") or _field(line, "TRES")
        assert f"mem={share.mem_mb}M" in tres, line                            # --mem honoured
        assert _field(line, "JOB_GRES") == "gpu:a10g:1", line                   # one GPU of the node
        assert "cpu=24" in tres, line
        gres_idx[m] = re.search(r"GRES=\S*\(IDX:([0-9,-]+)\)", line).group(1)
    assert gres_idx["model-a"] != gres_idx["model-b"], gres_idx                # each its own GPU of the node

    # each job's ranks saw only their GPU: the node sampler, started by the job's first rank, names the job's
    # CUDA_VISIBLE_DEVICES (Slurm's gres sets it from the job's GPU; without cgroup ConstrainDevices the index is the
    # node's, so it equals the GRES index); and the two rendezvous ports differ (the port follows the job's first GPU)
    cvd, ports = {}, {}
    for m, j in ids.items():
        text = (project.storage.root / "shared-twin" / m / "monitor" / "node1.log").read_text()
        found = re.findall(rf"job {j} \(node GPUs (\S+); CUDA_VISIBLE_DEVICES=([^)\s]+)\)", text)
        assert found, text
        cvd[m] = {g for _, v in found for g in v.split(",")}
        assert cvd[m] == {gres_idx[m]}, (found, gres_idx)
        ports[m] = re.search(r"master 127\.0\.0\.1:(\d+)", logs[m]).group(1)
    assert not cvd["model-a"] & cvd["model-b"], cvd                            # disjoint GPU sets on one node
    assert ports["model-a"] != ports["model-b"], ports

    for m in ids:
        rows = metrics(project.storage.root / "shared-twin" / m)
        assert rows[-1]["step"] == 40 and rows[-1]["loss"] < rows[0]["loss"], (rows[0], rows[-1])
        assert RunPaths(project.storage.root / "shared-twin" / m).completed.is_file()


def _devices_cgroup_writable() -> bool:
    probe = Path("/sys/fs/cgroup/devices") / f"ct-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def test_cgroup_device_constraint_confines_each_share_to_its_gpu(tmp_path):
    """With ConstrainDevices (as on ParallelCluster) a job can open only its own GPU's device file: the other one is
    EPERM from the devices cgroup; its own is ENXIO (a fake device: no driver behind it). CUDA_VISIBLE_DEVICES counts
    from 0 in each job; SLURM_JOB_GPUS keeps the node's indices (what the rehearsal's gpus_unshared check compares)."""
    if not _devices_cgroup_writable():
        pytest.skip("no writable cgroup v1 devices hierarchy at /sys/fs/cgroup/devices (ConstrainDevices needs one)")
    gen = local_slurm_cluster(tmp_path, nodes=1, cpus_per_node=2, gpus_per_node=2, memory_mb=4096,
                              memory_scheduling=True, constrain_devices=True)
    cluster = next(gen)
    try:
        assert "TaskPlugin=task/cgroup" in cluster.paths.conf.read_text()
        assert "ConstrainDevices=yes" in cluster.paths.cgroup_conf.read_text()
        dev = cluster.paths.dev_dir
        body = (f"echo CVD=$CUDA_VISIBLE_DEVICES GPUS=$SLURM_JOB_GPUS\n"
                f"for d in 0 1; do head -c0 {dev}/nvidia$d 2>&1 | sed \"s/.*: /open$d: /\"; done\nsleep 2\n")
        ids = [sbatch(cluster, tmp_path, body, "--gres=gpu:1", "--mem=1000M") for _ in range(2)]
        outs = [wait_output(tmp_path / f"slurm-{j}.out", "open1: ", timeout=30) for j in ids]
        for j in ids:
            assert wait_job(cluster, j).state == "COMPLETED"
        gpus = []
        for out in outs:
            cvd, mine = re.search(r"CVD=(\S*) GPUS=(\S*)", out).groups()
            assert cvd == "0", out                                 # renumbered inside the job
            other = 1 - int(mine)
            assert f"open{mine}: No such device or address" in out, out   # its own: allowed (no driver)
            assert f"open{other}: Operation not permitted" in out, out   # the other job's: denied by the cgroup
            gpus.append(mine)
        assert sorted(gpus) == ["0", "1"]
    finally:
        next(gen, None)
    # down() removed the slurm_node1 cgroups its jobs left (only this test makes them; it runs under the heavy lock)
    assert not list(Path("/sys/fs/cgroup").glob("*/slurm_node1"))
