"""`clustertrain status` rows from synthesized run directories in the documented formats (core/run_events.py, core/run_records.py,
core/checkpoint_format.py, core/job_records.py): states, figures, cost from the plan's price, alarms, damaged files, the CLI's
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
from clustertrain.core.run_events import Attempt, Event, Usage, append_event, write_usage
from clustertrain.monitor.status import (COMPLETED, FAILED, NOT_STARTED, QUEUED, REQUEUED, RUNNING, alarms, any_failed,
                                         gpu_hour_prices, human_duration, model_status, project_status)
from clustertrain.monitor.status_view import status_json, status_view
from clustertrain.resolve import load_project
from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.core.run_records import RunInfo, RunStatus, write_record, write_status_record
from clustertrain.core.states import State
from clustertrain.core.checkpoint_format import CheckpointMeta
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
    assert (cancelled.state, cancelled.exit_code, cancelled.job_state) == ("cancelled", 143, "CANCELLED")
    assert cancelled.message == "job 5 CANCELLED, exit 143; submit again to resume" and any_failed([cancelled])
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


# -- goodput, incidents, preemption saves, suspect nodes ----------------------------------------------------------


def two_attempts() -> list[Attempt]:
    """A failed attempt (its last 400 s after the checkpoint lost), then a completed one, on 2 nodes each."""
    return [attempt(allocated=NOW - 3700, started=NOW - 3600, first_step=NOW - 3500, saved_at=NOW - 2000,
                    last=NOW - 1600, ended=NOW - 1600, state=State.FAILED, nodes=["n1", "n2"]),
            attempt(allocated=NOW - 1000, started=NOW - 990, first_step=NOW - 900, stall_s=50, last=NOW - 100,
                    ended=NOW - 100, state=State.COMPLETED, nodes=["n1", "n2"])]


def test_goodput_and_restarts_over_every_attempt_in_the_row_its_json_and_the_table(tmp_path):
    paths = make_run(tmp_path / "m", steps=30, status=RunStatus(state=State.COMPLETED, step=30, time=NOW),
                     attempts=two_attempts())
    st = model_status("m", paths.root, now=NOW)
    assert st.state == COMPLETED and st.restarts == 1
    g = st.goodput
    assert [(a.overhead_s, a.lost_s, a.stall_s, a.productive_s, a.idle_s) for a in g.attempts] == \
        [(200, 400, 0, 1500, 0), (100, 0, 50, 750, 0)]
    assert g.percent == pytest.approx(75.0) and g.allocated_h == pytest.approx(3000 * 2 / 3600)
    data = json.loads(status_json([st]))[0]
    assert data["restarts"] == 1 and data["goodput"]["percent"] == pytest.approx(75.0)
    assert [(a["state"], a["lost_s"], a["nodes"]) for a in data["goodput"]["attempts"]] == \
        [("FAILED", 400, 2), ("COMPLETED", 0, 2)]
    console = Console(record=True, width=220)
    console.print(status_view([st], now=NOW))
    text = console.export_text()
    assert "goodput" in text and "75.0%" in text and "(restart 1)" in text
    assert "project goodput" not in text  # one model: its row says it


def write_incident(paths: RunPaths, stamp: str, t: float, kind: str = "hang", message: str = "") -> Path:
    where = paths.incidents / stamp
    where.mkdir(parents=True)
    write_atomic(where / "incident.json", json.dumps({
        "version": 1, "id": stamp, "time": t, "kind": kind, "job": "local-1", "step": 7, "phase": "collective",
        "message": message or f"rank 1 on node2 is stuck in collective of step 7 for 41 s ({stamp})",
        "ranks": [1], "nodes": ["node2"], "waited_s": 41.2, "bound_s": 30.0, "stacks": ["stacks/rank0.txt"],
        "missing_stacks": [1], "flight": []}))
    return where


def test_the_newest_incident_of_the_current_attempt_is_shown_with_its_directory(tmp_path):
    paths = make_run(tmp_path / "m", steps=3, status=RunStatus(state=State.FAILED, time=NOW, message="hang"),
                     attempts=[attempt(started=NOW - 3600, ended=NOW, state=State.FAILED)])
    write_incident(paths, "20261123-000000", NOW - 9000)  # an earlier attempt's
    newest = write_incident(paths, "20261123-101112", NOW - 50, message="rank 1 on node2 is stuck\n in collective")
    (paths.incidents / "20261123-222222").mkdir()
    (paths.incidents / "20261123-222222" / "incident.json").write_text('{"time": ')  # cut: skipped
    st = model_status("m", paths.root, now=NOW)
    assert st.incident == {"kind": "hang", "message": "rank 1 on node2 is stuck in collective", "time": NOW - 50,
                           "dir": str(newest)}
    console = Console(record=True, width=250)
    console.print(status_view([st], now=NOW))
    assert f"m: hang: rank 1 on node2 is stuck in collective (incident: {newest})" in console.export_text()
    write_usage(paths, Usage(attempts=[attempt(started=NOW - 3600, ended=NOW - 40, state=State.FAILED),
                                       attempt(started=NOW - 10, ended=NOW, state=State.COMPLETED)]))
    assert model_status("m", paths.root, now=NOW).incident is None  # the attempt running now, or the last, had none


def test_the_last_preemption_save_landed_late_or_not_at_all():
    from clustertrain.monitor.resilience import DID_NOT_LAND, preempt_line

    stop = Event(time=NOW - 100, kind="stop_signal", step=40, message="SIGUSR2 asked the ranks to save and stop")
    saved = Event(time=NOW - 88, kind="preempt_save", step=40, value=12.3, threshold=300.0, message="landed")
    stopped = [attempt(started=NOW - 3600, ended=NOW - 80, state=State.STOPPED)]
    assert preempt_line([stop, saved], stopped, live=False) == "landed in 12.3 s of 300 s"
    late = saved.model_copy(update={"value": 320.0})
    assert preempt_line([stop, late], stopped, False) == \
        "committed 320.0 s after the signal, later than the 300 s it gave"
    assert preempt_line([stop, saved.model_copy(update={"threshold": None})], stopped, False) == "landed in 12.3 s"
    assert preempt_line([], stopped, False) is None
    assert preempt_line([stop], stopped, False) is None  # it ended normally and no save was asked of it
    # a second start got the signal and was killed before its checkpoint was committed
    again = Event(time=NOW - 30, kind="stop_signal", step=55, message="SIGTERM asked the ranks to save and stop")
    killed = [*stopped, attempt(started=NOW - 60, last=NOW - 25)]  # RUNNING, never ended
    assert preempt_line([stop, saved, again], killed, live=False) == DID_NOT_LAND
    assert preempt_line([stop, saved, again], killed, live=True) == \
        "saving since the stop signal at step 55: not committed yet"


def test_a_killed_attempt_whose_stop_save_never_landed_is_said_in_red(tmp_path):
    paths = make_run(tmp_path / "m", steps=3, status=RunStatus(state=State.RUNNING, time=NOW - 3600),
                     attempts=[attempt(pid=dead_pid(), last=NOW - 500)])
    append_event(paths.events, Event(time=NOW - 510, kind="stop_signal", step=3, message="SIGTERM: save and stop"))
    append_event(paths.events, Event(time=NOW - 900, kind="checkpoint", step=2, value=0.5, message="committed"))
    st = model_status("m", paths.root, now=NOW, host=HOST)
    assert st.state == FAILED and st.preempt_save.startswith("did not land: the job was killed before")
    assert st.alarms == []  # records, not alarms
    console = Console(record=True, width=250)
    console.print(status_view([st], now=NOW))
    assert "m: last preemption save did not land: the job was killed before the checkpoint was committed" in \
        console.export_text()


def test_the_watchdogs_events_are_alarms_and_records_are_not():
    events = [Event(time=1, kind="checkpoint", step=5, value=0.1, message="checkpoint step_00000005 committed"),
              Event(time=2, kind="rank_lost", severity="error", step=9, rank=2, node="node3", message="lost"),
              Event(time=3, kind="hang", severity="error", step=7, rank=1, node="node2", message="stuck"),
              Event(time=4, kind="node_suspect", node="node2", message="node2 on the list"),
              Event(time=5, kind="stop_signal", step=9, message="SIGTERM"),
              Event(time=6, kind="preempt_save", step=9, value=1.0, message="landed")]
    assert alarms(events) == ["hang at step 7: rank 1 on node2", "rank 2 lost on node3 at step 9", "node2 suspect"]


TWO_MODELS = """name: two
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: 1}}
storage: {{root: {root}}}
models:
  - {{name: a, model: {{layers: 2, hidden: 64, heads: 4, seq_len: 32}}, training: {{max_steps: 30}}}}
  - {{name: b, model: {{layers: 2, hidden: 64, heads: 4, seq_len: 32}}, training: {{max_steps: 30}}}}
