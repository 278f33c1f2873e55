"""Issue 41 item 5: ``status`` and ``report`` link each model's tracker run, read from ``RUN_DIR/trackers.json`` (the
format of clustertrain/monitor/trackers.py's docstring, written here as the sender writes it)."""

from __future__ import annotations

import json

from rich.console import Console

from clustertrain.monitor.status import model_status
from clustertrain.monitor.status_view import status_view
from clustertrain.monitor.trackers import IDS_FILE
from tests.unit.monitor.test_report import render, synthesize_run, write_project
from tests.unit.monitor.test_status import make_run

IDS = {"version": 1, "attempt": 2, "sent_step": 40, "trackers": {
    "mlflow": {"run_id": "9f1c0d", "experiment_id": "1", "url": "http://mlflow:5000/#/experiments/1/runs/9f1c0d",
               "note": None, "sent_step": 40},
    "wandb": {"run_id": "k3x9q2ab", "url": None, "note": "offline: wandb sync /fsx/runs/p/m/wandb/offline-run-*-k3x9q2ab*",
              "sent_step": 40}}, "superseded": []}


def test_status_shows_one_line_per_tracker_run(tmp_path):
    paths = make_run(tmp_path / "run", steps=3)
    (paths.root / IDS_FILE).write_text(json.dumps(IDS))
    st = model_status("m", paths.root)
    assert [(t["tracker"], t["run_id"]) for t in st.trackers] == [("mlflow", "9f1c0d"), ("wandb", "k3x9q2ab")]
    console = Console(width=200, record=True)
    console.print(status_view([st], 200))
    text = console.export_text()
    assert "m: mlflow run 9f1c0d: http://mlflow:5000/#/experiments/1/runs/9f1c0d" in text
    assert "m: wandb run k3x9q2ab: offline: wandb sync /fsx/runs/p/m/wandb/offline-run-*-k3x9q2ab*" in text
    assert "trackers" in st.to_dict() and model_status("m", make_run(tmp_path / "none", steps=1).root).trackers == []


def test_the_report_links_http_runs_only_and_escapes_the_rest(tmp_path):
    paths = synthesize_run(write_project(tmp_path))
    ids = json.loads(json.dumps(IDS))
    ids["trackers"]["wandb"]["url"] = 'javascript:alert("x")'
    (paths.root / IDS_FILE).write_text(json.dumps(ids))
    html, page = render(paths.root)
    assert '<a href="http://mlflow:5000/#/experiments/1/runs/9f1c0d">9f1c0d</a>' in html
    assert "javascript:" not in html and "k3x9q2ab" in html and "wandb sync" in html
