"""The node sampler as the real process it is beside training: started by ``start_sampler`` from a parent
process, writing host rows (this machine has no GPU, so no GPU double is used here: NVML fails to start and
the sampler writes host columns only), exiting with its parent, on SIGTERM, and after a crash on purpose;
its memory does not grow with the samples."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from clustertrain.core.run_events import read_events
from clustertrain.monitor.samples import HOST_ONLY, read_samples
from clustertrain.monitor.sampler import CRASH_ENV, stop_sampler
from clustertrain.core.run_paths import RunPaths

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]

PARENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from clustertrain.monitor.config import MonitorConfig
    from clustertrain.monitor.sampler import start_sampler
    from clustertrain.core.run_paths import RunPaths
    proc = start_sampler(RunPaths(Path(sys.argv[1])), sys.argv[2], MonitorConfig(interval_s=0.2))
    print(proc.pid, flush=True)
    time.sleep(120)
""")


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _rows(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n") - 1
    except FileNotFoundError:
        return 0


def test_host_rows_appear_and_the_sampler_exits_with_its_parent(tmp_path):
    run_dir, node = tmp_path / "run 'a'", "node-1"
    paths = RunPaths(run_dir)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(run_dir), node], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        pid = int(parent.stdout.readline())
        _wait_for(lambda: _rows(paths.node_samples(node)) >= 3, 10, "3 samples")
        assert paths.node_samples(node).read_text().splitlines()[0] == ",".join(HOST_ONLY)
        rows = read_samples(paths.node_samples(node))
        assert len(rows) >= 3 and all(r["host.memory.total"] > 0 and r["host.cpu_pct"] is not None for r in rows)
        assert 0.1 < rows[1]["time"] - rows[0]["time"] < 0.6  # the interval, roughly
        sampler = psutil.Process(pid)
        assert sampler.ppid() == parent.pid and sampler.nice() >= 10
        log = (paths.monitor / f"{node}.log").read_text()
        assert "host columns only" in log and "Traceback" not in log
    finally:
        parent.kill()
        parent.wait()
    t0 = time.monotonic()
    _wait_for(lambda: _gone(pid), 2.5, "the sampler to exit after its parent was killed")
    assert time.monotonic() - t0 < 2.0
    assert read_events(paths) == []


def test_a_crash_on_purpose_exits_1_with_one_sampler_failed_event(tmp_path):
    paths = RunPaths(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "clustertrain.monitor.sampler", "--run-dir", str(tmp_path),
                           "--node", "n", "--interval", "0.05", "--parent", str(os.getpid())], cwd=ROOT,
                          env={**os.environ, CRASH_ENV: "3"}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert len(read_samples(paths.node_samples("n"))) == 3
    (event,) = read_events(paths)
    assert event.kind == "sampler_failed" and event.node == "n" and f"{CRASH_ENV}=3" in event.message


def test_memory_stays_bounded_and_sigterm_stops_it(tmp_path):
    paths = RunPaths(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "clustertrain.monitor.sampler", "--run-dir", str(tmp_path),
                             "--node", "n", "--interval", "0.01", "--parent", str(os.getpid())], cwd=ROOT)
    try:
        me = psutil.Process(proc.pid)
        csv_path = paths.node_samples("n")
        _wait_for(lambda: _rows(csv_path) >= 20, 10, "20 samples")
        rss20, cpu20, n20 = me.memory_info().rss, sum(me.cpu_times()[:2]), _rows(csv_path)
        _wait_for(lambda: _rows(csv_path) >= 200, 15, "200 samples")
        rss200, cpu200, n200 = me.memory_info().rss, sum(me.cpu_times()[:2]), _rows(csv_path)
        per_sample_ms = (cpu200 - cpu20) / (n200 - n20) * 1000
        print(f"sampler: RSS {rss20 / 2**20:.1f} MiB after {n20} samples, {rss200 / 2**20:.1f} MiB after {n200}; "
              f"CPU {per_sample_ms:.2f} ms per sample")
        assert rss200 - rss20 < 2 * 2**20
        assert per_sample_ms < 20
    finally:
        stop_sampler(proc)
    assert proc.returncode == 0  # SIGTERM is a clean stop
    assert len(read_samples(paths.node_samples("n"))) >= 200 and read_events(paths) == []
