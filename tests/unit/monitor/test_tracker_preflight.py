"""``monitor.trackers`` input that cannot work is refused before any rank starts: one line naming the field and the
fix (clustertrain/monitor/tracker_preflight.py), through ``check``, ``run`` and ``submit``."""

from __future__ import annotations

import http.server
import socket
import threading
from pathlib import Path

import pytest

from clustertrain.check import run_check
from clustertrain.cli import main
from clustertrain.core.errors import ConfigError
from clustertrain.monitor.tracker_preflight import tracker_env_names, tracker_findings
from clustertrain.resolve import load_project

ROOT = Path(__file__).resolve().parents[3]
QUICK = ROOT / "examples" / "quickstart.yaml"
P5E = ROOT / "examples" / "p5e-80x7.yaml"
NO_ENV = {"HOME": "/nonexistent-home"}


def errors(project, environ=NO_ENV):
    return [(f.path, f.message, f.fix) for f in tracker_findings(project, environ) if f.level == "error"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_local_file_store_and_offline_wandb_pass(tmp_path):
    p = load_project(QUICK, [f"monitor.trackers.mlflow.tracking_uri={tmp_path}/mlruns", "monitor.trackers.wandb.mode=offline"])
    assert errors(p) == []


def test_credentials_in_the_tracking_uri_are_refused_naming_the_variables():
    p = load_project(QUICK, ["monitor.trackers.mlflow.tracking_uri=http://alice:hunter2@127.0.0.1:1/"])
    (path, message, fix), = errors(p)  # one line: no health probe of a URL with a password in it
    assert path == "monitor.trackers.mlflow.tracking_uri" and "user:password@" in message
    assert "MLFLOW_TRACKING_USERNAME" in fix and "MLFLOW_TRACKING_PASSWORD" in fix
    assert [f.path for _, f in run_check(p, only=["secrets"]).errors] == ["monitor.trackers.mlflow.tracking_uri"]


def test_a_secret_looking_tag_is_a_secrets_error():
    p = load_project(QUICK, ["monitor.trackers.mlflow.tracking_uri=/tmp/x",
                             "monitor.trackers.mlflow.tags.note=AKIAABCDEFGHIJKLMNOP",
                             "monitor.trackers.mlflow.tags.api_token=abc"])
    found = sorted(f.path for _, f in run_check(p, only=["secrets"]).errors)
    assert found == ["monitor.trackers.mlflow.tags.api_token", "monitor.trackers.mlflow.tags.note"]


def test_an_mlflow_server_that_does_not_answer_is_refused():
    port = free_port()  # nothing listens there
    p = load_project(QUICK, [f"monitor.trackers.mlflow.tracking_uri=http://127.0.0.1:{port}"])
    (path, message, fix), = errors(p)
    assert path == "monitor.trackers.mlflow.tracking_uri" and f"GET http://127.0.0.1:{port}/health" in message
    assert "mlflow server" in fix


def test_a_server_answering_health_passes_and_a_500_does_not():
    status = {"code": 200}

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(status["code"] if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        p = load_project(QUICK, [f"monitor.trackers.mlflow.tracking_uri=http://127.0.0.1:{server.server_port}/"])
        assert errors(p) == []
        status["code"] = 503
        assert "HTTP 503" in errors(p)[0][1]
    finally:
        server.shutdown()


def test_wandb_online_without_a_key_is_refused_and_a_key_or_netrc_passes(tmp_path):
    p = load_project(QUICK, ["monitor.trackers.wandb.project=p"])
    (path, message, fix), = errors(p)
    assert path == "monitor.trackers.wandb" and "WANDB_API_KEY" in message and "mode: offline" in fix
    assert errors(p, {**NO_ENV, "WANDB_API_KEY": "x" * 40}) == []
    rc = tmp_path / "netrc"
    rc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert errors(p, {"NETRC": str(rc)}) == []
    rc.write_text("machine example.org login u password p\n")
    assert len(errors(p, {"NETRC": str(rc)})) == 1


def test_file_stores_and_wandb_dir_off_the_shared_mounts_are_refused_on_slurm(tmp_path):
    base = load_project(P5E)
    assert base.aws is not None
    off = load_project(P5E, ["monitor.trackers.mlflow.tracking_uri=sqlite:////home/u/mlflow.db",
                             "monitor.trackers.wandb.mode=offline", "monitor.trackers.wandb.dir=/home/u/wandb"])
    found = {path: message for path, message, _ in errors(off)}
    assert "monitor.trackers.mlflow.tracking_uri" in found and "monitor.trackers.wandb.dir" in found
    on = load_project(P5E, ["monitor.trackers.mlflow.tracking_uri=file:///fsx/logs/mlruns",
                            "monitor.trackers.wandb.mode=offline", "monitor.trackers.wandb.dir=/fsx/logs/wandb"])
    assert errors(on) == []
    rel = load_project(P5E, ["monitor.trackers.mlflow.tracking_uri=mlruns"])
    assert "relative path" in errors(rel)[0][1]


def test_in_the_built_image_the_pins_decide_and_the_shipped_pins_have_both_clients(tmp_path):
    import yaml

    from clustertrain.image.versions import DEFAULT_VERSIONS

    p = load_project(P5E, ["monitor.trackers.mlflow.tracking_uri=/fsx/logs/mlruns", "monitor.trackers.wandb.mode=offline"])
    assert errors(p) == []
    raw = yaml.safe_load(DEFAULT_VERSIONS.read_text())
    del raw["tracking"]
    mine = tmp_path / "versions.yaml"
    mine.write_text(yaml.safe_dump(raw))
    bare = load_project(P5E, [f"image.versions={mine}", "monitor.trackers.mlflow.tracking_uri=/fsx/logs/mlruns"])
    (path, message, fix), = errors(bare)
    assert path == "monitor.trackers.mlflow" and "mlflow-skinny" in message and "image build" in fix


def test_unknown_tracker_key_is_one_line_naming_it():
    with pytest.raises(ConfigError) as err:
        load_project(QUICK, ["monitor.trackers.neptune.project=x"])
    text = str(err.value)
    assert "monitor.trackers.neptune" in text and "\n" not in text.strip()


def test_run_refuses_before_any_rank_and_writes_nothing(tmp_path, capsys):
    port = free_port()
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as ex:
        main(["run", str(QUICK), "--set", f"storage.root={runs}",
              "--set", f"monitor.trackers.mlflow.tracking_uri=http://127.0.0.1:{port}"])
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert "monitor.trackers.mlflow.tracking_uri" in err and "/health" in err
    assert not runs.exists() or not any(runs.rglob("metrics.jsonl"))


def test_the_names_passed_into_the_container_follow_the_configured_trackers():
    p = load_project(QUICK, ["monitor.trackers.wandb.mode=offline"])
    names = tracker_env_names(p.monitor.trackers)
    assert "WANDB_API_KEY" in names and not any(n.startswith("MLFLOW") for n in names)
    assert tracker_env_names(load_project(QUICK).monitor.trackers) == ()


def test_a_client_that_cannot_be_imported_here_names_the_extra(tmp_path, monkeypatch):
    import importlib.util
    import sys

    # None in sys.modules is how Python marks a module unimportable: find_spec then answers None, `import` fails
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert importlib.util.find_spec("wandb") is None
    p = load_project(QUICK, ["monitor.trackers.wandb.mode=offline"])
    (path, message, fix), = errors(p)
    assert path == "monitor.trackers.wandb" and "not installed" in message
    assert fix.startswith("pip install 'clustertrain[tracking]'")
