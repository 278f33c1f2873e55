"""The goodput account (clustertrain.monitor.goodput) over synthetic usage.json attempts in the documented format: an
attempt that failed after a checkpoint, one killed without an end, a completed one, a running one; each attempt's
parts add up to its allocated time exactly, and the queue wait is shown beside it, never counted in it."""

from __future__ import annotations

import json

import pytest

from clustertrain.monitor.goodput import PARTS, Goodput, JobTimes, account, read_job_times, run_goodput
from clustertrain.core.run_events import Attempt, Event
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.states import State

T = 1_795_000_000.0


def attempt(**kw) -> Attempt:
    base = dict(started=T, last=T, nodes=["n1", "n2"], gpus=16, job_id="42")
    return Attempt(**{**base, **kw})


def parts(a) -> dict[str, float]:
    return {p: round(a.part_s(p), 6) for p in PARTS}


def assert_exact(g: Goodput) -> None:
    for a in g.attempts:
        assert sum(a.part_s(p) for p in PARTS) == pytest.approx(a.allocated_s, abs=1e-9), a
        assert all(a.part_s(p) >= 0 for p in PARTS), a
    assert sum(g.hours(p) for p in PARTS) == pytest.approx(g.allocated_h, abs=1e-12)


FAILED = attempt(allocated=T - 10, started=T, first_step=T + 30, stall_s=5, saved_step=20, saved_at=T + 100,
                 step_start=0, step=27, last=T + 150, ended=T + 150, state=State.FAILED)
KILLED = attempt(allocated=T + 400, started=T + 405, first_step=T + 420, saved_step=30, saved_at=T + 450,
                 step_start=20, step=36, last=T + 480, state=State.RUNNING)  # no end: SIGKILL, node gone
COMPLETED = attempt(job_id="43", allocated=T + 1000, started=T + 1002, first_step=T + 1010, stall_s=10,
                    saved_step=50, saved_at=T + 1100, step_start=30, step=50, last=T + 1100, ended=T + 1100,
                    state=State.COMPLETED)


def test_each_kind_of_attempt_splits_its_allocated_time_exactly():
    jobs = {"42": JobTimes("42", T - 100), "43": JobTimes("43", T + 900)}
    g = account([FAILED, KILLED, COMPLETED], now=T + 5000, jobs=jobs, signs=[T + 510])  # the watchdog's hang event
    assert_exact(g)
    failed, killed, completed = g.attempts
    # failed after its step-20 checkpoint: start-up 40 s, the 50 s after the checkpoint lost, 5 s stalled saving
    assert failed.allocated_s == 160 and parts(failed) == {"productive": 65, "overhead": 40, "stall": 5, "lost": 50,
                                                           "idle": 0}
    assert (failed.outcome, failed.lost_steps, failed.queue_s) == ("failed", 7, 90)
    # killed without an end: counted to the watchdog's last event, the 30 s after the last heartbeat are idle
    assert killed.end == T + 510 and parts(killed) == {"productive": 30, "overhead": 20, "stall": 0, "lost": 30,
                                                       "idle": 30}
    assert (killed.outcome, killed.lost_steps) == ("killed", 6)
    assert killed.queue_s == 400 - 150  # a requeue of job 42: from its previous attempt's end
    # completed: nothing lost, nothing idle
    assert parts(completed) == {"productive": 80, "overhead": 10, "stall": 10, "lost": 0, "idle": 0}
    assert (completed.outcome, completed.lost_steps, completed.queue_s) == ("completed", 0, 100)
    # node-hours (2 nodes each), the queue wait beside them, not in them
    assert g.allocated_h == pytest.approx((160 + 110 + 100) * 2 / 3600)
    assert g.productive_h == pytest.approx((65 + 30 + 80) * 2 / 3600) and g.lost_h == pytest.approx(80 * 2 / 3600)
    assert g.percent == pytest.approx(175 / 370 * 100) and g.restarts == 2
    assert g.queue_s == 90 + 250 + 100


def test_a_running_attempt_counts_to_now_and_has_lost_nothing_yet():
    running = attempt(allocated=T - 20, started=T, first_step=T + 10, stall_s=4, saved_at=T + 40, last=T + 55)
    g = account([running], now=T + 80, live=True)
    assert_exact(g)
    (a,) = g.attempts
    assert a.running and a.outcome == "running" and a.end == T + 80
    assert parts(a) == {"productive": 66, "overhead": 30, "stall": 4, "lost": 0, "idle": 0}
    # the same record when its rank 0 is gone (not live): it ends at its last heartbeat and lost what followed the save
    dead = account([running], now=T + 80, live=False).attempts[0]
    assert dead.end == T + 55 and dead.outcome == "killed"
    assert parts(dead) == {"productive": 26, "overhead": 30, "stall": 4, "lost": 15, "idle": 0}


