"""Issue 41 item 6: a Megatron-LM model gets the trackers too — Megatron's own ``--wandb-*`` options (core_v0.16.1
``megatron/training/global_vars.py``), ``--tensorboard-dir`` only with ``monitor.trackers.tensorboard``, and MLflow
(no Megatron option) through the rows ``status`` ingests from Megatron's log."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertrain.core.run_events import read_jsonl
from clustertrain.megatron.args import megatron_args, tracker_environment
from clustertrain.monitor.config import MlflowTrackerConfig, TrackersConfig, WandbTrackerConfig
from clustertrain.monitor.status import model_status
from clustertrain.monitor.trackers import read_ids, read_tracker_links
from tests.unit.megatron.test_args import _context, _model, _project
from tests.unit.megatron.test_logs import _lines, _megatron_project_and_entry, training_log  # noqa: F401 (fixture)
from tests.unit.monitor.test_status import make_run


def _with_trackers(project, **trackers):
    return project.model_copy(update={"monitor": project.monitor.model_copy(update={"trackers": TrackersConfig(**trackers)})})


def _value(args: list[str], option: str) -> str | None:
    return args[args.index(option) + 1] if option in args else None


def test_wandb_options_are_megatrons_own_and_tensorboard_follows_the_switch():
    base = _project([_model("a")])
    entry = base.models[0]
    plain = megatron_args(_context(base, entry, 16))
    assert "--tensorboard-dir" in plain and not any(a.startswith("--wandb") for a in plain)
    p = _with_trackers(base, tensorboard=False,
                       wandb=WandbTrackerConfig(entity="team", mode="offline", dir=Path("/fsx/wandb")))
    args = megatron_args(_context(p, p.models[0], 16))
    assert "--tensorboard-dir" not in args
    assert (_value(args, "--wandb-project"), _value(args, "--wandb-exp-name"), _value(args, "--wandb-entity"),
            _value(args, "--wandb-save-dir")) == ("mg", "a", "team", "/fsx/wandb")
    env = tracker_environment(p, p.models[0], Path("/fsx/runs/mg/a"))
    assert env["WANDB_MODE"] == "offline" and env["WANDB_RUN_GROUP"] == "mg" and env["WANDB_RESUME"] == "allow"
    # the same run directory (a requeue, a resubmission) continues the same W&B run; another does not
    assert env["WANDB_RUN_ID"] == tracker_environment(p, p.models[0], Path("/fsx/runs/mg/a"))["WANDB_RUN_ID"]
    assert env["WANDB_RUN_ID"] != tracker_environment(p, p.models[0], Path("/fsx/runs/mg/b"))["WANDB_RUN_ID"]


def test_status_sends_the_ingested_megatron_rows_to_mlflow(training_log, tmp_path, monkeypatch):  # noqa: F811
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tmp_path / "mlruns"
    project, _ = _megatron_project_and_entry(tmp_path)
    project = _with_trackers(project, mlflow=MlflowTrackerConfig(tracking_uri=str(store)))
    paths = make_run(tmp_path / "run", max_steps=1000, model="gpt")
    paths.logs.mkdir()
    paths.rank_log(0).write_text(_lines(training_log, [10, 20, 30]))
    st = model_status("gpt", paths.root, None, project=project)
    assert st.step == 30 and not [m for m in st.missing if "tracker" in m], st.missing
    (link,) = read_tracker_links(paths.root)
    assert link.tracker == "mlflow"
    client = MlflowClient(str(store))
    rows = read_jsonl(paths.metrics)
    history = client.get_metric_history(link.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(r["step"], r["loss"]) for r in rows]
    # more lines later: only the new rows are sent, none twice
    with open(paths.rank_log(0), "a") as f:
        f.write(_lines(training_log, [40], losses={"lm loss": 2.125}))
    st = model_status("gpt", paths.root, None, project=project)
    history = client.get_metric_history(link.run_id, "loss")
    assert [m.step for m in history] == [10, 20, 30, 40] and history[-1].value == 2.125
    assert [lk.run_id for lk in read_tracker_links(paths.root)] == [link.run_id]
    assert any(st.trackers) and st.trackers[0]["run_id"] == link.run_id
    # status only hands rows on: one attempt, no config artifact per call, the run left running for Megatron's job
    assert read_ids(paths.root)["attempt"] == 1
    assert {m.value for m in client.get_metric_history(link.run_id, "attempt")} == {1.0}
    run = client.get_run(link.run_id)
    assert run.info.status == "RUNNING" and run.data.tags["clustertrain.state"] == "RUNNING"
    assert not [a.path for a in client.list_artifacts(link.run_id, "clustertrain") if "config-attempt" in a.path]


@pytest.mark.slow
def test_megatrons_parser_takes_the_rendered_wandb_options(tmp_path_factory):
    from tests.support.megatron_lm import megatron_source, parse_with_megatron

    p = _with_trackers(_project([_model("a")]), wandb=WandbTrackerConfig(entity="team", dir=Path("/fsx/wandb")))
    args = megatron_args(_context(p, p.models[0], 16))
    source = megatron_source(tmp_path_factory.mktemp("megatron-lm"))
    (result,) = parse_with_megatron(source, [{"args": args, "world": 16,
                                              "read": ["wandb_project", "wandb_exp_name", "wandb_save_dir", "wandb_entity"]}])
    assert result.accepted, result.error
    assert result.values == {"wandb_project": "mg", "wandb_exp_name": "a", "wandb_save_dir": "/fsx/wandb",
                             "wandb_entity": "team"}
