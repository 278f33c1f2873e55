"""Status and events that tell the truth (issue 36, item 6): routine events are ``info`` and no alarm; a cancelled job
is ``cancelled``; a pending job shows Slurm's reason and no ETA; a Slurm run's restarts are its job's own count (the
batch script's ``restart N``), not every start of the ranks the run directory ever saw; ``run`` on a completed run
starts nothing. Run directories are written in the documented formats; Slurm jobs are handed in as the launch stage
builds them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from clustertrain.core.job_records import JobRecord, add_record, end_marker_path
from clustertrain.core.run_events import Attempt, Severity, Usage, read_events, write_usage
from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.core.run_records import RunInfo, RunStatus, write_record, write_status_record
from clustertrain.core.states import State
from clustertrain.launch.backend import JobStatus
from clustertrain.launch.run import completed_step, run_project
from clustertrain.launch.slurm import resubmissions_before
from clustertrain.monitor.config import MonitorConfig
from clustertrain.monitor.status import CANCELLED, QUEUED, REQUEUED, alarms, any_failed, model_status
from clustertrain.monitor.status_view import status_view
from clustertrain.project import architecture_fingerprint
from clustertrain.resolve import load_project
from clustertrain.train.run_recorder import GRACE_ENV, RunWatch
from tests.support.projects import tiny_project

ROOT = Path(__file__).resolve().parents[3]
NOW = 1_795_000_000.0


def make_run(root: Path, steps: int = 0, max_steps: int = 100, attempts: int = 0) -> RunPaths:
    paths = RunPaths(root)
    root.mkdir(parents=True, exist_ok=True)
    write_record(paths.run_json, RunInfo(project="p", model="m", fingerprint="f", dataset="d", created=NOW - 7200))
    write_atomic(paths.config, f"name: p\nmodels:\n  - name: m\n    training: {{max_steps: {max_steps}}}\n")
    if steps:
        paths.metrics.write_text("".join(
            f'{{"step": {s}, "loss": 3.0, "tokens_per_s": 1000.0, "mfu": 0.4, "step_time_s": 2.0, "time": {NOW}}}\n'
            for s in range(1, steps + 1)))
    if attempts:
        write_usage(paths, Usage(attempts=[Attempt(started=NOW - 3600 + i * 600, last=NOW - 3300 + i * 600, gpus=8,
                                                   job_id="77", nodes=["n1"], host="n1") for i in range(attempts)]))
    return paths


def table_text(rows) -> str:
    console = Console(record=True, width=260)
    console.print(status_view(rows, now=NOW))
    return console.export_text()


# -- events ---------------------------------------------------------------------------------------------------------


def test_checkpoints_stop_signals_and_landed_saves_are_info_and_no_alarm_a_late_save_is_a_warning(tmp_path, monkeypatch):
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir()
    watch = RunWatch(paths, MonitorConfig(), nodes=["n1"], gpus=1, world_size=1, step=0)
    watch.committed(4, paths.checkpoints / "step_00000004", save_s=0.5, stop_received=None)
    monkeypatch.setenv(GRACE_ENV, "300")
    watch.stop_signal(6, "SIGUSR2", time.time() - 2)
    watch.committed(6, paths.checkpoints / "step_00000006", save_s=0.5, stop_received=time.time() - 2)
    monkeypatch.setenv(GRACE_ENV, "1")
    watch.committed(8, paths.checkpoints / "step_00000008", save_s=0.5, stop_received=time.time() - 30)
    events = read_events(paths)  # by time: the stop signal came before the first checkpoint was committed
    assert sorted((e.step, e.kind, e.severity) for e in events) == [
        (4, "checkpoint", Severity.INFO), (6, "checkpoint", Severity.INFO), (6, "preempt_save", Severity.INFO),
        (6, "stop_signal", Severity.INFO), (8, "checkpoint", Severity.INFO), (8, "preempt_save", Severity.WARNING)]
    saves = [e.message for e in events if e.kind == "preempt_save"]
    assert "landed before the kill" in saves[0] and "later than the signal allowed" in saves[1]
    assert alarms(events) == []  # records, not alarms


def test_an_info_event_of_a_new_kind_is_no_alarm_but_a_warning_of_it_is(tmp_path):
    from clustertrain.core.run_events import Event

    events = [Event(time=1, kind="backup_done", severity="info", message="copied"),
              Event(time=2, kind="backup_slow", severity="warning", message="slow copy")]
    assert alarms(events) == ["backup_slow: slow copy"]


# -- states ---------------------------------------------------------------------------------------------------------


def test_a_cancelled_job_is_cancelled_not_failed_and_still_exits_1(tmp_path):
    paths = make_run(tmp_path / "m", steps=3, attempts=1)
    write_status_record(paths, RunStatus(state=State.STOPPED, step=3, time=NOW))
    st = model_status("m", paths.root, JobStatus("5", State.CANCELLED, 143, "CANCELLED", {"restarts": 0}), now=NOW)
    assert (st.state, st.job_state, st.message) == (CANCELLED, "CANCELLED",
                                                    "job 5 CANCELLED, exit 143; submit again to resume")
    assert any_failed([st])  # the exit status counts it, as documented
    text = table_text([st])
    assert "cancelled" in text and "failed" not in text
    never_ran = model_status("m", make_run(tmp_path / "q").root, JobStatus("6", State.CANCELLED, None, "CANCELLED", {}),
                             now=NOW)
    assert never_ran.state == CANCELLED and never_ran.message == "job 6 CANCELLED; submit again to start"
    # a cancelled job whose ranks had recorded a failure stays failed, with the ranks' reason
    write_status_record(paths, RunStatus(state=State.FAILED, step=3, time=NOW, message="non-finite loss at step 3"))
    failed = model_status("m", paths.root, JobStatus("5", State.CANCELLED, 143, "CANCELLED", {}), now=NOW)
    assert (failed.state, failed.message) == ("failed", "non-finite loss at step 3")


def test_a_queued_job_shows_slurms_reason_and_no_eta(tmp_path):
    paths = make_run(tmp_path / "m")
    job = JobStatus("4242", State.PENDING, None, "PENDING (Priority)", {"restarts": 0, "reason": "Priority"})
    st = model_status("m", paths.root, job, now=NOW)
    assert (st.state, st.pending_reason, st.eta_s) == (QUEUED, "Priority", None)
    assert "queued (Priority)" in table_text([st])
    # a JobStatus without extra["reason"] (an older launcher): the parenthesis of its detail
    st = model_status("m", paths.root, JobStatus("4242", State.PENDING, None, "PENDING (Resources)", {}), now=NOW)
    assert st.pending_reason == "Resources"
    st = model_status("m", paths.root, JobStatus("4242", State.PENDING, None, "PENDING", {}), now=NOW)
    assert st.pending_reason is None and "queued" in table_text([st])


def test_a_requeued_job_waiting_on_begintime_has_no_eta_until_its_ranks_run_again(tmp_path):
    paths = make_run(tmp_path / "m", steps=30, max_steps=100, attempts=1)
    pending = JobStatus("77", State.PENDING, None, "PENDING (BeginTime)", {"restarts": 1, "reason": "BeginTime"})
    st = model_status("m", paths.root, pending, now=NOW)
    assert (st.state, st.pending_reason, st.eta_s, st.step) == (REQUEUED, "BeginTime", None, 30)
    assert st.message == "restart 1: pending again (BeginTime)"
    text = table_text([st])
    assert "requeued (BeginTime)" in text and "2m 20s" not in text
    running = JobStatus("77", State.RUNNING, None, "RUNNING", {"restarts": 1, "nodes": ["n1"]})
    st = model_status("m", paths.root, running, now=NOW)
    assert (st.state, st.pending_reason, st.eta_s) == (REQUEUED, None, 70 * 2.0)


# -- restarts -------------------------------------------------------------------------------------------------------


def test_a_slurm_runs_restarts_are_its_jobs_count_not_every_start_the_run_directory_saw(tmp_path):
    paths = make_run(tmp_path / "m", steps=5, attempts=3)  # two earlier submissions of the same run directory
    fresh = JobStatus("77", State.RUNNING, None, "RUNNING", {"restarts": 0, "nodes": ["n1"]})
    st = model_status("m", paths.root, fresh, now=NOW)
    assert st.restarts == 0 and "(restart" not in table_text([st])  # its batch log says "restart 0 of at most 3"
    twice = JobStatus("77", State.RUNNING, None, "RUNNING", {"restarts": 2, "nodes": ["n1"]})
    st = model_status("m", paths.root, twice, now=NOW)
    assert st.restarts == 2 and "77 (restart 2)" in table_text([st])
    local = model_status("m", paths.root, None, now=NOW)  # a local run: its starts after the first (resumes)
    assert local.restarts == 2
    # a job Slurm cannot be asked about: what jobs.jsonl recorded for it
    add_record(paths, JobRecord(job_id="77", model="m", job_name="p-m", script="s", output="o", submitted=NOW,
                                restarts=1))
    unknown = model_status("m", paths.root, JobStatus("77", State.UNKNOWN, None, "not asked", {"error": "x"}), now=NOW)
    assert unknown.restarts == 1


def test_a_resubmitted_job_carries_on_its_predecessors_count(tmp_path):
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir()
    add_record(paths, JobRecord(job_id="41", model="m", job_name="p-m", script="s", output="o/p-m-41.out",
                                submitted=NOW))
    assert resubmissions_before(paths, "41") == 0
    end = end_marker_path(paths, "41")
    end.parent.mkdir(parents=True, exist_ok=True)
    # job 41 was requeued once (its RESTARTS=1), then failed and submitted job 42 with CLUSTERTRAIN_RESTARTS=2
    end.write_text("version=1\nstate=FAILED\nexit_code=1\nrestarts=1\nended=1795000100\nnext_job=42\n")
    assert resubmissions_before(paths, "42") == 2
    assert resubmissions_before(paths, "41") == 0 and resubmissions_before(paths, "43") == 0


def test_the_batch_script_counts_restarts_as_slurm_requeues_plus_resubmissions():
    """The line status's count is compared with: requeues (SLURM_RESTART_COUNT) + resubmissions (CLUSTERTRAIN_RESTARTS)."""
    text = (ROOT / "clustertrain/launch/templates/sbatch.sh.j2").read_text()
    assert 'RESTARTS=$(( ${SLURM_RESTART_COUNT:-0} + ${CLUSTERTRAIN_RESTARTS:-0} ))' in text
    assert 'echo "clustertrain: job $SLURM_JOB_ID (restart $RESTARTS: segment $SEGMENT of at most $MAX_SEGMENTS, ' in text
    assert "CLUSTERTRAIN_RESTARTS=$((RESTARTS + 1))" in text


