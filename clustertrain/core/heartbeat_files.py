"""Each rank's heartbeat and the watchdog's requests to the ranks: the files under ``RUN_DIR/heartbeat/``.

``heartbeat/rank<R>.json`` (:class:`Heartbeat`; written by rank R's beacon thread,
:class:`clustertrain.train.heartbeat_writer.Beacon`): one JSON object, space-padded to :data:`RECORD_BYTES` and written in
place with one ``pwrite`` at offset 0 every ``monitor.heartbeat_s`` (no file is created or renamed after the first
write: on Lustre that is one data RPC, not metadata operations)::

    {"version": 1, "rank": 3, "node": "node2", "host": "ip-10-0-1-23", "pid": 4242, "job": "42", "step": 120,
     "phase": "backward", "beat": 9876, "since": 1795000123.4, "alive": 1795000125.0, "step_time_s": 0.42,
     "save_s": 12.3, "done": false, "device_step": 120, "device_phase": "forward", "device_beat": 9874,
     "device_since": 1795000121.0}

``step`` is the step being trained (the last finished one + 1), ``phase`` what the rank does in it (:data:`PHASES`),
``beat`` counts the phases the rank has entered since it started: the ranks run the same program, so in lockstep
they pass the same beats, and a rank with a lower ``beat`` than its peers is *behind*. ``since`` is when the phase
began (the main thread's clock), ``alive`` when the beacon last wrote (the beacon thread: it keeps writing while
the main thread is stuck in a collective, and stops when the process or its node is gone). ``step_time_s`` and
``save_s`` are the rank's latest mean step time and checkpoint save time (the watchdog derives its bounds from
them). ``device_*`` (a rank training on a GPU, :meth:`clustertrain.train.heartbeat_writer.Beacon.use_device`):
where its *device* is — the last phase boundary (``device_phase`` of ``device_step``, entered at beat ``device_beat``)
whose CUDA event the device has passed, and when the beacon saw it pass (``device_since``). The CPU queues kernels
ahead of the device, so with CUDA the host's ``phase`` says where the CPU waits (often the same place on every rank:
the next sync), while ``device_phase`` says where the GPU is; ``device_beat`` <= ``beat``, equal when the device has
caught up. ``done``: the rank left training; its ``phase`` is then one of :data:`ENDINGS`. ``host`` is the machine's own host name (on ParallelCluster the
instance's, e.g. ``ip-10-0-1-23``; the Slurm node name ``node`` is a slot another instance may take).

``heartbeat/request.json`` (:class:`Request`; written by the watchdog with :func:`write_atomic`): every rank's beacon
reads it at each tick and acts on a request id it has not acted on: ``dump`` writes the rank's Python stacks (all
threads, :mod:`faulthandler`) to ``<dir>/stacks/rank<R>.txt`` and, where torch's flight recorder is on
(``TORCH_FR_BUFFER_SIZE``/``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0), its dump to ``<dir>/flight/rank<R>`` (torch's pickle, what its analyser reads);
``exit`` then ends the process with ``exit_code`` (the main thread may be stuck inside a collective: only a
thread of its own can end it)::

    {"version": 1, "id": "20261123-101112", "dir": "RUN_DIR/incidents/20261123-101112", "dump": true, "exit": true,
     "exit_code": 75, "time": 1795000200.0}

``heartbeat/step-ended``: an empty file the batch script touches when the ranks' step has ended (the watchdog
then decides and leaves: :func:`clustertrain.monitor.hang_watchdog.serve`).

Readers are lenient: a record cut by a concurrent write or a foreign file reads as none.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pydantic import Field, ValidationError

from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.core.schema import StoredModel

RECORD_BYTES = 512
#: what a rank can be doing, in the order of one step (``startup`` before the first; ``upload``: rank 0 waiting for the
#: last checkpoint's backup after training)
PHASES = ("startup", "data", "forward", "backward", "optimizer", "collective", "checkpoint", "upload")
#: the last record of a rank that left training: ``done`` (trained or stopped as asked), ``error`` (stopped with its
#: own one-line reason: bad input, a diverged run, a full disk — running it again fails the same way), ``failed``
#: (an exception: a peer vanished, a device error...)
ENDINGS = ("done", "error", "failed")
#: the exit code of a rank the watchdog ended (EX_TEMPFAIL: the job may be run again)
EXIT_WATCHDOG = 75


class Heartbeat(StoredModel):
    """One rank's heartbeat (see the module docstring)."""

    version: int = 1
    rank: int
    node: str
    host: str | None = None
    pid: int | None = None
    job: str | None = None
    step: int = 0
    phase: str = "startup"
    beat: int = 0
    since: float = Field(default_factory=time.time)
    alive: float = Field(default_factory=time.time)
    step_time_s: float | None = None
    save_s: float | None = None
    done: bool = False
    # where the rank's GPU is (None: no CUDA device, or none of its marks passed yet): see the module docstring
    device_step: int | None = None
    device_phase: str | None = None
    device_beat: int | None = None
    device_since: float | None = None

    def encode(self) -> bytes:
        data = self.model_dump_json().encode("utf-8")
        if len(data) >= RECORD_BYTES:  # a very long node name: drop the optional fields rather than grow
            data = self.model_copy(update={"host": None}).model_dump_json().encode("utf-8")[: RECORD_BYTES - 1]
        return data.ljust(RECORD_BYTES - 1) + b"\n"


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The heartbeat in ``path``, or None (missing, or cut by a write in progress)."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace").strip()
        return Heartbeat.model_validate(json.loads(text))
    except (OSError, ValueError, ValidationError):
        return None


def read_heartbeats(paths: RunPaths) -> dict[int, Heartbeat]:
    """rank -> its heartbeat, for every rank that has written one."""
    out: dict[int, Heartbeat] = {}
    if not paths.heartbeat.is_dir():
        return out
    for f in paths.heartbeat.glob("rank*.json"):
        beat = read_heartbeat(f)
        if beat is not None:
            out[beat.rank] = beat
    return dict(sorted(out.items()))


def clear_heartbeats(paths: RunPaths) -> None:
    """Remove the heartbeats and the request of an earlier start of the ranks (the launcher does it before each start,
    so that every heartbeat the watchdog reads belongs to this one)."""
    if paths.heartbeat.is_dir():
        for f in paths.heartbeat.iterdir():
            if f.is_file():
                f.unlink(missing_ok=True)


class Request(StoredModel):
    """The watchdog's request to every rank (see the module docstring)."""

    version: int = 1
    id: str
    dir: str
    dump: bool = True
    exit: bool = False
    exit_code: int = EXIT_WATCHDOG
    time: float = Field(default_factory=time.time)


def request_path(paths: RunPaths) -> Path:
    return paths.heartbeat / "request.json"


def write_request(paths: RunPaths, request: Request) -> None:
    write_atomic(request_path(paths), request.model_dump_json() + "\n")


def read_request(paths: RunPaths) -> Request | None:
    try:
        return Request.model_validate_json(request_path(paths).read_bytes())
    except (OSError, ValueError, ValidationError):
        return None


class HeartbeatFile:
    """One rank's heartbeat file, opened once and rewritten in place (the beacon's writer)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def write(self, beat: Heartbeat) -> None:
        os.pwrite(self.fd, beat.encode(), 0)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