"""


def test_the_projects_suspect_nodes_and_goodput_are_said_once(tmp_path, capsys):
    from clustertrain.core.storage_layout import storage_layout
    from clustertrain.monitor.suspects import add_suspect, clear_suspects

    path = tmp_path / "two.yaml"
    path.write_text(TWO_MODELS.format(root=tmp_path / "runs"))
    project = load_project(path)
    suspects = storage_layout(project).suspects_file()
    add_suspect(suspects, "node2", source="hang", reason="rank 1 stuck in collective", ttl_h=24, job="42", model="a",
                now=NOW - 3600)
    add_suspect(suspects, "node3", source="crash", reason="killed", ttl_h=24, now=NOW - 3000)
    add_suspect(suspects, "node4", source="manual", reason="old", ttl_h=1, now=NOW - 7200)  # expired
    clear_suspects(suspects, ["node3"], now=NOW - 100)
    runs = [(m, tmp_path / "runs" / "two" / m) for m in ("a", "b")]
    for _, root in runs:
        make_run(root, steps=30, status=RunStatus(state=State.COMPLETED, step=30, time=NOW), attempts=two_attempts())
    rows = project_status(project, runs, now=NOW, prices={})
    assert [[s["node"] for s in r.suspects] for r in rows] == [["node2"], ["node2"]]
    assert rows[0].suspects[0]["source"] == "hang" and rows[0].suspects[0]["job"] == "42"
    console = Console(record=True, width=250)
    console.print(status_view(rows, now=NOW))
    text = console.export_text()
    assert text.count("suspect nodes") == 1 and "node2 (hang, 23h 00m left): rank 1 stuck in collective" in text
    assert "node3" not in text and "node4" not in text
    assert text.count("project goodput: 75.0% of 3.33 node-h (lost 0.44, overhead 0.33, idle 0.00, stalls 0.06); "
                      "2 restarts") == 1
    capsys.readouterr()
    add_suspect(suspects, "node5", source="rank_lost", reason="rank 3 lost", ttl_h=1)  # active now (the others: at NOW)
    code, out, err = run_main(["status", str(path), "--json"], capsys)  # the command: every row carries the list
    assert code == 0, err
    assert [[s["node"] for s in r["suspects"]] for r in json.loads(out)] == [["node5"], ["node5"]]


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
