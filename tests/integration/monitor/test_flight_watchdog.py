"""The flight recorder end to end on real gloo ranks (issue 38): two ranks join through the trainer's
``init_process_group`` (train/distributed.py: the flight recorder on by default, the dump prefix under the run dir,
the watchdog-aligned timeout) with a second gloo group like the trainer's control group, and their beacons
(train/heartbeat_writer.py). Rank 1 then stops issuing collectives while rank 0 waits in an all_reduce: each rank
entered one new phase, so the heartbeats blame no one; the watchdog's dump request brings both ranks' flight
recorder dumps, torch's analyser names rank 1, and the incident, the verdict and the exit follow."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from clustertrain.core.run_paths import RunPaths
from clustertrain.monitor.config import MonitorConfig
from clustertrain.monitor.hang_watchdog import Watchdog

pytestmark = pytest.mark.slow

RANK = r"""
import sys, time
from pathlib import Path
import torch, torch.distributed as dist
from clustertrain.core.ranks import RankInfo
from clustertrain.core.run_paths import RunPaths
from clustertrain.train.distributed import init_process_group
from clustertrain.train.heartbeat_writer import Beacon

run, rank, port = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
env = RankInfo.from_environ({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
beacon = Beacon(RunPaths(run), rank, f"n{rank}", 0.5).start()
init_process_group(env, "gloo", 120, run_dir=run)
control = dist.new_group(backend="gloo")
t = torch.ones(8)
for step in range(1, 4):
    beacon.phase("forward", step=step)
    beacon.phase("collective")
    dist.all_reduce(t)
    dist.all_reduce(torch.zeros(1), group=control)
    beacon.step_done(0.05)
beacon.phase("forward", step=4)
beacon.phase("collective")  # both ranks enter one phase more: the heartbeats see them alike
if rank == 1:
    time.sleep(600)  # never joins step 4's all_reduce
dist.all_reduce(t)
"""


def test_the_flight_recorder_names_the_rank_that_never_joined(tmp_path):
    run = tmp_path / "run"
    paths = RunPaths(run)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ".", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(run), str(r), port], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    dog = Watchdog(paths, MonitorConfig(heartbeat_s=0.5, hang_floor_s=5, hang_ceiling_s=30), 2, poll_s=0.5,
                   log=lambda m: None)
    try:
        deadline = time.time() + 90
        incident = None
        while incident is None and time.time() < deadline:
            incident = dog.check()
            time.sleep(0.2)
        assert incident is not None, [p.poll() for p in procs]
        codes = [p.wait(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    record = json.loads((incident.dir / "incident.json").read_text())
    # the watchdog ends whichever it reaches first; a peer of a rank that left fails in its all_reduce (the entry
    # point then exits 75 too: train/entry.py run_rank; this bare script does not)
    assert 75 in codes and set(codes) <= {1, 75}, [p.stdout.read() for p in procs]
    assert record["flight"]["ranks"] == [1] and record["flight"]["dumps"] == [0, 1]
    assert record["flight"]["files"] == ["flight/rank0", "flight/rank1"]  # the beacons' dumps, at the request
    assert record["ranks"] == [1] and record["nodes"] == ["n1"]
    assert "none behind the others" in record["message"]  # the heartbeats alone blame no one
    assert "flight recorder (2 dumps): rank 1 never joined gloo:all_reduce" in record["message"]
    assert (run / "flight").is_dir()  # NCCL's own dump prefix, made before the group
