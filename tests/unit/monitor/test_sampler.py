"""The node sampler's rows and events (clustertrain.monitor.sampler, clustertrain.monitor.gpus).

This machine has no GPU and no NVIDIA driver, so two doubles stand in for them, and only for them:
``FakeGpus`` stands in for a node's GPUs behind the sampler's ``GpuSource`` protocol, returning NVML-shaped
readings (bytes, mW, NVML's clock-event bitmask); ``FakeNvml`` stands in for the driver behind ``pynvml`` (the
real module's constants and error classes, device calls answered from a table) to check ``NvmlGpus``. The host
side (psutil), the files and the readers are real.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pynvml
import pytest

from clustertrain.monitor.config import MonitorConfig
from clustertrain.monitor.gpus import GpuReading, NoGpus, NvmlGpus, open_gpus
from clustertrain.core.run_events import read_events
from clustertrain.monitor.samples import HOST_ONLY, WITH_GPUS, read_samples
from clustertrain.monitor.sampler import Sampler, main, run, start_sampler, stop_sampler
from clustertrain.core.run_paths import RunPaths

MIB = 1 << 20
H200 = GpuReading(name="NVIDIA H200", utilization_pct=98, memory_used_bytes=70120 * MIB + 12345,
                  memory_total_bytes=143771 * MIB, temperature_c=61, power_mw=642500, sm_clock_mhz=1980,
                  clock_reasons=0x1, ecc_uncorrected=0, nvlink_errors=3)


class FakeGpus:
    """Stands in for a node's GPUs (this machine has none): NVML-shaped readings a test sets per GPU."""

    def __init__(self, *readings: GpuReading) -> None:
        self.readings = list(readings)
        self.xids: list[tuple[int, int]] = []
        self.closed = False

    def count(self) -> int:
        return len(self.readings)

    def read(self, index: int) -> GpuReading:
        return self.readings[index]

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        seen, self.xids = self.xids, []
        return seen

    def close(self) -> None:
        self.closed = True


def _lines(path) -> list[str]:
    return path.read_text().splitlines()


def test_gpu_rows_have_the_seed_columns_first_in_nvml_units(tmp_path):
    paths = RunPaths(tmp_path)
    s = Sampler(paths, "node-1", 85, FakeGpus(H200, GpuReading(name="NVIDIA H200", clock_reasons=0x48)))
    s.sample()
    s.sample()
    s.close()
    lines = _lines(paths.node_samples("node-1"))
    assert lines[0] == ",".join(WITH_GPUS)
    assert lines[0].startswith("timestamp,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,")
    assert len(lines) == 1 + 2 * 2  # a row per GPU per sample
    rows = read_samples(paths.node_samples("node-1"))
    assert len(rows) == 4
    first = rows[0]
    assert first["name"] == "NVIDIA H200" and first["index"] == 0.0
    assert first["utilization.gpu"] == 98.0 and first["temperature.gpu"] == 61.0
    assert first["memory.used"] == 70120.0 and first["memory.total"] == 143771.0  # bytes -> MiB
    assert first["power.draw"] == 642.5  # mW -> W
    assert first["clocks.sm"] == 1980.0
    assert first["clocks_event_reasons.active"] == "0x0000000000000001"
    assert first["ecc.errors.uncorrected.volatile.total"] == 0.0 and first["nvlink.errors"] == 3.0
    assert first["xid"] is None
    assert first["host.memory.total"] > 0 and first["host.cpu_pct"] is not None and first["host.load1"] is not None
    assert rows[1]["index"] == 1.0 and rows[1]["clocks_event_reasons.active"] == "0x0000000000000048"
    assert rows[0]["time"] == rows[1]["time"] <= rows[2]["time"]  # one timestamp per sample, host cells shared
    assert rows[0]["host.memory.used"] == rows[1]["host.memory.used"]


