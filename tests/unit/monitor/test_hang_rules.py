"""The watchdog's rules (monitor/hang_rules.py) over heartbeats, and Slurm's own attribution lines (monitor/hang_watchdog.py)."""

from __future__ import annotations

from clustertrain.monitor.config import MonitorConfig
from clustertrain.monitor.hang_rules import bound, judge
from clustertrain.core.heartbeat_files import Heartbeat
from clustertrain.monitor.hang_watchdog import placement, srun_blame

NOW = 1_000_000.0
CONFIG = MonitorConfig(heartbeat_s=5, hang_floor_s=30, hang_step_factor=3, hang_ceiling_s=900)


def beat(rank: int, node: str, *, beat: int = 10, phase: str = "backward", step: int = 7, since: float = NOW - 1,
         alive: float = NOW - 1, step_time: float | None = 2.0, **kw) -> Heartbeat:
    return Heartbeat(rank=rank, node=node, host=f"ip-{node}", beat=beat, phase=phase, step=step, since=since,
                     alive=alive, step_time_s=step_time, **kw)


def test_progress_within_the_bound_is_no_hang():
    beats = {0: beat(0, "n1", since=NOW - 20), 1: beat(1, "n2", since=NOW - 25)}
    assert judge(beats, 2, NOW, CONFIG, NOW - 100) is None


def test_the_rank_behind_is_named_with_its_node_and_phase_and_its_node_is_blamed():
    beats = {0: beat(0, "n1", beat=12, since=NOW - 40), 1: beat(1, "n1", beat=12, since=NOW - 40),
             2: beat(2, "n2", beat=9, phase="collective", since=NOW - 41), 3: beat(3, "n2", beat=12, since=NOW - 40)}
    v = judge(beats, 4, NOW, CONFIG, NOW - 100)
    assert v is not None and v.kind == "hang" and v.ranks == [2] and v.nodes == ["n2"] and v.phase == "collective"
    assert "rank 2 on n2 is stuck in collective of step 7" in v.message
    assert "the other 3 ranks wait in backward of step 7" in v.message
    assert v.bound_s == 30 and v.hosts["n2"] == "ip-n2" and v.detected == NOW


def test_the_bound_follows_the_step_time_and_the_save_time_up_to_the_ceiling():
    assert bound([beat(0, "n", step_time=20.0)], CONFIG)[0] == 60  # 3 x 20 s
    assert bound([beat(0, "n", step_time=1.0)], CONFIG)[0] == 30  # the floor
    assert bound([beat(0, "n", step_time=1000.0)], CONFIG)[0] == 900  # the ceiling
    assert bound([beat(0, "n", phase="checkpoint", save_s=50.0)], CONFIG)[0] == 150
    assert bound([beat(0, "n", phase="checkpoint")], CONFIG)[0] == 900  # no save measured yet
    assert bound([beat(0, "n", phase="startup", step_time=None)], CONFIG)[0] == 900
    # 60 s without progress is a hang at a 2 s step time, not at a 30 s one
    slow = {0: beat(0, "n1", step_time=30.0, since=NOW - 60, beat=3), 1: beat(1, "n2", step_time=30.0, since=NOW - 60)}
    assert judge(slow, 2, NOW, CONFIG, NOW - 100) is None


def test_all_ranks_at_the_same_beat_blame_no_node():
    beats = {r: beat(r, f"n{r}", phase="collective", since=NOW - 45) for r in range(4)}
    v = judge(beats, 4, NOW, CONFIG, NOW - 100)
    assert v is not None and v.ranks == [] and v.nodes == [] and "none behind the others" in v.message


def test_ranks_behind_on_every_node_blame_none_of_them():
    beats = {0: beat(0, "n1", beat=5, since=NOW - 45), 1: beat(1, "n1", beat=9, since=NOW - 44),
             2: beat(2, "n2", beat=5, since=NOW - 45), 3: beat(3, "n2", beat=9, since=NOW - 44)}
    v = judge(beats, 4, NOW, CONFIG, NOW - 100)
    assert v is not None and v.ranks == [0, 2] and v.nodes == []


def test_a_rank_whose_beacon_went_quiet_is_lost_and_blamed():
    beats = {0: beat(0, "n1", done=True, phase="failed", alive=NOW - 2),
             1: beat(1, "n2", alive=NOW - 25, since=NOW - 26)}
    v = judge(beats, 2, NOW, CONFIG, NOW - 100)
    assert v is not None and v.kind == "rank_lost" and v.ranks == [1] and v.nodes == ["n2"]
    assert "no heartbeat for 25 s" in v.message and "killed or its node is gone" in v.message


def test_every_rank_quiet_at_once_is_a_frozen_job_not_a_node():
    beats = {r: beat(r, f"n{r}", alive=NOW - 30, since=NOW - 30) for r in range(2)}
    v = judge(beats, 2, NOW, CONFIG, NOW - 100)
    assert v is not None and v.kind == "rank_lost" and v.nodes == [] and "frozen" in v.message


def test_finished_ranks_and_a_long_upload_are_no_hang():
    beats = {0: beat(0, "n1", phase="upload", since=NOW - 5000), 1: beat(1, "n2", done=True, phase="done",
                                                                           alive=NOW - 4000)}
    assert judge(beats, 2, NOW, CONFIG, NOW - 6000) is None


def test_a_rank_that_never_started_is_lost_after_the_ceiling_on_its_placed_node():
    beats = {0: beat(0, "n1", phase="startup", step_time=None, since=NOW - 10)}
    expected = placement(["n1", "n2"], 1)
    assert judge(beats, 2, NOW, CONFIG, NOW - 600, expected) is None
    v = judge(beats, 2, NOW, CONFIG, NOW - 1000, expected)
    assert v is not None and v.ranks == [1] and v.nodes == ["n2"] and "never started" in v.message


def test_slurm_attribution_stops_at_the_step_termination():
    # the output format of Slurm 22.05's srun (recorded on the local cluster: one task SIGKILLed, srun ended the rest)
    text = ("[rank0] step 3\nsrun: error: node2: task 2: Killed\n"
            "srun: launch/slurm: _step_signal: Terminating StepId=1.0\n"
            "slurmstepd-node1: error: *** STEP 1.0 ON node1 CANCELLED AT 2026-11-23T10:04:52 ***\n"
            "srun: error: node2: task 3: Terminated\nsrun: error: node1: tasks 0-1: Terminated\n")
    assert srun_blame(text) == [("node2", "task 2: Killed")]
    assert srun_blame("srun: error: node1: task 0: Exited with exit code 1\n") == []
    assert srun_blame("srun: error: Node failure on node3\n") == [("node3", "node failure")]
