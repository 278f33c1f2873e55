"""Hang blame on GPUs (monitor/hang_rules.py): the heartbeats carry where each rank's *device* is (CUDA events at the
phase boundaries, train/heartbeat_writer.py), and the rule blames the rank whose GPU has not reached the collective
the other GPUs wait in, though every CPU waits at the same sync. The heartbeats are written and read back through
the real format (core/heartbeat_files.py: HeartbeatFile's in-place record, read_heartbeats); and the process-group
timeout's arithmetic against the watchdog's bound."""

from __future__ import annotations

from clustertrain.core.heartbeat_files import Heartbeat, HeartbeatFile, read_heartbeats
from clustertrain.core.run_paths import RunPaths
from clustertrain.monitor.config import MonitorConfig
from clustertrain.monitor.hang_rules import PG_TIMEOUT_MARGIN_S, POLL_S, evidence_wait_s, judge, process_group_timeout_s

NOW = 1_000_000.0
CONFIG = MonitorConfig(heartbeat_s=5, hang_floor_s=30, hang_step_factor=3, hang_ceiling_s=900)


def written(tmp_path, records: list[Heartbeat]) -> dict[int, Heartbeat]:
    """Write each record the way a beacon does (one in-place record per rank) and read them as the watchdog does."""
    paths = RunPaths(tmp_path / "run")
    for r in records:
        f = HeartbeatFile(paths.rank_heartbeat(r.rank))
        f.write(r)
        f.close()
    return read_heartbeats(paths)


def gpu_rank(rank: int, node: str, device: tuple[str, int, int] | None, host_since: float = NOW - 60,
             device_since: float = NOW - 45) -> Heartbeat:
    """Every CPU waits at the logged step's sync (data of step 8, beat 40); the device is at ``device``
    (phase, step, beat)."""
    extra = {}
    if device is not None:
        extra = {"device_phase": device[0], "device_step": device[1], "device_beat": device[2],
                 "device_since": device_since}
    return Heartbeat(rank=rank, node=node, host=f"ip-{node}", beat=40, phase="data", step=8, since=host_since,
                     alive=NOW - 1, step_time_s=2.0, **extra)


def test_the_rank_whose_gpu_lags_is_blamed_with_its_device_phase(tmp_path):
    stuck = ("collective", 7, 37)  # the norm all-reduce of step 7: the other GPUs wait there
    beats = written(tmp_path, [gpu_rank(0, "n0", stuck), gpu_rank(1, "n1", ("forward", 7, 33), device_since=NOW - 50),
                               gpu_rank(2, "n2", stuck), gpu_rank(3, "n3", stuck)])
    assert beats[1].device_phase == "forward" and beats[1].device_beat == 33  # the format carries it
    v = judge(beats, 4, NOW, CONFIG, NOW - 100)
    assert v is not None and v.kind == "hang"
    assert (v.ranks, v.nodes, v.phase, v.step) == ([1], ["n1"], "forward", 7)
    assert "rank 1 on n1 is stuck in forward of step 7 on its GPU for 50 s" in v.message
    assert "the other 3 ranks' GPUs wait in collective of step 7" in v.message
    assert v.waited_s == 45  # the latest progress: the other devices' entry into the collective


def test_the_same_hang_seen_from_the_hosts_alone_blames_no_one(tmp_path):
    """What the rule saw before device phases: every CPU at the same beat, nobody behind, no node excluded."""
    beats = written(tmp_path, [gpu_rank(r, f"n{r}", None) for r in range(4)])
    v = judge(beats, 4, NOW, CONFIG, NOW - 100)
    assert v is not None and v.ranks == [] and v.nodes == [] and "none behind the others" in v.message


def test_every_gpu_in_the_same_collective_blames_no_one_and_says_the_gpus_agree(tmp_path):
    stuck = ("collective", 7, 37)
    beats = written(tmp_path, [gpu_rank(r, f"n{r}", stuck) for r in range(3)])
    v = judge(beats, 3, NOW, CONFIG, NOW - 100)
    assert v is not None and v.ranks == [] and v.phase == "collective" and "(their GPUs too)" in v.message


def test_a_device_still_moving_is_progress_though_its_cpu_waits(tmp_path):
    """The CPUs have waited 60 s at the sync, but a device passed a boundary 10 s ago: no hang yet (bound 30 s)."""
    beats = written(tmp_path, [gpu_rank(0, "n0", ("backward", 7, 35), device_since=NOW - 10),
                               gpu_rank(1, "n1", ("backward", 7, 35), device_since=NOW - 40)])
    assert judge(beats, 2, NOW, CONFIG, NOW - 100) is None


def test_a_rank_without_a_device_position_is_judged_by_its_host(tmp_path):
    """A rank whose device passed no boundary yet is where its CPU is (beat 40: ahead of the GPUs)."""
    beats = written(tmp_path, [gpu_rank(0, "n0", ("collective", 7, 37)), gpu_rank(1, "n1", None),
                               gpu_rank(2, "n2", ("forward", 7, 33))])
    v = judge(beats, 3, NOW, CONFIG, NOW - 100)
    assert v is not None and v.ranks == [2] and v.phase == "forward"
    assert "the other 2 ranks wait in collective of step 7, data of step 8" in v.message  # not all the others are GPUs


def test_the_process_group_timeout_outlasts_the_watchdog_ceiling_and_its_evidence_wait():
    default = MonitorConfig()
    assert evidence_wait_s(default) == 2 * 5 + 10
    assert process_group_timeout_s(default) == 900 + 5 + POLL_S + 2 * 20 + PG_TIMEOUT_MARGIN_S == 1067
    assert process_group_timeout_s(default) > 600  # torch's default, which ended a first-step hang before the watchdog
    small = MonitorConfig(heartbeat_s=0.5, hang_floor_s=5, hang_ceiling_s=30)
    assert process_group_timeout_s(small) == 30 + 0.5 + POLL_S + 2 * 11 + PG_TIMEOUT_MARGIN_S
    # every hang is judged by the ceiling + a heartbeat + a poll; its evidence is in by one evidence wait more
    for c in (default, small, MonitorConfig(hang_ceiling_s=3600, heartbeat_s=60)):
        assert process_group_timeout_s(c) > c.hang_ceiling_s + c.heartbeat_s + POLL_S + evidence_wait_s(c)
