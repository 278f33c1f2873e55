"""Issue 41 item 4: the trackers' credentials reach the container by name only (Pyxis ``--container-env``), never by
value, in what ``submit --dry-run`` prints (the batch script, as submitted)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from clustertrain.cli import jobs

KEY = "wandb-value-7f3e9c1d-unique-never-written"
PASSWORD = "mlflow-pass-4b2a-unique-never-written"
TOKEN = "mlflow-token-9d8c-unique-never-written"


@pytest.fixture
def project_file(tmp_path):
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"hsqs")
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: tr\n"
        f"cluster: {{backend: slurm, nodes: 1, procs_per_node: 1, container_image: {str(image)!r}}}\n"
        f"storage: {{root: {str(tmp_path / 'fsx')!r}}}\n"
        "monitor:\n  trackers:\n"
        f"    mlflow: {{tracking_uri: {str(tmp_path / 'mlruns')!r}, tags: {{team: pretrain}}}}\n"
        "    wandb: {project: tr, mode: online}\n"
        "models:\n- {name: a, model: {layers: 2, hidden: 64, heads: 4, seq_len: 64}, training: {max_steps: 5}}\n")
    return path


def submit_dry_run(path: Path) -> CliRunner:
    app = typer.Typer()
    jobs.register(app)
    return CliRunner().invoke(app, ["submit", str(path), "--dry-run"])


def test_tracker_secrets_are_passed_by_name_and_their_values_are_nowhere(project_file, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", TOKEN)
    res = submit_dry_run(project_file)
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if "--container-env=" in x)
    names = line.split("--container-env=", 1)[1].split()[0].strip("'\"").split(",")
    assert {"WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME"} <= set(names)
    for value in (KEY, PASSWORD, TOKEN):
        assert value not in res.output
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(KEY not in p.read_bytes().decode("latin-1") for p in written)
    assert not (tmp_path / "fsx").exists()  # a dry run writes nothing


def test_wandb_online_without_a_key_refuses_the_submit(project_file, monkeypatch, tmp_path, capsys):
    from clustertrain.cli import main

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_IDENTITY_TOKEN_FILE", raising=False)
    with pytest.raises(SystemExit) as ex:
        main(["submit", str(project_file), "--dry-run"])
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert "monitor.trackers.wandb: mode online" in err and "WANDB_API_KEY" in err
    assert not (tmp_path / "fsx").exists()
