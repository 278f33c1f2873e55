"""The tracker sender with real clients and no training: MLflow's file store in a temp directory, an MLflow URL
where nothing listens, W&B offline (:mod:`clustertrain.monitor.trackers`)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from clustertrain.monitor.config import TrackersConfig
from clustertrain.monitor.trackers import IDS_FILE, TrackerSender, read_tracker_links, tracker_params


def _rows(first: int, last: int, attempt_loss: float = 0.0) -> list[dict]:
    return [{"step": s, "loss": 3.0 - s / 100 + attempt_loss, "lr": 1e-3, "tokens_per_s": 100.0 + s,
             "slowest_node": "n1", "time": 1_795_000_000.0 + s + attempt_loss * 1000} for s in range(first, last + 1)]


def _open(trackers: dict, run_root, start_step=0, warnings=None):
    warnings = [] if warnings is None else warnings
    return TrackerSender.open(TrackersConfig.model_validate(trackers), "proj", "model-a", run_root, start_step,
                              {"model": {"name": "model-a", "training": {"lr": 1e-3}, "api_key": "x"},
                               "layout": {"dp": 2}}, warnings.append)


def test_no_tracker_configured_sends_nothing(tmp_path):
    assert _open({}, tmp_path) is None and not (tmp_path / IDS_FILE).exists()
    assert read_tracker_links(tmp_path) == []


def test_params_are_flat_and_never_name_a_secret():
    params = tracker_params({"model": {"training": {"lr": 0.001, "betas": [0.9, 0.95]}, "hf_token": "t"},
                             "cluster": {"backend": "slurm", "password_file": "/x"}})
    assert params == {"model.training.lr": "0.001", "model.training.betas": "[0.9, 0.95]", "cluster.backend": "slurm"}


def test_file_store_gets_every_row_and_a_resume_reopens_the_run(tmp_path):
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    run_root = tmp_path / "run"
    (run_root).mkdir()
    (run_root / "config.yaml").write_text("name: proj\n")
    warnings: list[str] = []
    sender = _open({"mlflow": {"tracking_uri": str(store), "tags": {"team": "t"}}}, run_root, warnings=warnings)
    for row in _rows(1, 8):
        sender.row(row)
    sender.checkpoint(5, str(run_root / "checkpoints" / "step_00000005"))
    sender.finish("FAILED")  # killed after the checkpoint at 5: steps 6-8 were sent
    ids = json.loads((run_root / IDS_FILE).read_text())
    assert ids["attempt"] == 1 and ids["sent_step"] == 8 and ids["trackers"]["mlflow"]["unsent"]["rows"] == 0
    [link] = read_tracker_links(run_root)
    assert link.tracker == "mlflow" and link.url is None and "mlflow ui" in link.note

    sender = _open({"mlflow": {"tracking_uri": str(store)}}, run_root, start_step=5, warnings=warnings)
    for row in _rows(6, 10, attempt_loss=0.5):
        sender.row(row)
    sender.finish("COMPLETED")
    assert warnings == []
    assert read_tracker_links(run_root)[0].run_id == link.run_id  # the same run, reopened
    client = MlflowClient(tracking_uri=str(store))
    run = client.get_run(link.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "model-a"
    assert run.data.params["model.training.lr"] == "0.001" and run.data.params["layout.dp"] == "2"
    assert not any("api_key" in k for k in run.data.params)
    assert run.data.tags["team"] == "t" and run.data.tags["clustertrain.project"] == "proj"
    assert run.data.tags["clustertrain.superseded"] == "steps 6-8 of attempt 1 superseded by the resume from step 5"
    assert run.data.tags["clustertrain.checkpoint"].endswith("step_00000005")
    history = client.get_metric_history(link.run_id, "loss")
    latest = {}
    for m in sorted(history, key=lambda m: m.timestamp):
        latest[m.step] = m.value
    expected = {r["step"]: r["loss"] for r in _rows(1, 5) + _rows(6, 10, attempt_loss=0.5)}
    assert latest == pytest.approx(expected)
    attempts = client.get_metric_history(link.run_id, "attempt")
    for attempt in (1.0, 2.0):  # within one attempt no step twice
        steps = [m.step for m in attempts if m.value == attempt]
        assert len(steps) == len(set(steps))
    assert "slowest_node" not in run.data.metrics  # numbers only
    artifacts = {f.path for f in client.list_artifacts(link.run_id, "clustertrain")}
    assert {"clustertrain/config-attempt1.yaml", "clustertrain/config-attempt2.yaml"} <= artifacts


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_one_warning_and_the_queue_bound_counts_what_is_lost(tmp_path):
    warnings: list[str] = []
    url = f"http://127.0.0.1:{_closed_port()}"
    sender = _open({"mlflow": {"tracking_uri": url}, "queue_rows": 10}, tmp_path, warnings=warnings)
    for row in _rows(1, 25):
        sender.row(row)  # never blocks: 25 rows into a bound of 10
    sender.finish("COMPLETED", timeout_s=20)
    assert len(warnings) == 1 and warnings[0].startswith("mlflow tracker failed"), warnings
    unsent = json.loads((tmp_path / IDS_FILE).read_text())["trackers"]["mlflow"]["unsent"]
    assert unsent == {"rows": 25, "first_step": 1, "last_step": 25}
    assert read_tracker_links(tmp_path) == []  # no run was ever created


@pytest.mark.slow  # wandb.init starts its wandb-core process
def test_wandb_offline_run_holds_every_row_and_a_resume_keeps_the_id(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")  # never the network
    from tests.support.wandb_records import history, offline_runs, run_record

    wdir = tmp_path / "wb"
    trackers = {"wandb": {"mode": "offline", "dir": str(wdir), "tags": ["t1"]}}
    sender = _open(trackers, tmp_path / "run")
    for row in _rows(1, 6):
        sender.row(row)
    sender.finish("STOPPED")
    [link] = read_tracker_links(tmp_path / "run")
    assert link.tracker == "wandb" and link.url is None and link.note.startswith("offline: wandb sync ")
    sender = _open(trackers, tmp_path / "run", start_step=4)
    for row in _rows(5, 8, attempt_loss=0.5):
        sender.row(row)
    sender.finish("COMPLETED")
    assert read_tracker_links(tmp_path / "run")[0].run_id == link.run_id
    first, second = offline_runs(wdir, link.run_id)
    run = run_record(first)
    assert (run.run_id, run.project, run.run_group, run.display_name) == (link.run_id, "proj", "proj", "model-a")
    assert list(run.tags) == ["t1"]
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["model.training.lr"] == "0.001" and "model.api_key" not in config
    h1, h2 = history(first), history(second)
    assert [(r["step"], r["loss"], r["attempt"]) for r in h1] == [(r["step"], r["loss"], 1) for r in _rows(1, 6)]
    assert [(r["step"], r["loss"], r["attempt"]) for r in h2] == [(r["step"], r["loss"], 2) for r in _rows(5, 8, 0.5)]


def test_events_and_node_samples_reach_the_tracker(tmp_path):
    from mlflow.tracking import MlflowClient

    from clustertrain.core.run_events import Event, EventKind, Severity, append_event
    from clustertrain.monitor.samples import HOST_ONLY

    run_root = tmp_path / "run"
    old = Event(kind=EventKind.LOSS_SPIKE, step=1, message="an earlier attempt's alarm")
    append_event(run_root / "events.jsonl", old)
    store = str(tmp_path / "mlruns")
    sender = _open({"mlflow": {"tracking_uri": store}}, run_root)
    append_event(run_root / "events.jsonl", Event(kind=EventKind.LOSS_SPIKE, step=3, message="loss 9.1 > 2 x median"))
    append_event(run_root / "events.jsonl", Event(kind=EventKind.CHECKPOINT, severity=Severity.INFO, step=4,
                                                  message="checkpoint step_00000004 committed"))
    (run_root / "monitor").mkdir()
    host = ["2026-11-28T10:00:00.000Z", "20", "1.0", "1000", "8000", "0", "0", "0", "0"]
    (run_root / "monitor" / "node-1.csv").write_text(
        ",".join(HOST_ONLY) + "\n" + ",".join(host) + "\n" + ",".join(host[:1] + ["40"] + host[2:]) + "\n")
    for row in _rows(1, 4):
        sender.row(row)
    sender.finish("COMPLETED")
    run_id = read_tracker_links(run_root)[0].run_id
    client = MlflowClient(tracking_uri=store)
    [cpu] = client.get_metric_history(run_id, "node/node-1/cpu_pct")
    assert cpu.value == 30.0 and cpu.step == 4  # the mean of the samples since the previous row, at the last row
    local = client.download_artifacts(run_id, "clustertrain/events-attempt1.txt", str(tmp_path))
    lines = Path(local).read_text().splitlines()
    assert lines == ["step 3: [loss_spike] loss 9.1 > 2 x median"]  # not the earlier attempt's, not the routine one
    assert client.get_run(run_id).data.tags["clustertrain.last_event"] == lines[0]


def test_rows_a_down_tracker_never_took_are_sent_by_the_next_attempt(tmp_path):
    """Attempt 1's tracker is unreachable to its end; attempt 2 (resumed from step 5, the tracker reachable: here the
    ids file is the same, the store another) sends steps 1-5 from metrics.jsonl first, then its own, once each."""
    from mlflow.tracking import MlflowClient

    run_root = tmp_path / "run"
    warnings: list[str] = []
    sender = _open({"mlflow": {"tracking_uri": f"http://127.0.0.1:{_closed_port()}"}}, run_root, warnings=warnings)
    for row in _rows(1, 7):
        sender.row(row)
    sender.finish("FAILED", timeout_s=20)
    assert json.loads((run_root / IDS_FILE).read_text())["trackers"]["mlflow"]["unsent"]["rows"] == 7
    (run_root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(1, 5)))  # as the trainer cut it
    store = str(tmp_path / "mlruns")
    sender = _open({"mlflow": {"tracking_uri": store}}, run_root, start_step=5, warnings=warnings)
    for row in _rows(6, 9):
        sender.row(row)
    sender.finish("COMPLETED")
    assert len(warnings) == 1  # attempt 1's; attempt 2's tracker worked
    run_id = read_tracker_links(run_root)[0].run_id
    points = MlflowClient(tracking_uri=store).get_metric_history(run_id, "loss")
    assert sorted((m.step, m.value) for m in points) == [(r["step"], r["loss"]) for r in _rows(1, 9)]


def _wandb_core_children() -> list[int]:
    """This process's wandb-core service processes (from /proc: their parent and command line)."""
    import os

    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"wandb-core" in cmdline:
            found.append(int(proc.name))
    return found


