"""The node sampler: one process per node, beside training, that samples the node's GPUs (NVML) and host
(psutil) every ``monitor.interval_s`` seconds.

The trainer's local rank 0 on each node calls :func:`start_sampler` (and :func:`stop_sampler` at the end)::

    python -m clustertrain.monitor.sampler --run-dir DIR --node NAME [--interval S] [--gpu-temp C] [--parent PID]

Files, in ``RUN_DIR/monitor/`` (:class:`clustertrain.core.run_paths.RunPaths`), one writer each:

- ``<node>.csv``: one sample per interval (format and reader: :mod:`clustertrain.monitor.samples`): a row per
  GPU, or one host-only row when NVML or the GPUs are missing. A sample is one ``write`` on an ``O_APPEND``
  descriptor, so a kill leaves whole lines. The file is appended to when its header is the one this sampler
  writes; a file with another header (a GPU run after a CPU run in the same run dir) is moved aside to
  ``<node>.csv.1`` (replacing an older one) and a fresh file started.
- ``<node>.events.jsonl``: GPU events (:class:`clustertrain.core.run_events.Event`), one per condition start,
  re-armed when the condition clears: ``gpu_temperature`` (warning: at or above ``--gpu-temp``), ``gpu_throttle``
  (warning: a HW slowdown, HW thermal slowdown, HW power brake or SW thermal slowdown clock-event reason),
  ``gpu_ecc`` (error: the volatile uncorrected ECC count grew), ``gpu_xid`` (error: each critical XID), and
  ``sampler_failed`` (error: the sampler's loop raised; the message is the exception).
- ``<node>.log``: the process's stdout and stderr (one start line; a traceback if it failed). The start line
  names the Slurm job and the GPUs it was given (:func:`job_scope`).

Jobs that share a node (``models[].plan.gpus``, issue 42). Each model has its own run directory, so two jobs on one
node write two sets of files (``RUN_DIR/monitor/<node>.*``), never one. Each job's sampler sees only its own GPUs:
Slurm confines a job's devices to the GPUs it was given (cgroup ``ConstrainDevices=yes``, which the cluster's
head-node.sh sets where models share nodes, clustertrain/cloud/templates/head-node.sh.j2; Pyxis containers keep the
job's cgroup, GPUs included: NVIDIA/pyxis issue 72). NVML may still count the node's other GPUs but cannot open them
(NVML_ERROR_NO_PERMISSION, :class:`clustertrain.monitor.gpus.NvmlGpus` leaves them out; ``nvidia-smi -L`` in a task's
cgroup lists only its own GPU: NVIDIA/deepops issue 1102), so the rows are the job's GPUs, ``index`` 0..n-1 in NVML's
order; the start line maps them to the node's GPUs (``SLURM_JOB_GPUS``: global
ids, "not relative to any device cgroup", Slurm's sbatch man page) and says what ``CUDA_VISIBLE_DEVICES`` was.

It never slows or stops training: it is its own process at ``nice`` +10, keeps only the previous counters
(nothing accumulates), and a failure ends the sampler only (exit 1 after the ``sampler_failed`` event).
It stops when its parent is no longer ``--parent`` (checked at least once a second; the parent's death also
sends it SIGTERM, ``PR_SET_PDEATHSIG``), on SIGTERM or SIGINT (exit 0), else never. Exit 2: bad arguments.

Test hook: ``CLUSTERTRAIN_SAMPLER_CRASH_AFTER=N`` in its environment makes the loop raise after N samples (a
crash on purpose, to check that training goes on without the sampler).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import psutil

from clustertrain.core.errors import ConfigError
from clustertrain.monitor.config import MonitorConfig
from clustertrain.monitor.gpus import GpuReading, GpuSource, open_gpus, slowdown_reasons
from clustertrain.core.run_events import Event, EventKind, Severity, append_event
from clustertrain.monitor.samples import HOST_ONLY, WITH_GPUS, format_timestamp
from clustertrain.core.processes import die_with_parent
from clustertrain.core.run_paths import RunPaths, safe_node

CRASH_ENV = "CLUSTERTRAIN_SAMPLER_CRASH_AFTER"
_MIB = 1 << 20
_WAIT_SLICE_S = 1.0  # the longest the loop blocks between two checks of its parent


def _fmt(value: float | None, digits: int = 0) -> str:
    """A CSV cell: empty for None, else the number with at most ``digits`` decimals (no trailing zeros)."""
    if value is None:
        return ""
    if digits == 0:
        return str(int(round(value)))
    return f"{value:.{digits}f}".rstrip("0").rstrip(".")


def _mib(nbytes: int | None) -> str:
    return "" if nbytes is None else str(nbytes // _MIB)


def _optional(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # a container without /proc/diskstats, ...: that column stays empty
        return None


class HostSampler:
    """The node's CPU, load, memory, disk and network through psutil. Keeps only the previous counters: disk
    and network rates are the deltas over the real time elapsed since the previous reading."""

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # primes the counter: the next call measures since now
        self._prev = self._counters()

    @staticmethod
    def _counters() -> tuple[float, int | None, int | None, int | None, int | None]:
        disk = _optional(psutil.disk_io_counters)
        nics = _optional(lambda: psutil.net_io_counters(pernic=True)) or {}
        nics = [c for name, c in nics.items() if name != "lo"]  # loopback is not the network
        return (time.monotonic(),
                disk.read_bytes if disk else None, disk.write_bytes if disk else None,
                sum(c.bytes_recv for c in nics) if nics else None, sum(c.bytes_sent for c in nics) if nics else None)

    def read(self) -> dict[str, str]:
        now = self._counters()
        elapsed = now[0] - self._prev[0]
        rates = []
        for before, after in zip(self._prev[1:], now[1:]):
            ok = before is not None and after is not None and after >= before and elapsed > 0
            rates.append((after - before) / elapsed / 1e6 if ok else None)  # a reset counter: empty, not negative
        self._prev = now
        memory = psutil.virtual_memory()
        load = _optional(os.getloadavg)
        return {
            "host.cpu_pct": _fmt(psutil.cpu_percent(interval=None), 1),
            "host.load1": _fmt(load[0] if load else None, 2),
            "host.memory.used": _mib(memory.used),
            "host.memory.total": _mib(memory.total),
            "host.disk.read_mb_s": _fmt(rates[0], 3),
            "host.disk.write_mb_s": _fmt(rates[1], 3),
            "host.net.rx_mb_s": _fmt(rates[2], 3),
            "host.net.tx_mb_s": _fmt(rates[3], 3),
        }


def gpu_cells(index: int, r: GpuReading, xid: int | None) -> dict[str, str]:
    """One GPU's CSV cells (NVML units -> the CSV's: bytes -> MiB, mW -> W, the bitmask as 0x + 16 hex digits)."""
    return {
        "name": r.name or "",
        "utilization.gpu": _fmt(r.utilization_pct),
        "memory.used": _mib(r.memory_used_bytes),
        "memory.total": _mib(r.memory_total_bytes),
        "temperature.gpu": _fmt(r.temperature_c),
        "power.draw": _fmt(r.power_mw / 1000 if r.power_mw is not None else None, 3),
        "index": str(index),
        "clocks.sm": _fmt(r.sm_clock_mhz),
        "clocks_event_reasons.active": f"0x{r.clock_reasons:016x}" if r.clock_reasons is not None else "",
        "ecc.errors.uncorrected.volatile.total": _fmt(r.ecc_uncorrected),
        "xid": _fmt(xid),
        "nvlink.errors": _fmt(r.nvlink_errors),
    }


def open_csv(path: Path, header: tuple[str, ...]) -> int:
    """An ``O_APPEND`` descriptor on the node's CSV, whose first line is ``header`` (see the module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (",".join(header) + "\n").encode()
    size, last = 0, b"\n"
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 16)
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(-1, os.SEEK_END)
                last = f.read(1)
    except FileNotFoundError:
        first = b""
    if size and first != line:
        os.replace(path, path.with_name(path.name + ".1"))
        size = 0
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    if size == 0:
        _write_all(fd, line)
    elif last != b"\n":
        _write_all(fd, b"\n")  # end a line a kill cut short: the reader skips it, the next sample stays whole
    return fd


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


