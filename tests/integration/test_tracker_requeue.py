"""A Slurm requeue on the local cluster continues one tracker run (issue 41, acceptance "a Slurm requeue on the local
cluster continues one tracker run; steps are not duplicated").

The project sends its model to MLflow (a file store on the file system the local Slurm's jobs see) and to W&B in
offline mode (under the model's run directory, the default ``dir``). The job, two ranks on two emulated nodes, is
requeued once its first periodic checkpoint is committed and both trackers took rows, in the two ways a Slurm job is
requeued:

- ``preempt``: the stop signal (``scancel --signal=USR2 --batch``, what ``--signal=B:USR2@grace`` sends before a time
  limit or a preemption): the batch script forwards it to the ranks, which save and stop, and requeues the job itself
  (clustertrain/launch/templates/sbatch.sh.j2);
- ``scontrol``: Slurm's own requeue (``scontrol requeue``, as an administrator or a node failure with ``--requeue``):
  slurmd sends SIGTERM to every process of the job — the batch shell, the ranks, and whatever the ranks started (the
  linuxproc/cgroup process tracking of slurm.conf ``ProctrackType``) — then SIGKILL after ``KillWait``; the ranks
  finish the step, save and stop (clustertrain/train/signals.py); Slurm starts the job again under the same id with
  ``SLURM_RESTART_COUNT=1`` (Slurm ``scontrol`` man page, "requeue").

The second start resumes from the checkpoint and trains to the end. Afterwards, read back with each tracker's own
client/format:

- MLflow (``MlflowClient.search_runs``): exactly one run in the experiment; for every row of ``metrics.jsonl`` and
  every number in it, the latest point at that step (latest timestamp: clustertrain/monitor/trackers.py, "Per step,
  the latest attempt's point") equals the row's value, and no step has two points (a graceful stop saves at the
  last logged step, so nothing is superseded); the ``attempt`` metric is 1 up to the stop and 2 after it, the run's
  ``clustertrain.attempt`` tag says 2 and both attempts' resolved configs are among its artifacts;
- ``RUN_DIR/trackers.json``: the MLflow and W&B run ids written by the first attempt are the ones of the end, and
  ``attempt`` is 2;
- W&B offline: two ``offline-run-*-<id>`` directories of the same run id (one per start, synced into one run by
  ``wandb sync``; ``scontrol``: also one whose file holds no record, and one more when the rank restarted the killed
  wandb-core), read with W&B's own protobuf records (tests/support/wandb_records.py): their rows together hold
  each step once, with ``metrics.jsonl``'s loss and the attempt that sent it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest

from clustertrain.core.run_events import read_events
from clustertrain.core.run_paths import RunPaths
from clustertrain.launch.config import LaunchConfig
from clustertrain.launch.slurm import SlurmLauncher, submit_project
from clustertrain.launch.slurm_query import query_job
from clustertrain.monitor.trackers import IDS_FILE, read_tracker_links
from clustertrain.resolve import load_project
from tests.support.slurm import client_env, local_slurm_cluster
from tests.support.training import metrics, wait_for
from tests.support.wandb_records import history, offline_runs, run_record

pytestmark = pytest.mark.slow

PROJECT = """
name: trq
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1, threads_per_worker: 1}}
storage: {{root: {root}}}
monitor:
  trackers:
    tensorboard: false
    mlflow: {{tracking_uri: {mlruns}, experiment: trq-requeue, tags: {{suite: requeue}}}}
    wandb: {{project: trq, mode: offline}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: {steps}, micro_batch: 4, global_batch: 8, lr: 3.0e-3, min_lr: 3.0e-4,
               checkpoint_every: {ckpt}, keep_last: 2, log_every: 1, seed: 7}}