# -- run on a completed run -----------------------------------------------------------------------------------------


def completed_run(tmp_path: Path, step: int = 1):
    path = tiny_project(tmp_path)
    project = load_project(path)
    run = tmp_path / "runs" / "done"
    paths = RunPaths(run)
    run.mkdir(parents=True)
    entry = project.models[0]
    write_record(paths.run_json, RunInfo(project=project.name, model=entry.name, dataset="d", created=NOW,
                                         fingerprint=architecture_fingerprint(project, entry)))
    write_status_record(paths, RunStatus(state=State.COMPLETED, step=step, time=NOW))  # and the COMPLETED marker
    return path, project, paths


def test_run_on_a_completed_run_says_so_and_writes_nothing(tmp_path):
    path, project, paths = completed_run(tmp_path)
    before = sorted(p.name for p in paths.root.iterdir())
    [outcome] = run_project(project, None, paths.root, resume=True, console=Console(file=open(os.devnull, "w")))
    assert outcome.already and (outcome.state, outcome.exit_code, outcome.step) == (State.COMPLETED, 0, 1)
    assert outcome.message == (f"tiny: already completed at step 1 ({paths.root}); nothing to do — raise "
                               "training.max_steps to train further, or --no-resume to start over")
    assert sorted(p.name for p in paths.root.iterdir()) == before == ["COMPLETED", "run.json", "status.json"]
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "run", str(path), "--run-dir", str(paths.root)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, outcome.message, ""), proc.stderr
    assert sorted(p.name for p in paths.root.iterdir()) == before


def test_a_completed_run_with_steps_left_or_without_its_marker_is_not_done(tmp_path):
    path, project, paths = completed_run(tmp_path)
    entry = project.models[0]
    assert completed_step(paths, project, entry) == 1
    raised = load_project(path, ["models.0.training.max_steps=5"])
    assert completed_step(paths, raised, raised.models[0]) is None  # max_steps raised: it trains further
    # another project's run, or another architecture: prepare_run's checks speak (one line, exit 2), not this
    other = load_project(path, ["name=other"])
    assert completed_step(paths, other, other.models[0]) is None
    wider = load_project(path, ["models.0.model.hidden=128"])
    assert completed_step(paths, wider, wider.models[0]) is None
    paths.completed.unlink()
    assert completed_step(paths, project, entry) is None  # the ranks started again since (mark_started)
    write_atomic(paths.completed, b"")
    paths.status.write_text("{damaged")
    assert completed_step(paths, project, entry) is None
