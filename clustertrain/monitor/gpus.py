"""The node sampler's GPU source: a tiny protocol (:class:`GpuSource`) and its NVML implementation.

:func:`open_gpus` returns :class:`NvmlGpus` (``nvidia-ml-py``, module ``pynvml``) when NVML starts and sees at
least one device, else :class:`NoGpus` (no driver, no library, no device: the sampler then writes host columns
only, without an error or an event). A test passes a fake of the protocol, or a fake ``pynvml`` module to
:class:`NvmlGpus`, where no GPU exists.

:meth:`GpuSource.read` returns a :class:`GpuReading` in NVML's own units (bytes, mW, the clock-event bitmask);
the sampler converts them to the CSV's (:mod:`clustertrain.monitor.samples`). A field NVML does not answer on
this GPU (``NVMLError_NotSupported``, or any other ``NVMLError``) is ``None``, never an exception.

XID critical errors are caught with an NVML event set (``nvmlDeviceRegisterEvents`` with
``nvmlEventTypeXidCriticalError``): :meth:`GpuSource.wait_xid` blocks in ``nvmlEventSetWait_v2`` for up to its
timeout, which is also how the sampler waits between two samples.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

#: clock-event reasons that mean the GPU was slowed by a fault or a limit (NVML's nvmlClocksEventReason* bits)
SLOWDOWN_REASONS = {
    0x08: "HW slowdown",  # nvmlClocksEventReasonHwSlowdown
    0x20: "SW thermal slowdown",  # nvmlClocksEventReasonSwThermalSlowdown
    0x40: "HW thermal slowdown",  # nvmlClocksEventReasonHwThermalSlowdown
    0x80: "HW power brake",  # nvmlClocksEventReasonHwPowerBrakeSlowdown
}
_NVLINK_COUNTERS = ("NVML_NVLINK_ERROR_DL_REPLAY", "NVML_NVLINK_ERROR_DL_RECOVERY", "NVML_NVLINK_ERROR_DL_CRC_FLIT",
                    "NVML_NVLINK_ERROR_DL_CRC_DATA")


def slowdown_reasons(mask: int | None) -> list[str]:
    """The names of the fault/limit slowdown bits set in a clock-event-reasons mask."""
    return [] if not mask else [name for bit, name in SLOWDOWN_REASONS.items() if mask & bit]


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment, in NVML's units; ``None``: NVML does not report it on this GPU."""

    name: str | None = None
    utilization_pct: int | None = None  # nvmlDeviceGetUtilizationRates().gpu
    memory_used_bytes: int | None = None  # nvmlDeviceGetMemoryInfo().used
    memory_total_bytes: int | None = None
    temperature_c: int | None = None  # NVML_TEMPERATURE_GPU
    power_mw: int | None = None  # nvmlDeviceGetPowerUsage
    sm_clock_mhz: int | None = None  # NVML_CLOCK_SM
    clock_reasons: int | None = None  # nvmlDeviceGetCurrentClocksEventReasons bitmask
    ecc_uncorrected: int | None = None  # volatile uncorrected total
    nvlink_errors: int | None = None  # replay + recovery + CRC flit + CRC data, summed over the links


class GpuSource(Protocol):
    """What the sampler needs from the node's GPUs."""

    def count(self) -> int:
        """GPUs on this node (0: host columns only)."""

    def read(self, index: int) -> GpuReading:
        """GPU ``index`` now; never raises for a field the GPU does not report."""

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        """Block up to ``timeout_s``; return the ``(gpu index, XID)`` of the critical XID events seen meanwhile."""

    def close(self) -> None:
        """Release the library (idempotent)."""


class NoGpus:
    """No NVML or no device: nothing to read, waiting is sleeping."""

    def count(self) -> int:
        return 0

    def read(self, index: int) -> GpuReading:
        raise IndexError(f"no GPU {index}: this node has none")

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        _sleep(timeout_s)
        return []

    def close(self) -> None:
        pass