"""
STEPS, CKPT = 24, 4
#: rank 0 sleeps this long in its data path each step (tests' fault injection, clustertrain/train/hooks.py), so that
#: the requeue lands mid-run on any machine
SLOW = "0:0.12"


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("slurm"), nodes=2)


def release_requeued(cluster, job_id: str, timeout: float = 60) -> None:
    """A requeued job waits for its BeginTime (~20 s with cred_expire=10): once it is pending on it, wait 1.5 s (a
    restart in the same second fails with "Job credential revoked") and start it now (as
    tests/integration/launch/test_slurm_backend.py does)."""
    wait_for(lambda: (lambda s: s.state == "PENDING" and s.reason == "BeginTime")(query_job(job_id, cluster.env())),
             timeout, interval=0.1)
    time.sleep(1.5)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True, env=client_env(cluster))


def tracker_ids(run: Path) -> dict:
    data = json.loads((run / IDS_FILE).read_text())
    return {name: entry["run_id"] for name, entry in data["trackers"].items()}


def latest_points(client, run_id: str, key: str) -> tuple[dict[int, float], int]:
    """Per step, the value of the latest point (highest timestamp) of ``key``; and how many points there were."""
    points = client.get_metric_history(run_id, key)
    best: dict[int, tuple[int, float]] = {}
    for p in points:
        if p.step not in best or p.timestamp >= best[p.step][0]:
            best[p.step] = (p.timestamp, p.value)
    return {step: value for step, (_, value) in best.items()}, len(points)


@pytest.mark.parametrize("how", ["preempt", "scontrol"])
def test_a_slurm_requeue_continues_the_same_mlflow_and_wandb_runs(local_slurm, tmp_path, monkeypatch, how):
    mlruns = tmp_path / "mlruns"
    path = tmp_path / "trq.yaml"
    path.write_text(PROJECT.format(root=json.dumps(str(tmp_path / "fsx")), mlruns=json.dumps(str(mlruns)),
                                   steps=STEPS, ckpt=CKPT))
    project = load_project(path)
    slurm = SlurmLauncher(env={**local_slurm.env(), "CLUSTERTRAIN_INJECT_SLOW_DATA": SLOW},
                          launch=LaunchConfig(exclusive=False))
    [sub] = submit_project(project, None, None, resume=True, launcher=slurm)
    run = sub.run_dir

    # attempt 1: the first periodic checkpoint is committed and both trackers took rows; then the job is requeued
    def first_attempt_ready() -> bool:
        if not (run / "checkpoints" / "latest").is_file() or not (run / IDS_FILE).is_file():
            return False
        entries = json.loads((run / IDS_FILE).read_text()).get("trackers", {})
        return all((entries.get(name) or {}).get("sent_step", 0) >= 2 for name in ("mlflow", "wandb"))

    wait_for(first_attempt_ready, 90, interval=0.1)
    if how == "preempt":
        subprocess.run(["scancel", "--signal=USR2", "--batch", sub.job_id], check=True, env=client_env(local_slurm))
    else:
        subprocess.run(["scontrol", "requeue", sub.job_id], check=True, env=client_env(local_slurm))
    release_requeued(local_slurm, sub.job_id)
    first_ids = tracker_ids(run)  # what attempt 1 wrote (attempt 2 has not started its ranks yet)
    first_rows = metrics(run)
    stopped_at = first_rows[-1]["step"]
    assert CKPT <= stopped_at < STEPS, first_rows[-1]

    final = slurm.wait(sub.job_id, timeout=120)
    log = "\n".join(slurm.logs(sub.job_id))
    assert (final.state, final.exit_code, final.extra["restarts"]) == ("COMPLETED", 0, 1), (final, log[-3000:])
    assert f"resumed from {run / 'checkpoints' / f'step_{stopped_at:08d}'} (step {stopped_at})" in log, log[-3000:]
    if how == "preempt":
        assert f"requeueing job {sub.job_id} for segment 2" in log, log[-3000:]
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # metrics.jsonl: each step once

    # trackers.json: the same ids across the requeue, two attempts
    ids = json.loads((run / IDS_FILE).read_text())
    assert tracker_ids(run) == first_ids and set(first_ids) == {"mlflow", "wandb"}, (first_ids, ids)
    assert ids["attempt"] == 2 and ids["sent_step"] == STEPS, ids
    assert all(not entry["unsent"]["rows"] for entry in ids["trackers"].values()), ids
    assert {link.tracker: link.run_id for link in read_tracker_links(run)} == first_ids

    # MLflow, through its own client: one run; every number of every row, at its step, as metrics.jsonl has it
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses a file store without it
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=str(mlruns))
    experiment = client.get_experiment_by_name("trq-requeue")
    [mlrun] = client.search_runs([experiment.experiment_id])
    assert mlrun.info.run_id == first_ids["mlflow"] and mlrun.info.status == "FINISHED", mlrun.info
    assert mlrun.data.tags["clustertrain.attempt"] == "2" and mlrun.data.tags["clustertrain.state"] == "COMPLETED"
    assert mlrun.data.tags["suite"] == "requeue" and mlrun.data.tags["clustertrain.model"] == "tiny"
    artifacts = {a.path for a in client.list_artifacts(mlrun.info.run_id, "clustertrain")}
    assert {"clustertrain/config-attempt1.yaml", "clustertrain/config-attempt2.yaml"} <= artifacts, artifacts
    keys = sorted({k for r in rows for k, v in r.items()
                   if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)})
    assert {"loss", "lr", "tokens_per_s", "step_time_s"} <= set(keys), keys
    for key in keys:
        latest, count = latest_points(client, mlrun.info.run_id, key)
        expected = {r["step"]: float(r[key]) for r in rows if key in r}
        assert {s: latest.get(s) for s in expected} == expected, key
        assert count == len(expected), f"{key}: {count} points for {len(expected)} steps (a step sent twice)"
    attempts, _ = latest_points(client, mlrun.info.run_id, "attempt")
    assert attempts == {s: 1.0 if s <= stopped_at else 2.0 for s in range(1, STEPS + 1)}

    # W&B offline: one run id, one directory per start, each step once across them with metrics.jsonl's loss
    wandb_id = first_ids["wandb"]
    files = offline_runs(run, wandb_id)
    # scontrol: the SIGTERM reaches wandb-core too; its file keeps its header only, and the rank's sender starts the
    # run again (one more directory) or attempt 2 sends the rows again (clustertrain/monitor/trackers.py)
    assert len(files) == 2 if how == "preempt" else len(files) >= 2, sorted(p.name for p in (run / "wandb").iterdir())
    records = [run_record(f) for f in files]  # None: a start whose .wandb file holds no record (its writer died)
    assert {getattr(r, "run_id", None) for r in records} - ({None} if how == "scontrol" else set()) == {wandb_id}, \
        [(f.parent.name, f.stat().st_size) for f in files]
    seen: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for f in files:
        for h in history(f):
            if "loss" in h:
                seen[int(h["step"])].append((h["loss"], h["attempt"]))
    assert {s: v for s, v in seen.items()} == \
        {r["step"]: [(r["loss"], 1.0 if r["step"] <= stopped_at else 2.0)] for r in rows}
    # a requeue is not a tracker failure: no tracker_down warning in the run's events
    assert [e.message for e in read_events(RunPaths(run)) if e.kind == "tracker_down"] == []
