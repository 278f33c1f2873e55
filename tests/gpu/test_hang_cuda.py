"""A hang on the GPU, blamed with its phase (issue 38): one GPU, two ranks' beacons (train/heartbeat_writer.py), each
marking its phases on its own CUDA stream. Rank 0's forward spins on the device (``torch.cuda._sleep``) while both
CPUs move on to the collective — the host phases are equal, as when every CPU waits at the sync of a stuck NCCL
collective. The beacons poll their events, the heartbeats carry the device phases, and the watchdog's rule names
rank 0 stuck in forward on its GPU; the incident collects both ranks' stacks. Skips without CUDA."""

from __future__ import annotations

import json
import time

import pytest
import torch

from clustertrain.core.heartbeat_files import read_heartbeats
from clustertrain.core.run_paths import RunPaths
from clustertrain.monitor.config import MonitorConfig
from clustertrain.monitor.hang_rules import judge
from clustertrain.monitor.hang_watchdog import Watchdog
from clustertrain.train.heartbeat_writer import Beacon

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SPIN_S = 14.0


def cycles_per_second(dev) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    end.synchronize()
    return 50_000_000 / (start.elapsed_time(end) / 1000)


def test_a_spinning_forward_is_named_with_its_phase_on_its_gpu(tmp_path):
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    rate = cycles_per_second(dev)
    paths = RunPaths(tmp_path / "run")
    config = MonitorConfig(heartbeat_s=0.5, hang_floor_s=5, hang_ceiling_s=30, hang_step_factor=3)
    streams = [torch.cuda.Stream(dev), torch.cuda.Stream(dev)]
    beacons = [Beacon(paths, r, f"n{r}", config.heartbeat_s).start().use_device(dev) for r in range(2)]
    for b in beacons:
        b.step_done(0.1), b.step_done(0.1)  # a step time is known: the bound is the 5 s floor
    started = time.time()
    for r, (b, s) in enumerate(zip(beacons, streams)):
        with torch.cuda.stream(s):
            b.phase("data", step=3)
            b.phase("forward")
            if r == 0:
                torch.cuda._sleep(int(SPIN_S * rate))  # rank 0's GPU is stuck in its forward
            b.phase("collective")  # both CPUs move on and wait here
    try:
        verdict = None
        while verdict is None and time.time() - started < SPIN_S - 2:
            time.sleep(0.5)
            beats = read_heartbeats(paths)
            verdict = judge(beats, 2, time.time(), config, started - 1)
        assert verdict is not None, "no verdict while rank 0's GPU spun"
        assert {(b.phase, b.beat) for b in beats.values()} == {("collective", 3)}  # the CPUs look alike
        assert (beats[0].device_phase, beats[1].device_phase) == ("forward", "collective")
        assert verdict.ranks == [0] and verdict.phase == "forward" and verdict.nodes == ["n0"]
        assert "rank 0 on n0 is stuck in forward of step 3 on its GPU" in verdict.message
        assert "the other rank's GPU waits in collective of step 3" in verdict.message
        incident = Watchdog(paths, config, 2, log=lambda m: None).handle(verdict, end_ranks=False)
        record = json.loads((incident.dir / "incident.json").read_text())
        assert record["phase"] == "forward" and record["stacks"] == ["stacks/rank0.txt", "stacks/rank1.txt"]
    finally:
        torch.cuda.synchronize(dev)
        for b in beacons:
            b.close("done")
