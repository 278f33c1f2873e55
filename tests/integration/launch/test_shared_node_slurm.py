"""Two models on shares of one emulated p5e node (issue 42), on a real local Slurm with 8 fake GPUs: the batch
scripts clustertrain renders for them (no --exclusive; --gpus-per-node=4, --cpus-per-gpu=24, --mem) are accepted,
both jobs run on the one node at the same time, each rank's world is its job's 4 GPUs, the two jobs' GPU sets are
disjoint and their rendezvous ports differ; the watchdog's one-task step starts inside such a job."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from clustertrain.core.ranks import shared_node_port
from clustertrain.launch.sbatch import build_request, render_script, watchdog_command
from clustertrain.launch.slurm_cluster import NodeGroup
from clustertrain.project import validate_project
from tests.support.slurm import client_env, local_slurm_cluster, poll_until, wait_job

pytestmark = pytest.mark.slow

#: one node as ParallelCluster declares a p5e.48xlarge: 192 CPUs, RealMemory 95 % of 2 TiB, Gres=gpu:h100:8
P5E_NODE = NodeGroup("gpu", "node", 1, 192, int(2048 * 1024 * 0.95), 8, "h100")


@pytest.fixture(scope="module")
def p5e_node(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("slurm-shared"), groups=[P5E_NODE])


def shared_project(root: Path):
    model = {"model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64},
             "training": {"max_steps": 10, "micro_batch": 8, "global_batch": 32}, "plan": {"gpus": 4}}
    return validate_project({
        "name": "sh", "storage": {"root": str(root)},
        "cluster": {"backend": "slurm", "nodes": 1, "gpus_per_node": 8, "instance_type": "p5e.48xlarge",
                    "partition": "gpu", "time_limit": "10:00"},
        "models": [{"name": "a", **model}, {"name": "b", **model}],
    })


def rank_payload(shared: Path, ranks: int) -> tuple[str, ...]:
    """Each rank records its view, then waits until every rank of both jobs has started (both jobs on the node)."""
    d = shlex.quote(str(shared))
    payload = shared.parent / "rank.sh"
    payload.write_text(f"""
out={d}/"$SLURM_JOB_ID-$SLURM_PROCID"
env | grep -E '^(SLURM_NTASKS|SLURM_PROCID|CUDA_VISIBLE_DEVICES|MASTER_PORT|SLURM_JOB_GPUS|SLURM_JOB_ID|SLURMD_NODENAME)=' \\
    | sort > "$out.tmp" && mv "$out.tmp" "$out.env"
touch {d}/"started-$SLURM_JOB_ID-$SLURM_PROCID"
for _ in $(seq 300); do [ "$(ls {d} | grep -c '^started-')" -ge {ranks} ] && exit 0; sleep 0.1; done
exit 1
""")
    return ("bash", str(payload))


def submit(cluster, script: str, where: Path) -> str:
    path = where / f"job-{len(list(where.glob('job-*.sh')))}.sh"
    path.write_text(script)
    proc = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, env=client_env(cluster),
                          timeout=30)
    assert proc.returncode == 0, f"sbatch refused the script: {proc.stderr}"
    return proc.stdout.strip().split(";")[0]


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_two_shares_run_side_by_side_with_disjoint_gpus_and_ports(p5e_node, tmp_path):
    project = shared_project(tmp_path / "fsx")
    shared = tmp_path / "seen"
    shared.mkdir()
    jobs = {}
    for name in ("a", "b"):
        req = build_request(project, project.model(name), tmp_path / "fsx" / "sh" / name, python="python3")
        req = replace(req, rank_command=rank_payload(shared, 8), watchdog=False)
        req.log_dir.mkdir(parents=True, exist_ok=True)
        req.run_dir.mkdir(parents=True, exist_ok=True)
        script = render_script(req)
        assert "#SBATCH --exclusive" not in script and "#SBATCH --cpus-per-gpu=24" in script
        jobs[name] = submit(p5e_node, script, tmp_path)
    states = {name: wait_job(p5e_node, job, timeout=60) for name, job in jobs.items()}
    assert all(s.state == "COMPLETED" for s in states.values()), states
    seen = {name: [read_env(shared / f"{job}-{rank}.env") for rank in range(4)] for name, job in jobs.items()}
    gpu_sets = {}
    for name, ranks in seen.items():
        assert {r["SLURM_NTASKS"] for r in ranks} == {"4"}  # the trainer's world: the share's 4 GPUs
        assert sorted(r["SLURM_PROCID"] for r in ranks) == ["0", "1", "2", "3"]
        assert {r["SLURMD_NODENAME"] for r in ranks} == {"node1"}
        (visible,) = {r["CUDA_VISIBLE_DEVICES"] for r in ranks}
        (job_gpus,) = {r["SLURM_JOB_GPUS"] for r in ranks}
        gpu_sets[name] = set(job_gpus.split(","))
        assert len(gpu_sets[name]) == 4 and len(visible.split(",")) == 4
        (port,) = {r["MASTER_PORT"] for r in ranks}
        assert int(port) == shared_node_port(jobs[name], int(job_gpus.split(",")[0]))
    assert not gpu_sets["a"] & gpu_sets["b"]
    assert seen["a"][0]["MASTER_PORT"] != seen["b"][0]["MASTER_PORT"]


def test_the_watchdog_step_starts_inside_a_shared_job(p5e_node, tmp_path):
    """The watchdog's srun (--overlap, one task, --cpus-per-task=1) inside a job whose step environment carries the
    job's --cpus-per-gpu (SLURM_CPUS_PER_GPU): Slurm must accept the pair."""
    project = shared_project(tmp_path / "fsx")
    req = build_request(project, project.model("a"), tmp_path / "fsx" / "sh" / "a", python="python3")
    wd_srun, _ = watchdog_command(req)
    directives = [line for line in render_script(req).splitlines()
                  if line.startswith("#SBATCH ") and not line.startswith(("#SBATCH --output", "#SBATCH --error",
                                                                          "#SBATCH --signal", "#SBATCH --requeue"))]
    out = tmp_path / "wd.out"
    body = "\n".join(["#!/bin/bash", *directives, f"#SBATCH --output={out}",
                      f'{shlex.join(wd_srun)} --nodelist="$SLURMD_NODENAME" bash -c \'echo "WD-OK $SLURM_NTASKS"\''])
    job = submit(p5e_node, body + "\n", tmp_path)
    state = wait_job(p5e_node, job, timeout=60)
    text = poll_until(lambda: out.read_text() if out.exists() else "", lambda t: "WD-OK" in t or state.state != "COMPLETED")
    assert state.state == "COMPLETED", (state, text)
    assert "WD-OK 1" in text, text