class Sampler:
    """Writes one sample per :meth:`sample` call and the events of the conditions that start."""

    def __init__(self, paths: RunPaths, node: str, gpu_temp_c: float, gpus: GpuSource) -> None:
        self.paths, self.node, self.gpu_temp_c, self.gpus = paths, node, gpu_temp_c, gpus
        self.gpu_count = gpus.count()
        self.header = WITH_GPUS if self.gpu_count else HOST_ONLY
        self.samples = 0
        self.host = HostSampler()
        self._hot: set[int] = set()
        self._throttled: set[int] = set()
        self._ecc: dict[int, int] = {}
        self._xid: dict[int, int] = {}  # XIDs seen since the previous sample, for its rows
        self._fd: int | None = open_csv(paths.node_samples(node), self.header)

    def sample(self) -> None:
        t = time.time()
        base = {"timestamp": format_timestamp(t), **self.host.read()}
        rows = [base] if not self.gpu_count else []
        for i in range(self.gpu_count):
            reading = self.gpus.read(i)
            rows.append({**base, **gpu_cells(i, reading, self._xid.get(i))})
            self._check(i, reading, t)
        self._xid.clear()
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerows([row[c] for c in self.header] for row in rows)
        assert self._fd is not None, "sample() after close()"
        _write_all(self._fd, buf.getvalue().encode("utf-8"))
        self.samples += 1

    def note_xids(self, xids: list[tuple[int, int]]) -> None:
        """Record the XIDs :meth:`GpuSource.wait_xid` saw: an event each now, the value in the next rows."""
        for gpu, xid in xids:
            known = gpu if 0 <= gpu < self.gpu_count else None
            if known is not None:
                self._xid[known] = xid
            where = f"GPU {known}" if known is not None else "a GPU"
            self._event(EventKind.GPU_XID, Severity.ERROR, known, time.time(),
                        f"{where} on {self.node}: XID {xid} critical error (see the node's kernel log: dmesg | grep -i xid)",
                        value=xid)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _check(self, i: int, r: GpuReading, t: float) -> None:
        if r.temperature_c is not None:
            if r.temperature_c < self.gpu_temp_c:
                self._hot.discard(i)
            elif i not in self._hot:
                self._hot.add(i)
                self._event(EventKind.GPU_TEMPERATURE, Severity.WARNING, i, t,
                            f"GPU {i} on {self.node} at {r.temperature_c} °C, at or above the {self.gpu_temp_c:g} °C "
                            "limit (monitor.gpu_temp_c)", value=r.temperature_c, threshold=self.gpu_temp_c)
        if r.clock_reasons is not None:
            reasons = slowdown_reasons(r.clock_reasons)
            if not reasons:
                self._throttled.discard(i)
            elif i not in self._throttled:
                self._throttled.add(i)
                self._event(EventKind.GPU_THROTTLE, Severity.WARNING, i, t,
                            f"GPU {i} on {self.node} clocks slowed: {', '.join(reasons)} "
                            f"(clocks_event_reasons 0x{r.clock_reasons:016x})")
        if r.ecc_uncorrected is not None:
            before = self._ecc.get(i)
            if before is not None and r.ecc_uncorrected > before:
                self._event(EventKind.GPU_ECC, Severity.ERROR, i, t,
                            f"GPU {i} on {self.node}: {r.ecc_uncorrected - before} new uncorrected ECC error(s) "
                            f"(volatile total {r.ecc_uncorrected})", value=r.ecc_uncorrected, threshold=before)
            self._ecc[i] = r.ecc_uncorrected  # the baseline, also after a driver reload reset it

    def _event(self, kind: EventKind, severity: Severity, gpu: int | None, t: float, message: str,
               value: float | None = None, threshold: float | None = None) -> None:
        append_event(self.paths.node_events(self.node), Event(
            time=t, kind=kind, severity=severity, message=message, node=self.node, gpu=gpu, value=value,
            threshold=threshold))