def test_fields_nvml_does_not_report_are_empty_cells(tmp_path):
    paths = RunPaths(tmp_path)
    s = Sampler(paths, "n", 85, FakeGpus(GpuReading(name="Tesla T4", temperature_c=40)))
    s.sample()
    header, row = _lines(paths.node_samples("n"))
    cells = dict(zip(header.split(","), row.split(",")))
    assert cells["name"] == "Tesla T4" and cells["temperature.gpu"] == "40" and cells["index"] == "0"
    for empty in ("utilization.gpu", "memory.used", "power.draw", "clocks.sm", "clocks_event_reasons.active",
                  "ecc.errors.uncorrected.volatile.total", "xid", "nvlink.errors"):
        assert cells[empty] == "", empty
    assert read_samples(paths.node_samples("n"))[0]["power.draw"] is None


def test_events_fire_once_per_condition_start_and_rearm(tmp_path):
    paths = RunPaths(tmp_path)
    gpus = FakeGpus(H200, H200)
    s = Sampler(paths, "node-7", 85, gpus)
    #        temperature, clock reasons,  ECC  (GPU 1; GPU 0 stays quiet)
    script = [(80, 0x0, 2), (90, 0x40, 2), (91, 0x60, 2), (70, 0x1, 4), (88, 0x88, 4), (None, None, None),
              (89, 0x88, 5)]
    for temperature, reasons, ecc in script:
        gpus.readings[1] = GpuReading(name="NVIDIA H200", temperature_c=temperature, clock_reasons=reasons,
                                      ecc_uncorrected=ecc)
        s.sample()
    gpus.xids = [(1, 79)]
    s.note_xids(gpus.wait_xid(0.1))
    s.sample()
    events = read_events(paths)
    by_kind = {}
    for e in events:
        by_kind.setdefault(e.kind, []).append(e)
    assert set(by_kind) == {"gpu_temperature", "gpu_throttle", "gpu_ecc", "gpu_xid"}
    assert all(e.node == "node-7" and e.gpu == 1 for e in events)
    temps = by_kind["gpu_temperature"]
    assert [e.value for e in temps] == [90, 88]  # 91 continues the first; 70 re-arms; a missing reading is no change
    assert temps[0].severity == "warning" and temps[0].threshold == 85 and "90 °C" in temps[0].message
    throttles = by_kind["gpu_throttle"]
    assert len(throttles) == 2  # 0x40 -> 0x60 is one condition; the idle bit 0x1 clears it
    assert "HW thermal slowdown" in throttles[0].message
    assert "HW slowdown" in throttles[1].message and "HW power brake" in throttles[1].message
    assert [(e.threshold, e.value) for e in by_kind["gpu_ecc"]] == [(2, 4), (4, 5)]  # the start value is a baseline
    assert all(e.severity == "error" for e in by_kind["gpu_ecc"] + by_kind["gpu_xid"])
    (xid,) = by_kind["gpu_xid"]
    assert "XID 79" in xid.message and xid.value == 79
    rows = read_samples(paths.node_samples("node-7"))
    assert [r["xid"] for r in rows[-2:]] == [None, 79.0]  # the sample after the XID, on that GPU's row
    assert rows[-4]["xid"] is None


def test_no_nvml_writes_host_columns_only(tmp_path):
    gpus, found = open_gpus()  # this machine: no driver, nvmlInit fails
    assert isinstance(gpus, NoGpus) and gpus.count() == 0 and "host columns only" in found
    paths = RunPaths(tmp_path)
    s = Sampler(paths, "cpu-node", 85, gpus)
    s.sample()
    assert _lines(paths.node_samples("cpu-node"))[0] == ",".join(HOST_ONLY)
    (row,) = read_samples(paths.node_samples("cpu-node"))
    assert set(row) == {"time", *HOST_ONLY}
    assert row["host.memory.total"] > row["host.memory.used"] > 0
    assert read_events(paths) == []


