"""The node sampler's CSV, ``RUN_DIR/monitor/<node>.csv``: its columns and a lenient reader.

One file per node, written only by that node's sampler (:mod:`clustertrain.monitor.sampler`), every
``monitor.interval_s`` seconds. With GPUs (NVML answered), one row per GPU per sample, the seed's
nvidia-smi columns first, under nvidia-smi's query names (``nvidia-smi --query-gpu=... --format=csv,nounits``
reads the same), then the other NVML fields, then the node's host columns (the same on each GPU's row)::

    timestamp,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,index,clocks.sm,
    clocks_event_reasons.active,ecc.errors.uncorrected.volatile.total,xid,nvlink.errors,host.cpu_pct,host.load1,
    host.memory.used,host.memory.total,host.disk.read_mb_s,host.disk.write_mb_s,host.net.rx_mb_s,host.net.tx_mb_s
    2026-11-23T10:00:00.123Z,NVIDIA H200,98,70120,143771,61,642.5,0,1980,0x0000000000000001,0,,0,12.5,9.1,...

Without GPUs (no driver, no NVML, or no device): one row per sample with ``timestamp`` and the host columns only.

Units: ``timestamp`` ISO 8601 UTC with milliseconds; utilisation and CPU in %, GPU memory in MiB, temperature in
°C, power in W, SM clock in MHz, ``clocks_event_reasons.active`` NVML's bitmask as 0x + 16 hex digits (what
nvidia-smi prints), ECC as the volatile uncorrected total, ``xid`` the XID of a critical event seen since the
previous sample (empty when none), ``nvlink.errors`` the sum of the NVLink replay/recovery/CRC counters over the
GPU's links; host memory in MiB, disk and network in MB/s over the interval, ``host.load1`` the 1-minute load
average. A field NVML does not report on this GPU is empty. ``host.memory.used`` is psutil's ``used``; the network
columns sum the kernel's interfaces except loopback — EFA traffic is OS-bypass (libfabric to the NIC) and is not
in them, so NCCL over EFA shows as near-zero network here.
"""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path
from typing import Any

GPU_COLUMNS = (
    "timestamp", "name", "utilization.gpu", "memory.used", "memory.total", "temperature.gpu", "power.draw",
    "index", "clocks.sm", "clocks_event_reasons.active", "ecc.errors.uncorrected.volatile.total", "xid",
    "nvlink.errors",
)
HOST_COLUMNS = (
    "host.cpu_pct", "host.load1", "host.memory.used", "host.memory.total", "host.disk.read_mb_s",
    "host.disk.write_mb_s", "host.net.rx_mb_s", "host.net.tx_mb_s",
)
#: the header of a node with GPUs, and of one without
WITH_GPUS = GPU_COLUMNS + HOST_COLUMNS
HOST_ONLY = ("timestamp",) + HOST_COLUMNS
TEXT_COLUMNS = frozenset({"timestamp", "name", "clocks_event_reasons.active"})


def format_timestamp(t: float) -> str:
    """``t`` (Unix seconds) as the CSV's timestamp: ISO 8601 UTC with milliseconds."""
    from datetime import timezone

    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_timestamp(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The rows of one node's CSV, each with ``time`` (Unix seconds) added and numbers as floats (empty -> None).
    Lenient: a missing file is no rows; a row cut short by a kill, or with a bad timestamp, is skipped."""
    try:
        f = open(path, newline="", encoding="utf-8")
    except FileNotFoundError:
        return []
    rows = []
    with f:
        reader = csv.DictReader(f)
        width = len(reader.fieldnames or ())
        for raw in reader:
            if None in raw or len(raw) != width or any(v is None for v in raw.values()):
                continue  # too many or too few fields: a truncated line
            t = parse_timestamp(raw.get("timestamp") or "")
            if t is None:
                continue
            row: dict[str, Any] = {"time": t}
            for key, value in raw.items():
                if key in TEXT_COLUMNS:
                    row[key] = value
                elif value == "":
                    row[key] = None
                else:
                    try:
                        row[key] = float(value)
                    except ValueError:
                        row[key] = None
            rows.append(row)
    return rows
