"""The run's own records (clustertrain.core.run_events): lenient readers over what a kill can leave behind."""

from __future__ import annotations

import json

from clustertrain.core.run_events import Attempt, Event, append_event, read_events, read_timing, read_usage, write_usage
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.states import State


def test_events_of_rank_0_and_every_sampler_read_together_oldest_first(tmp_path):
    paths = RunPaths(tmp_path)
    append_event(paths.events, Event(time=30.0, kind="loss_spike", step=9, message="spike"))
    append_event(paths.node_events("node-2"), Event(time=10.0, kind="gpu_xid", severity="error", gpu=3, node="node-2",
                                                    message="XID 79"))
    append_event(paths.node_events("node 1/x"), Event(time=20.0, kind="gpu_temperature", gpu=0, message="hot"))
    with open(paths.events, "a") as f:
        f.write('{"version": 1, "time": 40.0, "kind": "strag')  # cut by a kill
    assert [(e.time, e.kind) for e in read_events(paths)] == [(10.0, "gpu_xid"), (20.0, "gpu_temperature"),
                                                              (30.0, "loss_spike")]
    assert paths.node_events("node 1/x").name == "node_1_x.events.jsonl"


def test_timing_by_rank_keeps_the_later_row_of_a_step_logged_twice(tmp_path):
    paths = RunPaths(tmp_path)
    paths.timing.mkdir()
    row = {"step": 1, "steps": 1, "rank": 1, "node": "n", "data_s": 0.1, "compute_s": 0.2, "comm_s": 0.0,
           "step_s": 0.3, "time": 1.0}
    lines = [row, {**row, "step": 2}, {**row, "step": 2, "data_s": 0.5}, "garbage"]
    paths.rank_timing(1).write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines) + "\n")
    timing = read_timing(paths)
    assert list(timing) == [1] and [(r.step, r.data_s) for r in timing[1]] == [(1, 0.1), (2, 0.5)]
    assert read_timing(RunPaths(tmp_path / "none")) == {}


def test_usage_adds_up_gpu_hours_across_attempts(tmp_path):
    paths = RunPaths(tmp_path)
    killed = Attempt(started=0.0, last=1800.0, state=State.RUNNING, gpus=16)       # SIGKILL: its last heartbeat
    stopped = Attempt(started=3600.0, last=7200.0, ended=7200.0, state=State.STOPPED, gpus=16)
    running = Attempt(started=10000.0, last=10100.0, state=State.RUNNING, gpus=8)
    usage = read_usage(paths)
    usage.attempts += [killed, stopped, running]
    write_usage(paths, usage)
    back = read_usage(paths).attempts
    assert [a.gpu_hours(now=13600.0, alive=False) for a in back] == [8.0, 16.0, 8 * 100 / 3600]
    assert back[2].gpu_hours(now=13600.0) == 8.0  # a running attempt counts to now
    paths.usage.write_text("{not json")
    assert read_usage(paths).attempts == []
