"""Each rank's heartbeat: what the rank is doing (step, phase), written by a thread of its own, and that thread's
answer to the watchdog's requests (dump the stacks, exit). Formats: :mod:`clustertrain.core.heartbeat_files`.

The training loop only sets attributes (:meth:`Beacon.phase`, :meth:`Beacon.step_done`): no I/O, no lock, no
syscall on the hot path. The beacon thread writes the record every ``monitor.heartbeat_s`` with one ``pwrite``,
and keeps doing so while the main thread is blocked inside a collective (torch's collectives and ``wait`` release
the GIL), so a stale ``alive`` means the process or its node is gone, while a stale ``since`` with a fresh
``alive`` means the rank is stuck. The same thread serves the watchdog's request: it writes every thread's Python
stack with :mod:`faulthandler` (and the flight recorder's dump when torch records one), and on ``exit`` ends the
process with :func:`os._exit`, the one way to end a process whose main thread waits in C++ for a peer that
never comes.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import threading
import time
from collections import deque
from pathlib import Path

from clustertrain.core.heartbeat_files import Heartbeat, HeartbeatFile, read_request
from clustertrain.core.run_paths import RunPaths

#: how many recent step times the typical step time is taken over (the first step of an attempt is left out)
STEP_WINDOW = 20


def flight_recorder_on() -> bool:
    """Whether torch keeps a flight recorder (its buffer size is set in the environment)."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        try:
            if int(os.environ.get(name, "0")) > 0:
                return True
        except ValueError:
            continue
    return False


class Beacon:
    """This rank's heartbeat writer (one per rank; :meth:`start` it once the rank knows who it is)."""

    def __init__(self, paths: RunPaths, rank: int, node: str, interval_s: float, job: str | None = None):
        self.paths, self.interval_s = paths, interval_s
        now = time.time()
        self.record = Heartbeat(rank=rank, node=node, host=socket.gethostname().split(".")[0], pid=os.getpid(),
                                job=job, since=now, alive=now)
        self._steps: deque[float] = deque(maxlen=STEP_WINDOW)
        self._first_step: float | None = None
        self._handled: str | None = None
        self._before: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: HeartbeatFile | None = None

    # -- the training loop's side: attribute writes only ----------------------------------------------
    def phase(self, name: str, step: int | None = None) -> None:
        """The rank enters phase ``name`` (of :data:`clustertrain.core.heartbeat_files.PHASES`)."""
        r = self.record
        if step is not None:
            r.step = step
        r.phase, r.beat, r.since = name, r.beat + 1, time.time()

    def step_done(self, seconds: float) -> None:
        """A step took ``seconds``; the typical step time is the mean of the recent ones, the first left out (it
        holds the warm-up) once there are others."""
        if self._first_step is None:
            self._first_step = seconds
        else:
            self._steps.append(seconds)
        self.record.step_time_s = round(sum(self._steps) / len(self._steps), 4) if self._steps else self._first_step

    def saved(self, seconds: float) -> None:
        """A checkpoint save took ``seconds`` from its start to its commit."""
        self.record.save_s = round(max(seconds, self.record.save_s or 0.0), 3)

    # -- the thread ----------------------------------------------------------------------------------
    def start(self) -> "Beacon":
        self._file = HeartbeatFile(self.paths.rank_heartbeat(self.record.rank))
        self._write()
        self._handled = getattr(read_request(self.paths), "id", None)  # a request older than this start is not ours
        self._before = self._handled
        self._thread = threading.Thread(target=self._run, name="clustertrain-beacon", daemon=True)
        self._thread.start()
        return self

    def close(self, outcome: str) -> None:
        """The rank leaves training: ``outcome`` is ``done`` or ``failed`` (its last record; the watchdog then
        knows it did not vanish)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 1)
        if self._file is not None:
            self.record.done = True
            self.phase(outcome)
            self._write()
            self._file.close()
            self._file = None

    def ended_by_watchdog(self) -> str | None:
        """The watchdog's request id when it is ending the ranks of this start (then a failure of this rank is its
        consequence: a peer left first), else None."""
        request = read_request(self.paths)
        return request.id if request is not None and request.id != self._before else None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write()
            self._serve()

    def _write(self) -> None:
        if self._file is None:
            return
        self.record.alive = time.time()
        try:
            self._file.write(self.record)
        except OSError:
            pass  # a heartbeat that cannot be written looks like a lost rank to the watchdog: nothing else to do

    def _serve(self) -> None:
        request = read_request(self.paths)
        if request is None or request.id == self._handled:
            return
        if request.dump:
            self.dump(Path(request.dir))
        if request.exit:
            print(f"[clustertrain] rank {self.record.rank}: the watchdog ends this rank (incident {request.id})",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(request.exit_code)
        self._handled = request.id

    def dump(self, incident: Path) -> None:
        """Write every thread's stack (and the flight recorder's dump) under ``incident``."""
        rank = self.record.rank
        try:
            stacks = incident / "stacks"
            stacks.mkdir(parents=True, exist_ok=True)
            tmp = stacks / f".rank{rank}.txt.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                r = self.record
                f.write(f"# rank {rank} on {r.node} (host {r.host}, pid {r.pid}): step {r.step}, phase {r.phase} "
                        f"for {time.time() - r.since:.1f} s\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
            os.replace(tmp, stacks / f"rank{rank}.txt")
            if flight_recorder_on():
                from torch._C._distributed_c10d import _dump_fr_trace_json

                flight = incident / "flight"
                flight.mkdir(parents=True, exist_ok=True)
                (flight / f"rank{rank}.json").write_bytes(_dump_fr_trace_json(includeCollectives=True))
        except Exception as e:  # noqa: BLE001 - the dump is evidence, never a reason to fail
            print(f"[clustertrain] rank {rank}: could not write its stack to {incident} ({e})", file=sys.stderr,
                  flush=True)