def _parent_gone(parent: int | None) -> bool:
    return parent is not None and os.getppid() != parent


def run(paths: RunPaths, node: str, interval_s: float, gpu_temp_c: float, parent: int | None = None,
        crash_after: int | None = None, gpus: GpuSource | None = None) -> int:
    """Sample until the parent is gone (0); on any exception, one ``sampler_failed`` event and 1.
    ``gpus``: the GPU source (default: NVML through :func:`open_gpus`)."""
    sampler = None
    try:
        if gpus is None:
            gpus, found = open_gpus()
            print(f"node sampler on {node} (pid {os.getpid()}): {found}{job_scope(os.environ)}; a sample every "
                  f"{interval_s:g} s into {paths.node_samples(node)}", flush=True)
        sampler = Sampler(paths, node, gpu_temp_c, gpus)
        next_at = time.monotonic()
        while not _parent_gone(parent):
            if crash_after is not None and sampler.samples >= crash_after:
                raise RuntimeError(f"{CRASH_ENV}={crash_after}: crashing on purpose after {sampler.samples} samples")
            next_at = max(next_at + interval_s, time.monotonic())  # late: no burst to catch up
            while (left := next_at - time.monotonic()) > 0 and not _parent_gone(parent):
                sampler.note_xids(gpus.wait_xid(min(left, _WAIT_SLICE_S)))
            if not _parent_gone(parent):
                sampler.sample()
        print(f"node sampler on {node}: parent {parent} is gone; stopping after {sampler.samples} samples", flush=True)
        return 0
    except Exception as exc:
        _record_failure(paths, node, exc)
        return 1
    finally:
        if sampler is not None:
            sampler.close()
        if gpus is not None:
            gpus.close()


