"""Goodput of a REAL local run (clustertrain.monitor.goodput): two gloo ranks train past a checkpoint, rank 0 fails a
few steps later (CLUSTERTRAIN_INJECT_FAILURE), the same command resumes to completion. What the trainer and the
launcher recorded (usage.json: allocated, first_step, stall_s, saved_step/saved_at) accounts for each attempt's
allocated time exactly; the failed attempt lost the steps after its checkpoint, the completed one nothing; `status
--json` and `report` show it."""

from __future__ import annotations

import json

import pytest

from clustertrain.monitor.goodput import PARTS
from clustertrain.core.run_events import read_usage
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.states import State

from tests.support.training import run_cli

pytestmark = pytest.mark.slow
PROJECT = """name: gp
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: 2, threads_per_worker: 1}}
storage: {{root: {root}}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 12, micro_batch: 4, global_batch: 16, lr: 3.0e-3, checkpoint_every: 3, keep_last: 2,
               log_every: 1, seed: 7}}
"""


def test_a_failed_then_resumed_run_accounts_for_every_allocated_second(tmp_path):
    project = tmp_path / "gp.yaml"
    project.write_text(PROJECT.format(root=json.dumps(str(tmp_path / "fsx"))))
    run_dir = tmp_path / "run"
    where = ["--run-dir", str(run_dir)]
    failed = run_cli("run", str(project), *where, env={"CLUSTERTRAIN_INJECT_FAILURE": "0:9"}, timeout=180)
    assert failed.returncode == 1 and "injected failure at step 9" in failed.stdout, failed.stdout[-3000:]
    done = run_cli("run", str(project), *where, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:]

    first, second = read_usage(RunPaths(run_dir)).attempts  # what the run recorded
    assert (first.state, first.step, second.state, second.step) == (State.FAILED, 8, State.COMPLETED, 12)
    assert first.saved_step in (3, 6) and second.step_start == first.saved_step  # resumed from its last commit
    for a in (first, second):
        assert a.allocated is not None and a.allocated <= a.started <= a.first_step <= a.last

    shown = run_cli("status", str(project), *where, "--json")
    assert shown.returncode == 0, shown.stdout[-3000:]
    (row,) = json.loads(shown.stdout)
    goodput = row["goodput"]
    assert row["restarts"] == 1 and len(goodput["attempts"]) == 2
    lost, completed = goodput["attempts"]
    for part, a in zip(goodput["attempts"], (first, second)):
        assert (part["start"], part["end"]) == (a.allocated, a.ended)  # allocated time: its allocation -> its end
        assert sum(part[f"{p}_s"] for p in PARTS) == pytest.approx(part["end"] - part["start"], abs=1e-6), part
        assert part["overhead_s"] > 0 and part["productive_s"] >= 0 and part["queue_s"] is None  # local: no queue
    # the failed attempt may have no productive time left: when the asynchronous save of step 6 had not committed
    # before the failure, its 5 lost steps x the last (slow) step's time can cover all it trained (goodput.py's rule)
    assert completed["productive_s"] > 0
    assert lost["lost_s"] > 0 and lost["lost_steps"] == 8 - first.saved_step
    # from the commit to the failure, or (an asynchronous save committed while steps 7-8 trained) at least those steps
    since_commit, steps = first.ended - first.saved_at, lost["lost_steps"] * first.step_time_s
    assert lost["lost_s"] == pytest.approx(min(first.ended - first.first_step, max(since_commit, steps)), abs=1e-6)
    assert completed["lost_s"] == 0 and completed["lost_steps"] == 0
    assert completed["stall_s"] > 0  # the last checkpoint is saved synchronously: training waits for it
    assert 0 < goodput["percent"] < 100
    print("goodput of the two attempts:", json.dumps(goodput, indent=1))

    report = run_cli("report", str(run_dir))
    assert report.returncode == 0, report.stdout
    html = (run_dir / "report.html").read_text()
    assert 'data-plot="goodput"' in html and "<td>failed</td>" in html and "<td>completed</td>" in html
