"""The 30B's 3-D twin (``examples/p5-30b-twin.yaml``): through ``clustertrain submit`` on a local Slurm cluster of
4 emulated nodes x 2 CPUs, as the file describes its job (4 nodes x 2 ranks, fsdp 2 x tp 2 +sp x pp 2, 1F1B),
stopped by the preemption signal (``scancel --signal=USR2 --batch``), requeued and resumed; and, without Slurm,
that the twin keeps the kinds and ratios of the 30B it mirrors (``examples/p5-30b.yaml``). The cluster is this
module's own (the session's ``local_slurm`` has 2 nodes); only the storage root and the steps are overridden."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertrain.core.job_records import read_records
from clustertrain.launch.slurm import SlurmLauncher
from clustertrain.launch.slurm_query import query_job
from clustertrain.resolve import load_project
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.checkpoint_format import read_meta
from clustertrain.core.parallel_layout import resolve_layout, stage_layers
from tests.support.slurm import client_env, local_slurm_cluster
from tests.support.training import metrics, wait_for

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TWIN, BIG = EXAMPLES / "p5-30b-twin.yaml", EXAMPLES / "p5-30b.yaml"


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("twin3d"), nodes=4, cpus_per_node=2)


def release_requeued(cluster, job_id: str, timeout: float = 60) -> None:
    """Start a requeued job now instead of at its BeginTime (~20 s away); docs/local-slurm.md, "Knowing the emulation's limits"."""
    wait_for(lambda: (lambda s: s.state == "PENDING" and s.reason == "BeginTime")(query_job(job_id, cluster.env())),
             timeout, interval=0.1)
    time.sleep(1.5)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True, env=client_env(cluster))


@pytest.mark.slow
def test_twin_trains_through_submit_on_four_nodes_is_preempted_requeued_and_resumes(cluster4, tmp_path):
    sets = [f"storage.root={json.dumps(str(tmp_path / 'fsx'))}", "models.0.training.max_steps=12",
            "models.0.training.checkpoint_every=4", "models.0.training.keep_last=4", "models.0.training.log_every=1"]
    argv = [sys.executable, "-m", "clustertrain", "submit", str(TWIN)]
    for item in sets:
        argv += ["--set", item]
    sub = subprocess.run(argv, capture_output=True, text=True, env=client_env(cluster4), timeout=120)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert sub.stdout.startswith("submitted p5-30b-twin: job "), sub.stdout
    run = load_project(TWIN, sets).storage.root / "p5-30b-twin" / "p5-30b-twin"
    slurm = SlurmLauncher(env=cluster4.env())
    job_id = slurm.attach(RunPaths(run))
    [record] = read_records(RunPaths(run))
    script = Path(record.script).read_text()
    assert "#SBATCH --nodes=4" in script and "#SBATCH --ntasks-per-node=2" in script  # as the file says

    # past the periodic checkpoint of step 4, then the preemption signal to the batch shell
    latest = run / "checkpoints" / "latest"
    wait_for(lambda: latest.exists() and latest.read_text().strip() == "step_00000004"
             and any(r["step"] >= 5 for r in metrics(run)), 150, interval=0.2)
    subprocess.run(["scancel", "--signal=USR2", "--batch", job_id], check=True, env=client_env(cluster4))
    release_requeued(cluster4, job_id)
    final = slurm.wait(job_id, timeout=150)
    log = "\n".join(slurm.logs(job_id))
    assert (final.state, final.exit_code, final.extra["restarts"], final.extra["nodes"]) == \
        ("COMPLETED", 0, 1, ["node1", "node2", "node3", "node4"]), (final, log[-3000:])
    assert "8 rank(s) (fsdp 2 x tp 2 +sp x pp 2 1f1b, params fp32 / compute fp32 / reduce fp32), grad accumulation 4" in log
    assert f"requeueing job {job_id} for segment 2 of at most 4 (restart 1;" in log
    stopped_at = int(log.split("stopped by SIGUSR2 after step ")[1].split(";")[0])
    assert stopped_at >= 5  # a stop checkpoint newer than the periodic one: the resume must take it
    assert f"resumed from {run / 'checkpoints' / f'step_{stopped_at:08d}'} (step {stopped_at})" in log, log[-3000:]
    assert f"steps {stopped_at}->12" in log and "training complete at step 12" in log

    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0, (rows[0], rows[-1])
    for step in (stopped_at, 12):
        layout = read_meta(run / "checkpoints" / f"step_{step:08d}").layout
        assert (layout["world"], layout["pp"], layout["dp"], layout["tp"], layout["zero_stage"], layout["sequence_parallel"],
                layout["schedule"], layout["reshard_after_forward"]) == (8, 2, 2, 2, 3, True, "1f1b", False), layout
    # block distribution: a tensor-parallel pair per node, pipeline stage 0 on nodes 1-2 and stage 1 on nodes 3-4
    nodes = [json.loads(RunPaths(run).rank_heartbeat(r).read_bytes())["node"] for r in range(8)]
    assert nodes == ["node1", "node1", "node2", "node2", "node3", "node3", "node4", "node4"], nodes
    assert (run / "COMPLETED").is_file()


def test_twin_keeps_the_30b_kinds_and_ratios():
    projects = [load_project(path) for path in (TWIN, BIG)]
    twin, big = (p.models[0] for p in projects)
    for field in ("mlp", "norm", "tie_embeddings"):
        assert getattr(twin.model, field) == getattr(big.model, field), field
    assert (twin.model.mlp, twin.model.norm, twin.model.tie_embeddings) == ("swiglu", "rmsnorm", False)
    # width ratios: the MLP and the context to hidden (the twin divides all three by 64)
    assert abs(twin.model.ffn_dim / twin.model.hidden - big.model.ffn_dim / big.model.hidden) < 0.05
    assert abs(twin.model.seq_len / twin.model.hidden - big.model.seq_len / big.model.hidden) < 0.05
    # layout kinds: FSDP2 x tensor (+sp) x pipeline, the same schedule, all three degrees > 1
    for field in ("zero_stage", "sequence_parallel", "schedule", "virtual_stages", "reshard_after_forward", "recompute"):
        assert getattr(twin.parallelism, field) == getattr(big.parallelism, field), field
    for project in projects:
        entry, cluster = project.models[0], project.cluster
        layout = resolve_layout(entry.parallelism, cluster.world_size, on_gpu=False, ranks_per_node=cluster.ranks_per_node)
        assert layout.dp > 1 and layout.tp > 1 and layout.pp > 1, (project.name, layout)
        assert cluster.ranks_per_node % layout.tp == 0, project.name  # a tensor-parallel group stays on one node
        # the layers split evenly over the stages; more micro-batches per step than pipeline stages (1F1B fills it)
        assert len({len(r) for r in stage_layers(entry.model.layers, layout.stages)}) == 1, project.name
        assert entry.training.global_batch // (entry.training.micro_batch * layout.dp) >= layout.pp, project.name