def job_scope(env: Any) -> str:
    """What the start line says about the job whose GPUs this sampler reads: ``, job J (node GPUs G;
    CUDA_VISIBLE_DEVICES=V)`` from ``SLURM_JOB_ID``, ``SLURM_JOB_GPUS`` and ``CUDA_VISIBLE_DEVICES``; empty outside
    a Slurm job."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return ""
    parts = [f"node GPUs {env['SLURM_JOB_GPUS']}"] if env.get("SLURM_JOB_GPUS") else []
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        parts.append(f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}")
    return f", job {job}" + (f" ({'; '.join(parts)})" if parts else "")


def _record_failure(paths: RunPaths, node: str, exc: Exception) -> None:
    traceback.print_exc()
    what = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
    try:
        append_event(paths.node_events(node), Event(
            kind=EventKind.SAMPLER_FAILED, severity=Severity.ERROR, node=node,
            message=f"node sampler on {node} stopped ({what}); training goes on without its samples"))
    except Exception as again:
        print(f"node sampler on {node}: cannot record its failure either: {again}", file=sys.stderr, flush=True)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (main), instead of argparse's usage + message
        raise ConfigError(f"python -m clustertrain.monitor.sampler: {message} (see --help)")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in (0, 3600]")
    return value


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, int | None]:
    p = _Parser(prog="python -m clustertrain.monitor.sampler", description="The node sampler (see the module docstring).")
    p.add_argument("--run-dir", required=True, type=Path, help="The run directory; writes RUN_DIR/monitor/<node>.*")
    p.add_argument("--node", required=True, help="This node's name (the files' names).")
    p.add_argument("--interval", type=_positive, default=MonitorConfig().interval_s, help="Seconds between samples.")
    p.add_argument("--gpu-temp", type=float, default=MonitorConfig().gpu_temp_c, help="gpu_temperature event at or above (°C).")
    p.add_argument("--parent", type=int, default=None, help="Stop when the parent process is no longer this PID.")
    args = p.parse_args(argv)
    crash = os.environ.get(CRASH_ENV)
    if crash is not None and not crash.strip().isdigit():
        raise ConfigError(f"{CRASH_ENV}={crash!r}: must be a whole number of samples (or unset)")
    return args, int(crash) if crash is not None else None


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    try:
        args, crash_after = _parse(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        os.nice(10)  # training's processes come first
    except OSError:
        pass
    if args.parent is not None:
        die_with_parent()  # the caller has threads (torch): nothing runs between its fork and exec (no preexec_fn)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return run(RunPaths(args.run_dir), args.node, args.interval, args.gpu_temp, args.parent, crash_after)


def node_log(paths: RunPaths, node: str) -> Path:
    """``RUN_DIR/monitor/<node>.log``: the sampler's stdout and stderr."""
    return paths.monitor / f"{safe_node(node)}.log"


def start_sampler(paths: RunPaths, node: str, config: MonitorConfig) -> subprocess.Popen | None:
    """Start this node's sampler as a child process of the caller (which must stay alive while training: its
    death stops the sampler). None when ``config.enabled`` is false, or, with one ``warning:`` line on stderr,
    when it cannot start. Never raises."""
    if not config.enabled:
        return None
    try:
        argv = [sys.executable, "-m", "clustertrain.monitor.sampler", "--run-dir", str(paths.root), "--node", node,
                "--interval", repr(float(config.interval_s)), "--gpu-temp", repr(float(config.gpu_temp_c)),
                "--parent", str(os.getpid())]
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])  # the same clustertrain as the trainer's
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        paths.monitor.mkdir(parents=True, exist_ok=True)
        with open(node_log(paths, node), "ab") as log:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
    except Exception as exc:
        print(f"warning: node sampler not started on {node} ({type(exc).__name__}: {exc}); training goes on "
              "without its GPU and host samples", file=sys.stderr, flush=True)
        return None


def stop_sampler(proc: subprocess.Popen | None, timeout_s: float = 2.0) -> None:
    """SIGTERM the sampler, wait up to ``timeout_s``, then SIGKILL. Never raises."""
    if proc is None:
        return
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
    except Exception:
        pass


if __name__ == "__main__":
    sys.exit(main())
