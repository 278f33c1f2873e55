"""Per-part step timing (train/timing.py) on CPU: wall time per part, nested parts counted once, the version-2 row
read back by every reader (core/run_events.py), and version-1 rows still readable. CUDA events: tests/gpu/."""

from __future__ import annotations

import json
import time

import pytest

from clustertrain.core.run_events import PARTS, read_timing
from clustertrain.core.run_paths import RunPaths
from clustertrain.train.timing import StepTimer


def test_each_part_gets_its_own_time_and_a_nested_part_is_not_counted_twice(tmp_path):
    paths = RunPaths(tmp_path / "run")
    timer = StepTimer(3, "node-2", paths.rank_timing(3))
    for _ in range(2):
        t0 = time.perf_counter()
        with timer.part("forward"):
            time.sleep(0.02)
            with timer.part("data"):  # a batch read lazily inside the forward
                time.sleep(0.03)
        with timer.part("backward"):
            time.sleep(0.04)
        with timer.part("optimizer"):
            time.sleep(0.01)
        with timer.part("comm"):
            pass
        timer.end_step(time.perf_counter() - t0)
    data, forward, backward, optimizer, comm, step = timer.means()
    assert 0.03 <= data < 0.045 and 0.02 <= forward < 0.035  # the read is out of the forward
    assert 0.04 <= backward < 0.055 and 0.01 <= optimizer < 0.025 and comm < 0.005
    assert abs((data + forward + backward + optimizer + comm) - step) < 0.005  # the parts add up to the step
    timer.log(20)
    timer.close()
    row = json.loads(paths.rank_timing(3).read_text().splitlines()[0])
    assert row["version"] == 2 and row["steps"] == 2 and set(f"{p}_s" for p in PARTS) <= set(row)
    assert row["compute_s"] == pytest.approx(row["forward_s"] + row["backward_s"] + row["optimizer_s"], abs=2e-6)
    (back,) = read_timing(paths)[3]
    assert (back.step, back.node, back.backward_s) == (20, "node-2", row["backward_s"])


def test_a_logged_step_starts_a_new_interval():
    timer = StepTimer(0, "n", None)
    with timer.part("data"):
        time.sleep(0.01)
    timer.end_step(0.01)
    timer.log(1)
    assert timer.means() == [0.0] * 6


def test_an_unknown_part_is_refused():
    with pytest.raises(ValueError, match="'compute' is not one of data, forward, backward, optimizer, comm"):
        with StepTimer(0, "n", None).part("compute"):
            pass


def test_gather_on_one_rank_returns_its_own_means():
    timer = StepTimer(0, "n", None)
    with timer.part("backward"):
        time.sleep(0.01)
    timer.end_step(0.012)
    losses, timings = timer.gather(2.5, None, 1)
    assert losses == [2.5] and timings[0].backward_s >= 0.01 and timings[0].step_s == pytest.approx(0.012)
    assert timings[0].compute_s == pytest.approx(timings[0].forward_s + timings[0].backward_s + timings[0].optimizer_s)


def test_version_1_rows_still_read(tmp_path):
    """A row written before per-part timing (no version; compute held forward, backward and optimizer)."""
    paths = RunPaths(tmp_path / "run")
    paths.rank_timing(1).parent.mkdir(parents=True)
    paths.rank_timing(1).write_text(json.dumps(
        {"step": 10, "steps": 10, "rank": 1, "node": "n", "data_s": 0.4, "forward_s": 0.06, "compute_s": 0.2,
         "comm_s": 0.004, "step_s": 0.63, "time": 1795000123.4}) + "\n")
    (row,) = read_timing(paths)[1]
    assert row.version == 1 and row.backward_s == pytest.approx(0.14) and row.optimizer_s == 0.0
    assert row.compute_s == 0.2
