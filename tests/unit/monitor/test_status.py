"""`clustertrain status` rows from synthesized run directories in the documented formats (records.py, runstate.py,
train/checkpoint.py, launch/jobs.py): states, figures, cost from the plan's price, alarms, damaged files, the CLI's
exit codes. Slurm jobs are handed in as JobStatus values, as the launch stage builds them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from clustertrain.cli import main
from clustertrain.launch.backend import JobStatus
from clustertrain.monitor.records import Attempt, Event, Usage, append_event, write_usage
from clustertrain.monitor.status import (COMPLETED, FAILED, NOT_STARTED, QUEUED, REQUEUED, RUNNING, alarms, any_failed,
                                         gpu_hour_prices, human_duration, model_status, project_status)
from clustertrain.monitor.status_view import status_json, status_view
from clustertrain.project import load_project
from clustertrain.rundir import RunPaths, write_atomic
from clustertrain.runstate import RunInfo, RunStatus, write_record, write_status_record
from clustertrain.states import State
from clustertrain.train.checkpoint import CheckpointMeta
from tests.support.projects import tiny_project

ROOT = Path(__file__).resolve().parents[3]
NOW = 1_795_000_000.0
HOST = socket.gethostname()


def make_run(root: Path, max_steps: int = 100, steps: int = 0, step_time: float = 0.5, ckpt: int | None = None,
             status: RunStatus | None = None, attempts: list[Attempt] | None = None, model: str = "m") -> RunPaths:
    paths = RunPaths(root)
    root.mkdir(parents=True, exist_ok=True)
    write_record(paths.run_json, RunInfo(project="p", model=model, fingerprint="f", dataset="d", created=NOW - 7200))
    write_atomic(paths.config, f"name: p\nmodels:\n  - name: {model}\n    training: {{max_steps: {max_steps}}}\n")
    rows = [{"step": s, "loss": 5.0 - s / 100, "tokens_per_s": 1000.0 + s, "mfu": 0.4, "step_time_s": step_time,
             "time": NOW - 100 + s} for s in range(1, steps + 1)]
    if rows:
        paths.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if ckpt is not None:
        d = paths.checkpoints / f"step_{ckpt:08d}"
        d.mkdir(parents=True)
        (d / ".metadata").write_bytes(b"x")
        write_record(d / "meta.json", CheckpointMeta(step=ckpt, time=NOW - 125))
        (paths.checkpoints / "latest").write_text(d.name)
    if status is not None:
        write_status_record(paths, status)
    if attempts is not None:
        write_usage(paths, Usage(attempts=attempts))
    return paths


def attempt(**kw) -> Attempt:
    base = dict(started=NOW - 3600, last=NOW - 10, gpus=8, nodes=["node-1"], job_id="local-1", pid=1, host=HOST)
    return Attempt(**{**base, **kw})


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# -- states --------------------------------------------------------------------------------------------------------


def test_completed_run_with_every_figure(tmp_path):
    paths = make_run(tmp_path / "m", max_steps=10, steps=10, step_time=0.25, ckpt=10,
                     status=RunStatus(state=State.COMPLETED, step=10, time=NOW - 60),
                     attempts=[attempt(state=State.COMPLETED, ended=NOW - 60, started=NOW - 3660, step=10)])
    st = model_status("m", paths.root, now=NOW, price_per_gpu_hour=2.0)
    assert (st.state, st.step, st.max_steps, st.loss, st.tokens_per_s, st.mfu) == (COMPLETED, 10, 10, 4.9, 1010.0, 0.4)
    assert st.step_time_s == 0.25 and st.eta_s is None  # no ETA once completed
    assert st.gpu_hours == pytest.approx(8.0) and st.cost_usd == pytest.approx(16.0)
    assert Path(st.checkpoint).name == "step_00000010" and st.checkpoint_age_s == pytest.approx(125)
    assert (st.job_id, st.nodes, st.missing, st.failed) == ("local-1", ["node-1"], [], False)


def test_running_with_a_live_rank0_here_counts_gpu_hours_to_now_and_has_an_eta(tmp_path):
    import os

    import psutil

    rows_time = [0.5, 0.5, 0.9, 0.5, 0.4, 0.6]  # median of the last 5: 0.5
    started = psutil.Process().create_time() + 0.5  # rank 0 (this process) began training after it was created
    paths = make_run(tmp_path / "m", max_steps=100, steps=40,
                     status=RunStatus(state=State.RUNNING, step=0, time=started),
                     attempts=[attempt(pid=os.getpid(), started=started, last=started, gpus=2)])
    lines = paths.metrics.read_text().splitlines()
    paths.metrics.write_text("".join(json.dumps({**json.loads(l), "step_time_s": t}) + "\n"
                                     for l, t in zip(lines[-len(rows_time):], rows_time)))
    st = model_status("m", paths.root)
    assert st.state == RUNNING and st.step == 40 and st.step_time_s == 0.5
    assert st.eta_s == pytest.approx(60 * 0.5)
    assert st.gpu_hours == pytest.approx((time.time() - started) / 3600 * 2, rel=0.05)  # counted to now, not to `last`
    assert st.gpu_hours > 0
    assert st.cost_usd is None  # no price given


def test_running_on_another_host_shows_the_heartbeat_age(tmp_path):
    paths = make_run(tmp_path / "m", steps=3, status=RunStatus(state=State.RUNNING, time=NOW - 3600),
                     attempts=[attempt(host="node-9", pid=dead_pid(), last=NOW - 150)])
    st = model_status("m", paths.root, now=NOW, host="login-1")
    assert st.state == RUNNING and st.heartbeat_age_s == 150
    assert st.message == "on node-9: last heartbeat 2m 30s ago" and st.host == "node-9"


def test_running_with_rank0_gone_on_this_host_is_failed(tmp_path):
    pid = dead_pid()
    paths = make_run(tmp_path / "m", steps=5, status=RunStatus(state=State.RUNNING, time=NOW - 3600),
                     attempts=[attempt(pid=pid, last=NOW - 500)])
    st = model_status("m", paths.root, now=NOW, host=HOST)
    assert st.state == FAILED and st.message == f"rank 0 (pid {pid}) is gone without a final state"
    assert st.gpu_hours == pytest.approx((NOW - 500 - (NOW - 3600)) / 3600 * 8)  # counted to its last sign of life
    assert st.eta_s is None and any_failed([st])


def test_a_pid_reused_by_a_younger_process_is_not_rank0(tmp_path):
    import os

    paths = make_run(tmp_path / "m", steps=1, status=RunStatus(state=State.RUNNING, time=NOW - 3600),
                     attempts=[attempt(pid=os.getpid(), started=100.0, last=200.0)])  # this process started later
    assert model_status("m", paths.root, now=NOW, host=HOST).state == FAILED


def test_never_started(tmp_path):
    st = model_status("m", tmp_path / "nothing", max_steps=50)
    assert (st.state, st.step, st.max_steps, st.missing) == (NOT_STARTED, None, 50, [])
    (tmp_path / "empty").mkdir()
    assert model_status("m", tmp_path / "empty").state == NOT_STARTED
    prepared = make_run(tmp_path / "prepared")
    st = model_status("m", prepared.root)
    assert st.state == NOT_STARTED and st.message == "prepared, but no rank has started"


def test_a_truncated_metrics_line_is_skipped_and_named(tmp_path):
    paths = make_run(tmp_path / "m", max_steps=20, steps=10, status=RunStatus(state=State.RUNNING, time=NOW),
                     attempts=[attempt(host="elsewhere")])
    with open(paths.metrics, "a") as f:
        f.write('{"step": 11, "loss": 4.')  # cut by a kill
    st = model_status("m", paths.root, now=NOW)
    assert st.step == 10 and st.loss == pytest.approx(4.9)
    assert st.missing == ["metrics.jsonl: 1 damaged line skipped"]


def test_no_metrics_yet_is_named(tmp_path):
    paths = make_run(tmp_path / "m", status=RunStatus(state=State.RUNNING, time=NOW), attempts=[attempt(host="x")])
    st = model_status("m", paths.root, now=NOW)
    assert st.state == RUNNING and st.step == 0 and st.loss is None and "metrics.jsonl: no rows yet" in st.missing


def test_a_damaged_status_json_is_named_and_the_usage_record_decides(tmp_path):
    paths = make_run(tmp_path / "m", steps=4, attempts=[attempt(pid=dead_pid())])
    paths.status.write_text('{"state": "COMPL')
    st = model_status("m", paths.root, now=NOW, host=HOST)
    assert "status.json: damaged" in st.missing
    assert st.state == FAILED and "is gone without a final state" in st.message  # usage.json says RUNNING, pid gone
    paths.usage.write_text("not json")  # damaged too: the run's output is all that is left
    st = model_status("m", paths.root, now=NOW)
    assert st.state == RUNNING and st.step == 4 and st.gpu_hours is None
    assert "usage.json: damaged or empty" in st.missing and st.message.startswith("assumed running")


def test_a_damaged_config_falls_back_to_the_projects_max_steps(tmp_path):
    paths = make_run(tmp_path / "m", steps=2, status=RunStatus(state=State.COMPLETED, step=2, time=NOW))
    paths.config.write_text("models: [\n")
    st = model_status("m", paths.root, max_steps=77, now=NOW)
    assert st.max_steps == 77 and any(m.startswith("config.yaml") for m in st.missing)


# -- Slurm jobs ----------------------------------------------------------------------------------------------------


def test_a_pending_job_is_queued(tmp_path):
    paths = make_run(tmp_path / "m")
    job = JobStatus("4242", State.PENDING, None, "PENDING (Resources)", {"restarts": 0, "nodes": []})
    st = model_status("m", paths.root, job, now=NOW)
    assert (st.state, st.job_id, st.job_state, st.job_detail, st.backend) == (QUEUED, "4242", "PENDING",
                                                                              "PENDING (Resources)", "slurm")
    assert st.missing == [] and st.eta_s is None and st.gpu_hours is None


def test_a_restarted_job_is_requeued_running_or_pending(tmp_path):
    paths = make_run(tmp_path / "m", max_steps=100, steps=30, step_time=2.0,
                     attempts=[attempt(job_id="77", nodes=["n1", "n2"], ended=None, last=NOW - 900, started=NOW - 1800),
                               attempt(job_id="77", nodes=["n3", "n4"], started=NOW - 600, last=NOW - 5, host="n3")])
    running = JobStatus("77", State.RUNNING, None, "RUNNING", {"restarts": 1, "nodes": ["n3", "n4"]})
    st = model_status("m", paths.root, running, now=NOW)
    assert (st.state, st.restarts, st.nodes, st.eta_s) == (REQUEUED, 1, ["n3", "n4"], 70 * 2.0)
    assert st.gpu_hours == pytest.approx((900 + 600) / 3600 * 8)  # the killed attempt to its last sign, this one to now
    pending = JobStatus("77", State.PENDING, None, "PENDING (BeginTime)", {"restarts": 2, "nodes": []})
    assert model_status("m", paths.root, pending, now=NOW).state == REQUEUED


def test_ended_jobs_cancelled_timeout_and_forgotten(tmp_path):
    paths = make_run(tmp_path / "m", steps=3, status=RunStatus(state=State.RUNNING, time=NOW),
                     attempts=[attempt(job_id="5", ended=NOW, last=NOW)])
    cancelled = model_status("m", paths.root, JobStatus("5", State.CANCELLED, 143, "CANCELLED", {"restarts": 0}))
    assert (cancelled.state, cancelled.exit_code, cancelled.job_state) == (FAILED, 143, "CANCELLED")
    assert cancelled.message == "job 5 CANCELLED, exit 143"
    timeout = model_status("m", paths.root, JobStatus("6", State.FAILED, 1, "TIMEOUT", {"slurm_state": "TIMEOUT"}))
    assert timeout.state == FAILED and "TIMEOUT" in timeout.message
    write_status_record(paths, RunStatus(state=State.COMPLETED, step=3, time=NOW))
    forgotten = JobStatus("7", State.FAILED, None, "FAILED (ended without an end marker: ...)", {"source": "run-dir"})
    st = model_status("m", paths.root, forgotten)
    assert st.state == COMPLETED and st.job_state is None and st.job_id == "7"
    assert st.missing == ["job end state: Slurm forgot the job and it left no end marker"]


def test_a_job_slurm_cannot_be_asked_about_leaves_the_run_directory_to_judge(tmp_path):
    paths = make_run(tmp_path / "m", steps=3, status=RunStatus(state=State.COMPLETED, step=3, time=NOW))
    job = JobStatus("8", State.UNKNOWN, None, "`scontrol` not found: install the Slurm client", {})
    st = model_status("m", paths.root, job)
    assert st.state == COMPLETED and st.job_id == "8"
    assert st.missing == ["job 8: `scontrol` not found: install the Slurm client",
                          "usage.json: none (GPU-hours and cost unknown)"]  # a run from before usage.json


# -- cost, alarms, output ------------------------------------------------------------------------------------------


def test_cost_from_the_flagship_plan_price(tmp_path):
    project = load_project(ROOT / "examples" / "p5e-80x7.yaml")
    prices = gpu_hour_prices(project)
    assert prices["model-1"] == pytest.approx(34.60 / 8) and prices["model-7"] == pytest.approx(34.60 / 8)
    paths = make_run(tmp_path / "model-1", max_steps=1000, steps=10, model="model-1",
                     status=RunStatus(state=State.COMPLETED, step=10, time=NOW),
                     attempts=[attempt(state=State.COMPLETED, gpus=80, started=NOW - 7200, ended=NOW)])
    [st, other] = project_status(project, [("model-1", paths.root), ("model-2", tmp_path / "model-2")], now=NOW)
    assert st.gpu_hours == pytest.approx(160.0) and st.cost_usd == pytest.approx(160.0 * 4.325)
    assert st.max_steps == 1000  # the run's config.yaml beats the project's
    assert other.state == NOT_STARTED and other.max_steps == project.model("model-2").training.max_steps
    assert gpu_hour_prices(load_project(ROOT / "examples" / "quickstart.yaml")) == {"tiny-gpt": None}  # CPUs: no price


def test_events_of_the_current_attempt_become_alarms_errors_first(tmp_path):
    paths = make_run(tmp_path / "m", steps=3, status=RunStatus(state=State.FAILED, message="non-finite loss", time=NOW),
                     attempts=[attempt(state=State.FAILED, started=NOW - 100, ended=NOW)])
    append_event(paths.events, Event(time=NOW - 500, kind="loss_spike", step=1, message="old attempt"))
    for i in range(3):
        append_event(paths.events, Event(time=NOW - 50 + i, kind="straggler", step=10 * i, rank=3, node="node-2",
                                         part="data", message="rank 3 slow in data"))
    append_event(paths.node_events("node-1"), Event(time=NOW - 40, kind="gpu_temperature", gpu=2, node="node-1",
                                                    value=91.0, message="GPU 2 at 91 C"))
    append_event(paths.events, Event(time=NOW - 30, kind="nonfinite", severity="error", step=12, message="loss nan"))
    with open(paths.events, "a") as f:
        f.write('{"time": 1795000000, "kind": "strag')  # cut line: skipped
    st = model_status("m", paths.root, now=NOW)
    assert st.alarms == ["non-finite at step 12: run stopped", "GPU 2 on node-1 hot (91 °C)",
                         "straggler rank 3 on node-2 (data) x3"]
    assert st.state == FAILED and st.message == "non-finite loss"
    assert alarms([Event(time=1, kind="new_kind", message="something a newer version records")]) == \
        ["new_kind: something a newer version records"]


def test_durations_read_like_a_clock():
    assert [human_duration(s) for s in (None, 0, 45, 187, 7500, 3 * 86400 + 4 * 3600)] == \
        ["-", "0s", "45s", "3m 07s", "2h 05m", "3d 04h"]


def test_json_and_table_show_every_model(tmp_path):
    done = make_run(tmp_path / "a", max_steps=10, steps=10, ckpt=10, model="alpha",
                    status=RunStatus(state=State.COMPLETED, step=10, time=NOW))
    rows = [model_status("alpha", done.root, now=NOW, price_per_gpu_hour=1.0),
            model_status("beta", tmp_path / "b", max_steps=5)]
    data = json.loads(status_json(rows))
    assert [(d["model"], d["state"], d["run_dir"]) for d in data] == [("alpha", COMPLETED, str(done.root)),
                                                                      ("beta", NOT_STARTED, str(tmp_path / "b"))]
    assert set(data[0]) >= {"step", "max_steps", "loss", "tokens_per_s", "mfu", "eta_s", "gpu_hours", "cost_usd",
                            "checkpoint", "checkpoint_age_s", "job_id", "nodes", "alarms", "missing"}
    console = Console(record=True, width=200)
    console.print(status_view(rows))
    text = console.export_text()
    assert "alpha" in text and "completed" in text and "10/10" in text and "step_00000010 (2m 05s)" in text
    assert "beta" in text and "not started" in text and "-/5" in text
    assert "alpha: missing: usage.json: none (GPU-hours and cost unknown)" in text
    narrow = Console(record=True, width=70)
    narrow.print(status_view(rows, 70))
    text = narrow.export_text()
    assert "alpha" in text and "completed" in text and "10/10" in text and "not shown at this width: MFU" in text
    assert max(len(line) for line in text.splitlines()) <= 70


# -- the command ---------------------------------------------------------------------------------------------------


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    out, err = capsys.readouterr()
    return done.value.code, out, err


def test_cli_exit_codes(tmp_path, capsys):
    project = tiny_project(tmp_path)
    run = tmp_path / "runs" / "tiny" / "tiny"
    code, out, err = run_main(["status", str(project), "--json"], capsys)
    assert code == 0 and json.loads(out)[0]["state"] == NOT_STARTED, err
    make_run(run, model="tiny", steps=1, status=RunStatus(state=State.COMPLETED, step=1, time=NOW))
    code, out, _ = run_main(["status", str(project)], capsys)
    assert code == 0 and "completed" in out and "tiny" in out
    write_status_record(RunPaths(run), RunStatus(state=State.FAILED, step=1, message="rank 1 exited with code 1"))
    code, out, _ = run_main(["status", str(project)], capsys)
    assert code == 1 and "failed" in out and "rank 1 exited with code 1" in out
    code, out, err = run_main(["status", str(tmp_path / "missing.yaml")], capsys)
    assert code == 2 and err.startswith("error: ") and "missing.yaml" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(["status", str(project), "--model", "nope"], capsys)
    assert code == 2 and "no model named 'nope'" in err


def test_watch_refreshes_until_ctrl_c_and_exits_per_the_last_refresh(tmp_path):
    """--watch as a user runs it: refreshes every --interval, Ctrl-C (SIGINT) ends it without a traceback, and the
    exit code is the last refresh's (1: the model failed meanwhile)."""
    import os
    import signal

    project = tiny_project(tmp_path)
    run = tmp_path / "runs" / "tiny" / "tiny"
    make_run(run, model="tiny", steps=1, status=RunStatus(state=State.COMPLETED, step=1, time=NOW))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for extra, expect in ((["--json"], "json"), ([], "table")):
        proc = subprocess.Popen([sys.executable, "-m", "clustertrain", "status", str(project), "--watch", "--interval",
                                 "0.5", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            if expect == "json":
                first = json.loads(proc.stdout.readline())
                assert first[0]["state"] == COMPLETED
                write_status_record(RunPaths(run), RunStatus(state=State.FAILED, step=1, message="boom"))
                second = json.loads(proc.stdout.readline())
                while second[0]["state"] != FAILED:  # a refresh may have read the file just before it changed
                    second = json.loads(proc.stdout.readline())
                assert second[0]["message"] == "boom"
            else:
                time.sleep(2.5)  # a few refreshes
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
        assert proc.returncode == 1 and "Traceback" not in err, err  # the last refresh saw the failure
        if expect == "table":
            assert "tiny" in out and "failed" in out and "boom" in out