def test_header_change_moves_the_old_file_aside_and_same_header_appends(tmp_path):
    paths = RunPaths(tmp_path)
    csv_path, aside = paths.node_samples("n"), tmp_path / "monitor" / "n.csv.1"
    for _ in range(2):  # a CPU run, then its resume: one header, two rows
        s = Sampler(paths, "n", 85, NoGpus())
        s.sample()
        s.close()
    assert _lines(csv_path)[0] == ",".join(HOST_ONLY) and len(_lines(csv_path)) == 3
    s = Sampler(paths, "n", 85, FakeGpus(H200))  # then a GPU run in the same run dir
    s.sample()
    assert _lines(aside)[0] == ",".join(HOST_ONLY) and len(_lines(aside)) == 3
    assert _lines(csv_path)[0] == ",".join(WITH_GPUS) and len(read_samples(csv_path)) == 1
    s = Sampler(paths, "n", 85, NoGpus())  # and back: the older .1 is replaced
    assert _lines(aside)[0] == ",".join(WITH_GPUS)
    assert _lines(csv_path) == [",".join(HOST_ONLY)]


def test_a_line_cut_by_a_kill_is_skipped_and_the_next_sample_stays_whole(tmp_path):
    paths = RunPaths(tmp_path)
    s = Sampler(paths, "n", 85, FakeGpus(H200))
    s.sample()
    s.close()
    csv_path = paths.node_samples("n")
    whole = csv_path.read_text()
    csv_path.write_text(whole + whole.splitlines()[1][:40])  # half a row, no newline
    s = Sampler(paths, "n", 85, FakeGpus(H200))
    s.sample()
    rows = read_samples(csv_path)
    assert len(rows) == 2 and all(r["power.draw"] == 642.5 for r in rows)


