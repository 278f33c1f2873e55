"""The issue's acceptance for `clustertrain status`: ONE project (backend slurm) with three models, each in another
state, all real: m1 trained locally to completion, m2 training locally in the background, m3 submitted to the local
Slurm cluster (queued behind a job that holds both nodes, then running, then cancelled).

How one Slurm project gets local runs, honestly: `clustertrain run --set cluster.backend=local --set cluster.nodes=1
--model m1` trains m1 on this machine into the same run directory a submit would use (the project's storage root
and model name); `status` decides per run directory — one with job records (jobs.jsonl) is a Slurm run, one
without is a local run — so the plain `status PROJECT` (no --set) shows the three side by side.

To keep it short, what does not depend on another step overlaps: m1 trains while m3 is submitted and m2 starts
(once m1 has staged the project's dataset, so that no two of them tokenize it at once), and m2 saves and stops
while Slurm ends m3's cancelled job (KillWait). Each status is still asked only once what it checks has happened."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from clustertrain.launch.slurm_query import query_job
from tests.support.slurm import client_env, local_slurm_cluster, sbatch
from tests.support.training import clustertrain, metrics, wait_for

pytestmark = pytest.mark.slow
LOCAL = ["--set", "cluster.backend=local", "--set", "cluster.nodes=1"]
PROJECT = """name: st
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1, threads_per_worker: 1}}
storage: {{root: {root}}}
models:
{models}"""
MODEL = """  - name: {name}
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: {steps}, micro_batch: 4, global_batch: 8, lr: 3.0e-3, min_lr: 3.0e-4,
               checkpoint_every: {ckpt}, keep_last: 2, log_every: 1, seed: 7}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("stslurm"), nodes=2)


def cli(cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clustertrain", *args], capture_output=True, text=True,
                          env=client_env(cluster), timeout=timeout)


def rows(cluster, path) -> tuple[int, dict[str, dict]]:
    proc = cli(cluster, "status", str(path), "--json")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, {r["model"]: r for r in json.loads(proc.stdout)}


def test_status_of_a_completed_a_running_and_a_slurm_model(cluster, tmp_path):
    started = time.monotonic()
    root = tmp_path / "fsx"
    path = tmp_path / "st.yaml"
    path.write_text(PROJECT.format(root=json.dumps(str(root)), models="".join(
        MODEL.format(name=n, steps=s, ckpt=c) for n, s, c in (("m1", 10, 5), ("m2", 100000, 1000), ("m3", 100000, 1000)))))
    runs = {m: root / "st" / m for m in ("m1", "m2", "m3")}
    env = client_env(cluster)
    first = clustertrain("run", str(path), "--model", "m1", *LOCAL, env=env)  # m1 trains to completion meanwhile
    background = None
    jobs = []
    try:
        # the dataset is tokenized once below storage.root/datasets (clustertrain/data/staging.py); m1 does it first
        wait_for(lambda: any(root.glob("datasets/*/*.manifest.json")) or first.poll() is not None, 60)
        blocker = sbatch(cluster, tmp_path, "sleep 300\n", "--nodes=2", "--exclusive", "-J", "blocker")
        jobs.append(blocker)
        sub = cli(cluster, "submit", str(path), "--model", "m3")
        assert sub.returncode == 0, sub.stdout + sub.stderr
        job_id = sub.stdout.split("job ")[1].split()[0]
        jobs.append(job_id)
        background = clustertrain("run", str(path), "--model", "m2", *LOCAL, env=env)
        done, _ = first.communicate(timeout=120)
        assert first.returncode == 0, done[-4000:]
        wait_for(lambda: len(metrics(runs["m2"])) >= 3, 60)

        code, st = rows(cluster, path)
        assert code == 0 and list(st) == ["m1", "m2", "m3"]
        m1, m2, m3 = st["m1"], st["m2"], st["m3"]
        assert (m1["state"], m1["step"], m1["max_steps"], m1["backend"]) == ("completed", 10, 10, "local")
        assert m1["loss"] == metrics(runs["m1"])[-1]["loss"] and m1["tokens_per_s"] > 0 and m1["eta_s"] is None
        assert m1["checkpoint"] == str(runs["m1"] / "checkpoints" / "step_00000010") and m1["checkpoint_age_s"] < 120
        assert m1["gpu_hours"] > 0 and m1["cost_usd"] is None and m1["missing"] == []  # CPU ranks: no price
        assert (m2["state"], m2["max_steps"], m2["backend"]) == ("running", 100000, "local")
        assert m2["step"] >= 3 and m2["step_time_s"] > 0 and m2["eta_s"] > 0 and m2["tokens_per_s"] > 0
        assert m2["missing"] == [] and m2["gpu_hours"] > 0 and m2["job_id"].startswith("local-")
        assert (m3["state"], m3["job_id"], m3["job_state"], m3["backend"]) == ("queued", job_id, "PENDING", "slurm")
        assert m3["step"] is None and m3["nodes"] == []

        table = cli(cluster, "status", str(path))
        assert table.returncode == 0, table.stderr
        print(table.stdout)
        lines = table.stdout.splitlines()
        for name, state in (("m1", "completed"), ("m2", "running"), ("m3", "queued")):
            assert any(name in ln and state in ln for ln in lines), table.stdout
        assert any("m1" in ln and "10/10" in ln and "step_00000010" in ln for ln in lines), table.stdout
        assert any("m3" in ln and job_id in ln for ln in lines), table.stdout

        subprocess.run(["scancel", blocker], env=env, check=True)  # m3 gets both nodes
        wait_for(lambda: query_job(job_id, cluster.env()).state == "RUNNING", 60, interval=0.2)
        code, st = rows(cluster, path)
        assert (st["m3"]["state"], st["m3"]["nodes"], st["m2"]["state"]) == ("running", ["node1", "node2"], "running")

        subprocess.run(["scancel", job_id], env=env, check=True)  # cancelled, and counted as failed: exit 1
        background.send_signal(signal.SIGTERM)  # m2 saves and stops while Slurm ends m3's job
        wait_for(lambda: query_job(job_id, cluster.env()).finished, 60, interval=0.2)
        code, st = rows(cluster, path)
        assert code == 1 and st["m3"]["state"] == "cancelled" and st["m3"]["job_state"] == "CANCELLED", st["m3"]
        assert "CANCELLED" in st["m3"]["message"]

        background.communicate(timeout=60)
        _, st = rows(cluster, path)
        assert st["m2"]["state"] == "stopped" and st["m2"]["checkpoint"] and st["m1"]["state"] == "completed"
    finally:
        for proc in (first, background):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, capture_output=True)

    missing = cli(cluster, "status", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and "missing.yaml" in missing.stderr
    print(f"acceptance scenario took {time.monotonic() - started:.1f} s")