@pytest.mark.slow  # wandb.init starts its wandb-core process
def test_wandb_rows_an_attempt_never_wrote_are_sent_again_with_their_attempt(tmp_path, monkeypatch):
    """Attempt 1's wandb-core is killed before it writes (a Slurm requeue's SIGTERM): its ``.wandb`` file keeps its
    7-byte header only, although run.log returned for every row. Attempt 2 (resumed from step 4) reads the file, sends
    steps 1-4 again from metrics.jsonl with attempt 1, then its own; trackers.json keeps each attempt's counts."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    from tests.support.wandb_records import history, offline_runs

    wdir, run_root = tmp_path / "wb", tmp_path / "run"
    trackers = {"wandb": {"mode": "offline", "dir": str(wdir)}}
    sender = _open(trackers, run_root)
    for row in _rows(1, 6):
        sender.row(row)
    sender.finish("STOPPED")
    [link] = read_tracker_links(run_root)
    [first] = offline_runs(wdir, link.run_id)
    assert [r["step"] for r in history(first)] == [1, 2, 3, 4, 5, 6]
    first.write_bytes(first.read_bytes()[:7])  # what a wandb-core killed before its first write leaves
    assert history(first) == []
    (run_root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(1, 4)))
    sender = _open(trackers, run_root, start_step=4)
    for row in _rows(5, 8, attempt_loss=0.5):
        sender.row(row)
    sender.finish("COMPLETED")
    _, second = offline_runs(wdir, link.run_id)
    assert [(r["step"], r["loss"], r["attempt"]) for r in history(second)] == \
        [(r["step"], r["loss"], 1) for r in _rows(1, 4)] + [(r["step"], r["loss"], 2) for r in _rows(5, 8, 0.5)]
    entry = json.loads((run_root / IDS_FILE).read_text())["trackers"]["wandb"]
    assert entry["resent"] == {"rows": 4, "first_step": 1, "last_step": 4}
    assert entry["unsent_by_attempt"] == {"1": {"rows": 0, "first_step": None, "last_step": None},
                                          "2": {"rows": 0, "first_step": None, "last_step": None}}


@pytest.mark.slow  # wandb.init starts its wandb-core process; the test kills it
def test_wandb_service_killed_mid_attempt_is_restarted_once_at_the_end(tmp_path, monkeypatch):
    """wandb-core gets SIGTERM while the rank lives on (a requeue's signal reaches every process of the job): at
    finish the sender starts the run again (a new offline directory, the same id) and sends the rows the dead service
    had not written, then the rest; no row is lost, none is written twice."""
    import os
    import signal

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    from tests.support.wandb_records import history, offline_runs

    wdir, run_root = tmp_path / "wb", tmp_path / "run"
    warnings: list[str] = []
    sender = _open({"wandb": {"mode": "offline", "dir": str(wdir)}}, run_root, warnings=warnings)
    for row in _rows(1, 5):
        sender.row(row)
    deadline = time.time() + 60
    while time.time() < deadline and json.loads((run_root / IDS_FILE).read_text()).get("sent_step", 0) < 5:
        time.sleep(0.05)
    cores = _wandb_core_children()
    assert cores, "no wandb-core child process"
    for pid in cores:
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + 20
    while time.time() < deadline and any(Path(f"/proc/{pid}").exists() and
                                         b"Z" not in Path(f"/proc/{pid}/stat").read_bytes()[:80] for pid in cores):
        time.sleep(0.05)
    for row in _rows(6, 8):
        sender.row(row)
    sender.finish("STOPPED", timeout_s=60)
    [link] = read_tracker_links(run_root)
    files = offline_runs(wdir, link.run_id)
    assert len(files) == 2, files
    steps = [r["step"] for f in files for r in history(f)]
    assert sorted(steps) == list(range(1, 9)), steps
    entry = json.loads((run_root / IDS_FILE).read_text())["trackers"]["wandb"]
    assert entry["unsent"]["rows"] == 0, entry
    assert warnings == []  # recovered: nothing lost, not a tracker failure