class FakeNvml:
    """Stands in for the NVIDIA driver behind pynvml (this machine has none): the real module's constants and
    error classes; the device calls answer from ``devices`` (a value, or an NVMLError class to raise)."""

    def __init__(self, devices: list[dict], old_driver: bool = False) -> None:
        self.devices, self.old_driver = devices, old_driver
        self.queue: list = []
        self.shutdowns = 0

    def __getattr__(self, name):
        if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlClocks")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _get(self, h, key):
        value = self.devices[h].get(key, pynvml.NVMLError_NotSupported)
        if isinstance(value, type) and issubclass(value, Exception):
            raise value()
        return value

    def nvmlInit(self): pass
    def nvmlShutdown(self): self.shutdowns += 1
    def nvmlDeviceGetCount(self): return len(self.devices)
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetIndex(self, h): return h
    def nvmlDeviceGetName(self, h): return self._get(h, "name")
    def nvmlDeviceGetMemoryInfo(self, h): return self._get(h, "memory")
    def nvmlDeviceGetUtilizationRates(self, h): return self._get(h, "utilization")
    def nvmlDeviceGetPowerUsage(self, h): return self._get(h, "power_mw")

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._get(h, "temperature")

    def nvmlDeviceGetClockInfo(self, h, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        return self._get(h, "sm_clock")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        if self.old_driver:
            raise pynvml.NVMLError_FunctionNotFound()
        return self._get(h, "reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._get(h, "reasons")

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):
        assert (error_type, counter) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        return self._get(h, "ecc")

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        links = self.devices[h].get("nvlink", {})
        if link not in links:
            raise pynvml.NVMLError_InvalidArgument()
        if counter not in links[link]:
            raise pynvml.NVMLError_NotSupported()
        return links[link][counter]

    def nvmlEventSetCreate(self): return "event-set"
    def nvmlEventSetFree(self, s): pass

    def nvmlDeviceRegisterEvents(self, h, types, s):
        assert types == pynvml.nvmlEventTypeXidCriticalError
        self._get(h, "xid_events")

    def nvmlEventSetWait_v2(self, s, timeout_ms):
        assert timeout_ms > 0
        if not self.queue:
            raise pynvml.NVMLError_Timeout()
        h, xid = self.queue.pop(0)
        return SimpleNamespace(device=h, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid)


GOOD = {"name": "NVIDIA H100 80GB HBM3", "memory": SimpleNamespace(used=5 * MIB, total=81559 * MIB),
        "utilization": SimpleNamespace(gpu=77, memory=30), "power_mw": 350123, "temperature": 55, "sm_clock": 1755,
        "reasons": 0x4, "ecc": 0, "xid_events": None,
        "nvlink": {0: {0: 1, 1: 2, 2: 3, 3: 4}, 5: {0: 10, 1: 0, 3: 0}}}  # link 5: no CRC flit counter


@pytest.mark.parametrize("old_driver", [False, True])
def test_nvml_source_reads_each_field_and_leaves_unsupported_ones_empty(old_driver):
    nvml = FakeNvml([GOOD, {"name": b"Tesla V100", "temperature": 40}], old_driver=old_driver)
    gpus, found = open_gpus(nvml)
    assert isinstance(gpus, NvmlGpus) and gpus.count() == 2 and "2 GPU" in found
    assert gpus.read(0) == GpuReading(name="NVIDIA H100 80GB HBM3", utilization_pct=77, memory_used_bytes=5 * MIB,
                                      memory_total_bytes=81559 * MIB, temperature_c=55, power_mw=350123,
                                      sm_clock_mhz=1755, clock_reasons=0x4, ecc_uncorrected=0, nvlink_errors=20)
    assert gpus.read(1) == GpuReading(name="Tesla V100", temperature_c=40)  # NotSupported -> None, no NVLink
    nvml.queue = [(1, 48), (0, 79)]
    assert gpus.wait_xid(0.5) == [(1, 48), (0, 79)]
    assert gpus.wait_xid(0.01) == []
    gpus.close()
    gpus.close()
    assert nvml.shutdowns == 1


def test_nvml_without_devices_or_driver_is_no_gpus():
    nvml = FakeNvml([])
    gpus, found = open_gpus(nvml)
    assert isinstance(gpus, NoGpus) and "no GPU" in found and nvml.shutdowns == 1

    class NoDriver(FakeNvml):
        def nvmlInit(self):
            raise pynvml.NVMLError_DriverNotLoaded()

    gpus, found = open_gpus(NoDriver([GOOD]))
    assert isinstance(gpus, NoGpus) and "Driver Not Loaded" in found


def test_a_crash_in_the_loop_is_one_sampler_failed_event_and_exit_1(tmp_path):
    paths, gpus = RunPaths(tmp_path), FakeGpus(H200)
    assert run(paths, "n", 0.01, 85, parent=os.getppid(), crash_after=3, gpus=gpus) == 1
    assert len(read_samples(paths.node_samples("n"))) == 3 and gpus.closed
    (event,) = read_events(paths)
    assert event.kind == "sampler_failed" and event.severity == "error" and event.node == "n"
    assert "CLUSTERTRAIN_SAMPLER_CRASH_AFTER=3" in event.message and "\n" not in event.message


def test_the_loop_stops_when_its_parent_is_gone(tmp_path):
    paths = RunPaths(tmp_path)
    not_my_parent = os.getpid()
    assert run(paths, "n", 0.01, 85, parent=not_my_parent, gpus=FakeGpus(H200)) == 0
    assert read_samples(paths.node_samples("n")) == [] and read_events(paths) == []


@pytest.mark.parametrize("argv, env, needle", [
    (["--run-dir", "r", "--node", "n", "--interval", "soon"], {}, "--interval: 'soon'"),
    (["--run-dir", "r"], {}, "--node"),
    (["--run-dir", "r", "--node", "n"], {"CLUSTERTRAIN_SAMPLER_CRASH_AFTER": "x"}, "CLUSTERTRAIN_SAMPLER_CRASH_AFTER"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, env, needle, monkeypatch, capsys, tmp_path):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()  # nothing written


def test_start_sampler_disabled_or_impossible_returns_none(tmp_path, capsys):
    assert start_sampler(RunPaths(tmp_path), "n", MonitorConfig(enabled=False)) is None
    assert capsys.readouterr().err == "" and not (tmp_path / "monitor").exists()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    assert start_sampler(RunPaths(blocker), "n", MonitorConfig()) is None
    err = capsys.readouterr().err
    assert err.startswith("warning: node sampler not started on n") and err.count("\n") == 1
    stop_sampler(None)

