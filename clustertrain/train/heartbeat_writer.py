"""Each rank's heartbeat: what the rank is doing (step, phase), written by a thread of its own, and that thread's
answer to the watchdog's requests (dump the stacks, exit). Formats: :mod:`clustertrain.core.heartbeat_files`.

The training loop only sets attributes (:meth:`Beacon.phase`, :meth:`Beacon.step_done`): no I/O, no lock, no
syscall on the hot path.

On a GPU (:meth:`Beacon.use_device`) each phase boundary also records a CUDA event on the current stream (no timing:
``torch.cuda.Event()``, torch/cuda/streams.py), tagged with the step, the phase and its beat. The CPU queues kernels
ahead of the device, so the host's phase says where the CPU waits — with a stuck NCCL collective every rank's CPU
ends up blocked at the same sync, and the host phases blame no one. The beacon thread polls the events in order with
``Event.query()`` (``cudaEventQuery``: never blocks; torch's own NCCL watchdog watches collectives the same way, from
its own thread) and writes the last boundary the device has passed as ``device_phase``/``device_step``/
``device_beat``/``device_since``: the hang rules (:mod:`clustertrain.monitor.hang_rules`) then blame the rank whose
*device* has not reached the collective the other devices wait in. Events whose boundary has passed go back to a
free list and are recorded again: no allocation per phase once the pool is warm. The beacon thread writes the record every ``monitor.heartbeat_s`` with one ``pwrite``,
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
#: at most this many phase boundaries queued ahead of the device (the CPU never runs that far ahead: the step syncs
#: at least at each logged step); beyond it the oldest are dropped and the device phase skips ahead
MAX_PENDING = 4096


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
        self._device = None                                    # the CUDA device whose progress is tracked
        self._new_event = None                                 # () -> an unrecorded CUDA event
        self._pending: deque[tuple] = deque(maxlen=MAX_PENDING)  # (event, step, phase, beat), oldest first
        self._free: deque = deque()                            # events the device has passed: recorded again
        self._bound = False                                    # the beacon thread's current device is set

    def use_device(self, device) -> "Beacon":
        """Track the progress of ``device`` (a ``torch.device``; only CUDA devices are tracked) from the next
        phase boundary on. Call it once the rank's GPU is pinned (``torch.cuda.set_device``)."""
        if getattr(device, "type", None) == "cuda":
            import torch

            self._device = device
            self._new_event = torch.cuda.Event  # no timing, not blocking: the cheapest event
        return self

    # -- the training loop's side: attribute writes only ----------------------------------------------
    def phase(self, name: str, step: int | None = None) -> None:
        """The rank enters phase ``name`` (of :data:`clustertrain.core.heartbeat_files.PHASES`); on a GPU a CUDA
        event marks the boundary on the current stream."""
        r = self.record
        if step is not None:
            r.step = step
        r.phase, r.beat, r.since = name, r.beat + 1, time.time()
        if self._new_event is not None:
            event = self._free.pop() if self._free else self._new_event()
            event.record()
            self._pending.append((event, r.step, name, r.beat))

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
            self._new_event = None  # after a device error no CUDA call can be trusted: the last record is the host's
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
            self._poll_device()
            self._write()
            self._serve()

    def _poll_device(self) -> None:
        """Move the device fields to the last boundary the device has passed (events complete in the order they
        were recorded on a stream; the first one not passed ends the scan)."""
        if not self._pending:
            return
        passed = None
        try:
            if not self._bound:  # this thread's CUDA calls go to the rank's device (use_device may come after start)
                import torch

                torch.cuda.set_device(self._device)
                self._bound = True
            while self._pending and self._pending[0][0].query():
                passed = self._pending.popleft()
                self._free.append(passed[0])
        except Exception:  # noqa: BLE001 - a broken device: keep the last known device phase, keep writing
            return
        if passed is not None:
            r = self.record
            r.device_step, r.device_phase, r.device_beat, r.device_since = passed[1], passed[2], passed[3], time.time()

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
        """Write the flight recorder's dump (where torch keeps one) and every thread's stack under ``incident``; the
        stack file comes last: the watchdog reads both once it is there."""
        rank = self.record.rank
        try:
            if flight_recorder_on():
                try:
                    self._dump_flight(incident / "flight")
                except Exception as e:  # noqa: BLE001 - the stacks are still worth writing
                    print(f"[clustertrain] rank {rank}: no flight recorder dump ({e})", file=sys.stderr, flush=True)
            stacks = incident / "stacks"
            stacks.mkdir(parents=True, exist_ok=True)
            tmp = stacks / f".rank{rank}.txt.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                r = self.record
                f.write(f"# rank {rank} on {r.node} (host {r.host}, pid {r.pid}): step {r.step}, phase {r.phase} "
                        f"for {time.time() - r.since:.1f} s\n")
                if r.device_phase is not None:
                    f.write(f"# its GPU: {r.device_phase} of step {r.device_step} since "
                            f"{time.time() - (r.device_since or r.since):.1f} s\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
            os.replace(tmp, stacks / f"rank{rank}.txt")
        except Exception as e:  # noqa: BLE001 - the dump is evidence, never a reason to fail
            print(f"[clustertrain] rank {rank}: could not write its stack to {incident} ({e})", file=sys.stderr,
                  flush=True)

    def _dump_flight(self, flight: Path) -> None:
        """The pickle torch's own analyser reads (torch/distributed/flight_recorder/components/loader.py
        ``read_dump``: one file per rank named ``<prefix><rank>``); gloo records into it too in torch 2.13."""
        from torch._C._distributed_c10d import _dump_fr_trace

        flight.mkdir(parents=True, exist_ok=True)
        tmp = flight / f".rank{self.record.rank}.tmp"
        tmp.write_bytes(_dump_fr_trace(includeCollectives=True))
        os.replace(tmp, flight / f"rank{self.record.rank}")
