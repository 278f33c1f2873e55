"""Experiment trackers end to end (:mod:`clustertrain.monitor.trackers`): real `clustertrain run` (2 gloo ranks),
a real `mlflow server` on 127.0.0.1, MLflow's file store, W&B offline; read back with the trackers' own clients."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from clustertrain.core.run_events import read_jsonl
from clustertrain.monitor.trackers import IDS_FILE, read_tracker_links

from tests.support.mlflow_server import MlflowServer
from tests.support.training import clustertrain, kill_all, metrics, run_cli, wait_for
from tests.support.wandb_records import history, offline_runs, run_record

pytestmark = pytest.mark.slow

PROJECT = """name: trk
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: 2, threads_per_worker: 1}}
storage: {{root: {root}}}
monitor: {{trackers: {trackers}}}
models:
{models}"""
MODEL = """  - name: {name}
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: {steps}, micro_batch: 4, global_batch: 16, lr: 3.0e-3, warmup_steps: 2,
               checkpoint_every: {ckpt}, keep_last: 2, log_every: 1, seed: 7}}
"""


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B never tries the network here
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this test's own reader of the file store (mlflow 3.x)


def project(tmp_path: Path, trackers: dict, names=("alpha",), steps: int = 8, ckpt: int = 4) -> Path:
    path = tmp_path / "p.yaml"
    models = "".join(MODEL.format(name=n, steps=steps, ckpt=ckpt) for n in names)
    path.write_text(PROJECT.format(root=json.dumps(str(tmp_path / "fsx")), trackers=json.dumps(trackers),
                                   models=models))
    return path


def numeric(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("step", "time") and isinstance(v, (int, float))
            and not isinstance(v, bool)}


def latest_points(client, run_id: str, key: str) -> dict[int, float]:
    """Per step, the value of the latest point (by timestamp: a resume's rows come after the attempt it supersedes)."""
    out = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
        out[m.step] = m.value
    return out


def assert_mlflow_matches(client, run_dir: Path, model: str, experiment: str = "trk") -> str:
    [link] = [l for l in read_tracker_links(run_dir) if l.tracker == "mlflow"]
    run = client.get_run(link.run_id)
    assert run.info.run_name == model and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == experiment
    assert run.data.tags["clustertrain.model"] == model and run.data.tags["clustertrain.project"] == "trk"
    params = run.data.params
    assert params["model.name"] == model and params["cluster.backend"] == "local" and params["layout.dp"] == "2"
    assert params["model.training.max_steps"] == str(metrics(run_dir)[-1]["step"])
    rows = metrics(run_dir)
    for key in sorted({k for r in rows for k in numeric(r)}):
        expected = {r["step"]: float(r[key]) for r in rows if key in numeric(r)}
        assert latest_points(client, link.run_id, key) == expected, key
    return link.run_id


def test_mlflow_server_gets_params_and_every_row_of_each_model(tmp_path):
    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        p = project(tmp_path, {"tensorboard": False, "mlflow": {"tracking_uri": server.url}}, names=("alpha", "beta"))
        res = run_cli("run", str(p))
        assert res.returncode == 0, res.stdout
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=server.url)
        ids = {assert_mlflow_matches(client, tmp_path / "fsx" / "trk" / m, m) for m in ("alpha", "beta")}
        assert len(ids) == 2
        link = read_tracker_links(tmp_path / "fsx" / "trk" / "alpha")[0]
        experiment = client.get_run(link.run_id).info.experiment_id
        assert link.url == f"{server.url}/#/experiments/{experiment}/runs/{link.run_id}"
        artifacts = [f.path for f in client.list_artifacts(link.run_id, "clustertrain")]
        assert "clustertrain/config-attempt1.yaml" in artifacts
        assert not list((tmp_path / "fsx" / "trk" / "alpha").glob("tensorboard/events.*"))  # tensorboard: false
    finally:
        server.stop()


def test_file_store_and_wandb_offline_hold_the_same_rows(tmp_path):
    wdir = tmp_path / "wandb-dir"
    p = project(tmp_path, {"mlflow": {"tracking_uri": str(tmp_path / "mlruns")},
                           "wandb": {"mode": "offline", "dir": str(wdir)}})
    res = run_cli("run", str(p))
    assert res.returncode == 0, res.stdout
    run_dir = tmp_path / "fsx" / "trk" / "alpha"
    from mlflow.tracking import MlflowClient

    assert_mlflow_matches(MlflowClient(tracking_uri=str(tmp_path / "mlruns")), run_dir, "alpha")
    [wb] = [l for l in read_tracker_links(run_dir) if l.tracker == "wandb"]
    [file] = offline_runs(wdir, wb.run_id)
    run = run_record(file)
    assert (run.project, run.run_group, run.display_name) == ("trk", "trk", "alpha")
    rows = metrics(run_dir)
    got = history(file)
    assert [r["step"] for r in got] == [r["step"] for r in rows]
    for mine, theirs in zip(rows, got):
        assert {k: theirs[k] for k in numeric(mine)} == pytest.approx(numeric(mine)) and theirs["attempt"] == 1
    assert list(wdir.glob(f"wandb/offline-run-*-{wb.run_id}/files/clustertrain-config.yaml"))


