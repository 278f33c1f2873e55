"""The beacon's device position (train/heartbeat_writer.py) on CPU: the bookkeeping of the boundary events —
in order, the first not passed ends the scan, passed events go back to the pool, the record's ``device_*`` fields.
The events here stand in for CUDA events (``query()`` only; the real ones: tests/gpu/test_hang_cuda.py); the rule
that reads the fields is tested on real-format records in tests/unit/monitor/test_hang_rules_device.py."""

from __future__ import annotations

from clustertrain.core.heartbeat_files import read_heartbeat
from clustertrain.core.run_paths import RunPaths
from clustertrain.train.heartbeat_writer import Beacon


class Device:
    """A stream that has executed ``done`` of the events recorded on it."""

    def __init__(self):
        self.recorded: list["Mark"] = []
        self.done = 0

    def event(self) -> "Mark":
        return Mark(self)


class Mark:
    def __init__(self, device: Device):
        self.device, self.index = device, None

    def record(self) -> None:
        self.device.recorded.append(self)
        self.index = len(self.device.recorded) - 1

    def query(self) -> bool:
        return self.index < self.device.done


def test_the_device_position_is_the_last_boundary_passed_and_events_are_reused(tmp_path):
    device = Device()
    beacon = Beacon(RunPaths(tmp_path / "run"), 0, "n0", 60).start()  # the thread does not tick in this test
    beacon._new_event, beacon._device, beacon._bound = device.event, "stand-in", True
    for name in ("data", "forward", "backward", "collective"):
        beacon.phase(name, step=7)
    assert beacon.record.device_phase is None  # nothing passed yet
    beacon._poll_device()
    assert beacon.record.device_phase is None
    device.done = 2  # the device passed data and forward; backward is running
    beacon._poll_device()
    r = beacon.record
    assert (r.device_phase, r.device_step, r.device_beat, r.phase, r.beat) == ("forward", 7, 2, "collective", 4)
    assert len(beacon._free) == 2 and len(beacon._pending) == 2
    beacon.phase("data", step=8)  # reuses a passed event: no new one
    assert len(device.recorded) == 5 and len({id(e) for e in device.recorded}) == 4
    beacon._write()
    on_disk = read_heartbeat(beacon.paths.rank_heartbeat(0))
    assert (on_disk.device_phase, on_disk.device_beat, on_disk.beat) == ("forward", 2, 5)
    beacon.close("done")
    assert read_heartbeat(beacon.paths.rank_heartbeat(0)).phase == "done"


def test_a_cpu_rank_has_no_device_position(tmp_path):
    beacon = Beacon(RunPaths(tmp_path / "run"), 0, "n0", 60).use_device(__import__("torch").device("cpu"))
    beacon.phase("forward", step=1)
    beacon._poll_device()
    assert beacon.record.device_phase is None and not beacon._pending
