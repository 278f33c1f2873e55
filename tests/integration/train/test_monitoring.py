"""What a run records about itself while it trains (issue 17), on real gloo ranks: per-rank step timing and a
straggler named with its slow part, a non-finite loss that stops the run at its step, the run's own final state
and usage, and a node sampler whose crash leaves training alone."""

from __future__ import annotations

import json

import pytest

from clustertrain.core.run_events import read_events, read_timing, read_usage
from clustertrain.monitor.samples import read_samples
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import read_status
from clustertrain.core.states import State
from clustertrain.core.checkpoint_format import find_latest

from tests.support.training import metrics, run_cli

pytestmark = pytest.mark.slow


def test_a_rank_slow_in_its_data_path_is_named_a_straggler(tiny_project, tmp_path):
    project = tiny_project(steps=10, ckpt=10)
    run_dir = tmp_path / "run"
    res = run_cli("run", str(project), "--run-dir", str(run_dir), env={"CLUSTERTRAIN_INJECT_SLOW_DATA": "1:0.08"})
    assert res.returncode == 0, res.stdout
    paths = RunPaths(run_dir)
    timing = read_timing(paths)
    assert sorted(timing) == [0, 1] and [r.step for r in timing[1]] == list(range(1, 11))
    assert all(r.data_s >= 0.08 for r in timing[1]) and all(r.data_s < 0.04 for r in timing[0])
    stragglers = [e for e in read_events(paths) if e.kind == "straggler"]
    assert [(e.rank, e.part, e.step) for e in stragglers] == [(1, "data", 3)], stragglers
    assert stragglers[0].node == timing[1][0].node and "rank 1" in stragglers[0].message
    rows = metrics(run_dir)
    assert {(r["slowest_rank"], r["slowest_part"]) for r in rows[1:]} == {(1, "data")}
    # the spread is the ranks' own time (data + forward) max - min at that step; rank 1's 0.08 s of data dominates it,
    # but under load rank 0's forward can run long, so it is checked against the recorded parts, not a fixed floor
    own = {k: {r.step: r.data_s + r.forward_s for r in records} for k, records in timing.items()}
    for row in rows[1:]:
        at = [own[k][row["step"]] for k in (0, 1)]
        assert row["spread_s"] == pytest.approx(max(at) - min(at), abs=2e-3), (row, at)
    shown = run_cli("status", str(project), "--run-dir", str(run_dir), "--json")  # and `status` shows it
    assert shown.returncode == 0, shown.stdout
    (model,) = json.loads(shown.stdout)
    assert model["state"] == "completed" and f"straggler rank 1 on {stragglers[0].node} (data)" in model["alarms"]
    usage = read_usage(paths)
    assert [(a.state, a.step_start, a.step, a.world_size) for a in usage.attempts] == [(State.COMPLETED, 0, 10, 2)]
    assert usage.attempts[0].ended >= usage.attempts[0].started


def test_nan_at_step_k_stops_there_and_names_the_last_good_checkpoint(tiny_project, tmp_path):
    project = tiny_project(steps=20, ckpt=5)
    run_dir = tmp_path / "run"
    res = run_cli("run", str(project), "--run-dir", str(run_dir), env={"CLUSTERTRAIN_INJECT_NAN": "1:7"})
    assert res.returncode == 1, res.stdout
    last_good = run_dir / "checkpoints" / "step_00000005"
    errors = [line for line in res.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "non-finite gradient norm (nan) at step 7" in errors[0], res.stdout
    assert f"the last good checkpoint is {last_good} (step 5)" in errors[0]
    assert "Traceback" not in res.stdout
    assert find_latest(run_dir / "checkpoints") == last_good  # `latest` untouched
    assert not (run_dir / "checkpoints" / "step_00000007").exists()
    assert [r["step"] for r in metrics(run_dir)][-1] == 6
    paths = RunPaths(run_dir)
    status = read_status(paths)
    assert status.state == State.FAILED and "step 7" in status.message
    assert [(e.step, e.severity) for e in read_events(paths) if e.kind == "nonfinite"] == [(7, "error")]
    assert read_usage(paths).attempts[-1].state == State.FAILED


def test_a_crashed_sampler_leaves_training_alone(tiny_project, tmp_path):
    project = tiny_project(steps=30, ckpt=30)
    run_dir = tmp_path / "run"
    res = run_cli("run", str(project), "--run-dir", str(run_dir), "--set", "monitor.interval_s=0.2",
                  env={"CLUSTERTRAIN_SAMPLER_CRASH_AFTER": "2"})
    assert res.returncode == 0, res.stdout
    assert read_status(RunPaths(run_dir)).state == State.COMPLETED
    failed = [e for e in read_events(RunPaths(run_dir)) if e.kind == "sampler_failed"]
    assert len(failed) == 1, read_events(RunPaths(run_dir))
    csvs = list((run_dir / "monitor").glob("*.csv"))
    assert len(csvs) == 1 and len(read_samples(csvs[0])) == 2  # the rows before the crash, then nothing


def test_monitor_off_records_no_timing_and_runs_no_sampler(tiny_project, tmp_path):
    project = tiny_project(steps=4, ckpt=4)
    run_dir = tmp_path / "run"
    res = run_cli("run", str(project), "--run-dir", str(run_dir), "--set", "monitor.enabled=false")
    assert res.returncode == 0, res.stdout
    assert not (run_dir / "timing").exists() and not (run_dir / "monitor").exists()
    assert "slowest_rank" not in metrics(run_dir)[-1]
    assert read_status(RunPaths(run_dir)).state == State.COMPLETED