def test_killed_and_resumed_run_continues_one_tracker_run(tmp_path):
    wdir = tmp_path / "wandb-dir"
    store = tmp_path / "mlruns"
    p = project(tmp_path, {"mlflow": {"tracking_uri": str(store)}, "wandb": {"mode": "offline", "dir": str(wdir)}},
                steps=40, ckpt=10)
    run_dir = tmp_path / "fsx" / "trk" / "alpha"
    # rank 0's data slowed (0.3 s a step: a checkpoint every ~3 s) so that the kill lands mid-run, between two
    proc = clustertrain("run", str(p), env={"CLUSTERTRAIN_INJECT_SLOW_DATA": "0:0.3"})
    latest = run_dir / "checkpoints" / "latest"

    def saved() -> int:
        return int(latest.read_text().strip().removeprefix("step_")) if latest.exists() else 0

    ids = run_dir / IDS_FILE

    def sent_past_checkpoint() -> bool:
        """A checkpoint committed over 2 s ago (W&B has written its rows to disk: WANDB_FLUSH_S, and the sender's
        1 s) and the trackers took rows past it: the kill then supersedes those."""
        return (saved() >= 10 and time.time() - latest.stat().st_mtime > 2.0
                and json.loads(ids.read_text()).get("sent_step", 0) > saved())

    wait_for(sent_past_checkpoint, 120, interval=0.02)
    kill_all(proc)
    at_kill = saved()
    sent = json.loads(ids.read_text())["sent_step"]
    assert sent > at_kill and at_kill < 40
    first = {l.tracker: l.run_id for l in read_tracker_links(run_dir)}
    res = run_cli("run", str(p))
    assert res.returncode == 0, res.stdout
    assert {l.tracker: l.run_id for l in read_tracker_links(run_dir)} == first  # the same runs, reopened
    record = json.loads(ids.read_text())
    assert record["attempt"] == 2 and record["superseded"][0]["resumed_from"] == at_kill
    assert record["superseded"][0]["first_step"] == at_kill + 1 and record["superseded"][0]["last_step"] >= sent
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=str(store))
    assert_mlflow_matches(client, run_dir, "alpha")
    tag = client.get_run(first["mlflow"]).data.tags["clustertrain.superseded"]
    assert tag.startswith(f"steps {at_kill + 1}-")
    assert tag.endswith(f"of attempt 1 superseded by the resume from step {at_kill}")
    attempts = client.get_metric_history(first["mlflow"], "attempt")
    for attempt in (1.0, 2.0):  # within one attempt, no step twice
        steps = [m.step for m in attempts if m.value == attempt]
        assert steps and len(steps) == len(set(steps))
    assert min(m.step for m in attempts if m.value == 2.0) == at_kill + 1
    # W&B: one .wandb file per attempt, the same id; the latest attempt's row of each step is metrics.jsonl's
    files = offline_runs(wdir, first["wandb"])
    assert len(files) == 2 and {run_record(f).run_id for f in files} == {first["wandb"]}
    latest_rows: dict[int, dict] = {}
    for f in files:
        rows = history(f)
        assert len({r["step"] for r in rows}) == len(rows)
        latest_rows.update({r["step"]: r for r in rows})
    assert sorted(latest_rows) == list(range(1, 41))
    for row in metrics(run_dir):
        assert {k: latest_rows[row["step"]][k] for k in numeric(row)} == pytest.approx(numeric(row))


def test_mlflow_server_stopped_mid_run_is_one_warning_and_training_finishes(tmp_path):
    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        p = project(tmp_path, {"mlflow": {"tracking_uri": server.url}}, steps=40, ckpt=20)
        run_dir = tmp_path / "fsx" / "trk" / "alpha"
        proc = clustertrain("run", str(p), env={"CLUSTERTRAIN_INJECT_SLOW_DATA": "0:0.1"})  # >= 4 s of training
        ids = run_dir / IDS_FILE
        wait_for(lambda: ids.exists() and json.loads(ids.read_text()).get("sent_step", 0) >= 3, 120)
    finally:
        server.stop()
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    assert [r["step"] for r in metrics(run_dir)][-1] == 40
    down = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "tracker_down"]
    assert len(down) == 1 and down[0]["severity"] == "warning" and down[0]["message"].startswith("mlflow tracker"), down
    record = json.loads(ids.read_text())["trackers"]["mlflow"]
    unsent = record["unsent"]
    assert unsent["rows"] >= 1 and unsent["last_step"] == 40 and unsent["first_step"] == record["sent_step"] + 1
    assert unsent["rows"] == 40 - record["sent_step"]
    assert "metrics row(s) not sent" in out