def test_an_attempt_that_never_finished_a_step_is_all_overhead_and_old_records_start_at_started():
    never = attempt(started=T, last=T + 90, ended=T + 95, state=State.FAILED)  # no allocated, no first_step
    g = account([never], now=T + 1000)
    assert_exact(g)
    assert parts(g.attempts[0]) == {"productive": 0, "overhead": 95, "stall": 0, "lost": 0, "idle": 0}
    assert g.percent == 0 and g.queue_s is None and g.restarts == 0


def test_a_failure_before_any_checkpoint_loses_everything_after_the_first_step():
    a = attempt(allocated=T, started=T, first_step=T + 10, stall_s=3, last=T + 70, ended=T + 70, state=State.FAILED)
    (split,) = account([a], now=T + 100).attempts
    assert parts(split) == {"productive": 0, "overhead": 10, "stall": 0, "lost": 60, "idle": 0}


def test_an_asynchronous_save_committed_just_before_the_failure_still_loses_the_steps_after_it():
    # step 20's save was committed at +99 while steps 21-25 trained (2 s each); the failure came at +100
    a = attempt(allocated=T, first_step=T + 10, step_start=0, step=25, saved_step=20, saved_at=T + 99,
                step_time_s=2.0, last=T + 100, ended=T + 100, state=State.FAILED)
    (split,) = account([a], now=T + 200).attempts
    assert split.lost_s == 10 and split.lost_steps == 5 and split.productive_s == 80
    greedy = a.model_copy(update={"step_time_s": 60.0})  # never more than the time trained
    (split,) = account([greedy], now=T + 200).attempts
    assert split.lost_s == 90 and split.productive_s == 0 and split.overhead_s == 10


def test_odd_records_are_clamped_and_still_add_up():
    # stalls longer than the time trained; a first step "before" the allocation; a save "after" the last heartbeat
    odd = attempt(allocated=T, started=T + 5, first_step=T - 50, stall_s=500, saved_at=T + 999, last=T + 40,
                  ended=T + 60, state=State.STOPPED)
    g = account([odd], now=T + 100)
    assert_exact(g)
    assert parts(g.attempts[0]) == {"productive": 0, "overhead": 0, "stall": 40, "lost": 0, "idle": 20}
    assert account([], now=T).percent is None


def test_a_stopped_attempt_loses_nothing_and_a_sign_after_the_next_allocation_is_not_its_own():
    stopped = attempt(allocated=T, first_step=T + 10, last=T + 50, ended=T + 52, state=State.STOPPED, saved_at=T + 20)
    killed = attempt(allocated=T + 100, started=T + 101, first_step=T + 110, last=T + 150)
    after = attempt(allocated=T + 200, started=T + 201, first_step=T + 210, last=T + 260, ended=T + 260,
                    state=State.COMPLETED)
    g = account([stopped, killed, after], now=T + 999, signs=[T + 120, T + 230])
    assert_exact(g)
    assert g.attempts[0].lost_s == 0 and g.attempts[0].idle_s == 2
    assert g.attempts[1].end == T + 150  # the sign at +120 is before its last heartbeat, the one at +230 not its own


def test_project_goodput_combines_the_runs():
    a = account([COMPLETED], now=T + 5000)
    b = account([FAILED, KILLED], now=T + 5000)
    total = Goodput.combine([a, b, None])
    assert total.allocated_h == pytest.approx(a.allocated_h + b.allocated_h)
    assert total.percent == pytest.approx((a.productive_h + b.productive_h) / total.allocated_h * 100)
    assert total.restarts == 1 and total.attempts == []


def test_run_goodput_reads_the_job_records_and_takes_the_watchdogs_events_as_signs(tmp_path):
    paths = RunPaths(tmp_path)
    paths.jobs.write_text(json.dumps({"version": 1, "job_id": "42", "model": "m", "job_name": "p-m", "script": "s",
                                      "output": "o", "submitted": T - 100, "ended": T + 700}) + "\n"
                          + '{"job_id": "43", "submitted": "yesterday"}\n{"job_id": "4')  # bad type, cut line
    assert list(read_job_times(paths)) == ["42"]
    assert run_goodput(paths, [], [], False, T) is None
    events = [Event(time=T + 600, kind="loss_spike", message="not a sign"),
              Event(time=T + 520, kind="hang", message="rank 1 stuck")]
    g = run_goodput(paths, [KILLED], events, False, T + 5000)
    assert g.attempts[0].end == T + 700  # the job's recorded end: the last attempt of job 42
    assert g.attempts[0].queue_s == 400 + 100
    requeued = attempt(allocated=T + 600, started=T + 601, first_step=T + 610, last=T + 650, ended=T + 650,
                       state=State.COMPLETED)
    g = run_goodput(paths, [KILLED, requeued], events, False, T + 5000)
    assert g.attempts[0].end == T + 520  # job 42's end belongs to its requeued attempt: only the hang counts
    assert_exact(g)