class NvmlGpus:
    """The node's GPUs through NVML (``nvml``: the ``pynvml`` module, already initialised)."""

    def __init__(self, nvml: Any, count: int) -> None:
        self._nvml = nvml
        # a GPU NVML cannot open (fallen off the bus...) keeps its place: its rows have empty cells. A GPU it may not
        # open (NVML_ERROR_NO_PERMISSION) is another job's, behind Slurm's device cgroup (ConstrainDevices) on a node
        # that jobs share: not ours to sample. nvmlDeviceGetCount_v2 counts every GPU of the node "even if
        # nvmlDeviceGetHandleByIndex_v2 returns NVML_ERROR_NO_PERMISSION for such device" (NVML API reference,
        # nvmlDeviceGetCount), so the job's own GPUs are those left, in NVML's order: its rows' index 0..n-1.
        denied = getattr(nvml, "NVMLError_NoPermission", None)
        self._handles: list[Any] = []
        self._nvml_index: dict[int, int] = {}  # NVML's index -> ours (XID events name NVML's)
        self.others = 0  # GPUs of the node this job may not open
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
            except nvml.NVMLError as exc:
                if denied is not None and isinstance(exc, denied):
                    self.others += 1
                    continue
                handle = None
            self._nvml_index[i] = len(self._handles)
            self._handles.append(handle)
        self._links = [self._nvlink_counters(h) if h is not None else [] for h in self._handles]
        self._events = None
        self._open = True
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            return
        registered = False
        for h in (h for h in self._handles if h is not None):
            try:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
                registered = True
            except nvml.NVMLError:
                continue  # this GPU does not report XIDs to unprivileged users, or at all
        if registered:
            self._events = events
        else:
            self._call(nvml.nvmlEventSetFree, events)

    def count(self) -> int:
        return len(self._handles)

    def read(self, index: int) -> GpuReading:
        nv, h = self._nvml, self._handles[index]
        if h is None:
            return GpuReading()
        name = self._call(nv.nvmlDeviceGetName, h)
        memory = self._call(nv.nvmlDeviceGetMemoryInfo, h)
        utilization = self._call(nv.nvmlDeviceGetUtilizationRates, h)
        return GpuReading(
            name=name.decode() if isinstance(name, bytes) else name,
            utilization_pct=utilization.gpu if utilization is not None else None,
            memory_used_bytes=memory.used if memory is not None else None,
            memory_total_bytes=memory.total if memory is not None else None,
            temperature_c=self._call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            power_mw=self._call(nv.nvmlDeviceGetPowerUsage, h),
            sm_clock_mhz=self._call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            clock_reasons=self._clock_reasons(h),
            ecc_uncorrected=self._call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                       nv.NVML_VOLATILE_ECC),
            nvlink_errors=self._nvlink_errors(index),
        )

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        if self._events is None:
            _sleep(timeout_s)
            return []
        nv, seen = self._nvml, []
        deadline = time.monotonic() + timeout_s
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            try:
                data = nv.nvmlEventSetWait_v2(self._events, left_ms)
            except nv.NVMLError_Timeout:
                break
            except nv.NVMLError:  # the GPU is lost, the driver went away...: keep the cadence, report nothing
                _sleep(deadline - time.monotonic())
                break
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                seen.append((self._index_of(data.device), int(data.eventData)))
        return seen

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        if self._events is not None:
            self._call(self._nvml.nvmlEventSetFree, self._events)
        self._call(self._nvml.nvmlShutdown)

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    def _clock_reasons(self, h: Any) -> int | None:
        nv = self._nvml
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(nv, name, None)  # old bindings only have the "Throttle" name
            if fn is None:
                continue
            try:
                return fn(h)
            except nv.NVMLError_FunctionNotFound:  # an old driver: try the old name
                continue
            except nv.NVMLError:
                return None
        return None

    def _nvlink_counters(self, h: Any) -> list[tuple[int, int]]:
        """The (link, counter) pairs this GPU answers, probed once (a PCIe GPU: none)."""
        nv, pairs = self._nvml, []
        counters = [getattr(nv, c) for c in _NVLINK_COUNTERS]
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            for c in counters:
                try:
                    nv.nvmlDeviceGetNvLinkErrorCounter(h, link, c)
                except nv.NVMLError:
                    continue  # no such link, or this counter is not supported on it
                pairs.append((link, c))
        return pairs

    def _nvlink_errors(self, index: int) -> int | None:
        pairs = self._links[index]
        if not pairs:
            return None
        values = [self._call(self._nvml.nvmlDeviceGetNvLinkErrorCounter, self._handles[index], link, c)
                  for link, c in pairs]
        values = [v for v in values if v is not None]
        return sum(values) if values else None

    def _index_of(self, device: Any) -> int:
        index = self._call(self._nvml.nvmlDeviceGetIndex, device)
        return self._nvml_index.get(int(index), -1) if index is not None else -1


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


def open_gpus(nvml: Any = None) -> tuple[GpuSource, str]:
    """The node's GPUs and one line saying what was found. ``nvml``: the ``pynvml`` module (a test's fake);
    a missing library, a failing ``nvmlInit`` or no device gives :class:`NoGpus`."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as exc:
            return NoGpus(), f"no NVML ({exc}): host columns only"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, OSError from ctypes...
        return NoGpus(), f"no NVML ({exc}): host columns only"
    try:
        count = nvml.nvmlDeviceGetCount()
        gpus = NvmlGpus(nvml, count) if count > 0 else None
        if gpus is not None and gpus.count() > 0:
            others = f" ({gpus.others} more on the node, another job's)" if gpus.others else ""
            return gpus, f"{gpus.count()} GPU(s) through NVML{others}"
        if gpus is not None:
            gpus.close()
            return NoGpus(), f"NVML sees {count} GPU(s), all another job's: host columns only"
    except nvml.NVMLError as exc:
        reason = f"NVML answered but no device could be read ({exc}): host columns only"
    else:
        reason = "NVML sees no GPU: host columns only"
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass
    return NoGpus(), reason
