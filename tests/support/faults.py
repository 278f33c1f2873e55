"""Faults for the drills: a TCP proxy that can be cut mid-transfer and brought back (an endpoint that disappears),
and a SIGKILL of every process of a Slurm job at once (:func:`sigkill_slurm_job`).

``CuttableProxy((host, port))`` forwards ``127.0.0.1:<proxy.port>`` to the upstream server with plain sockets and
threads. It counts the bytes each way (``sent``: client to server, ``received``) and the connections it served.
``cut()`` (or ``cut_after=N`` bytes sent, to cut at a chosen point of a transfer) resets every open connection;
while cut, each new connection is accepted and reset at once and counted in ``refused`` (so a client's retries
can be counted). ``restore()`` forwards again on the same port. ``rate`` (bytes/s per connection, client to
server) slows uploads enough to cut them part-way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import threading
import time

import psutil

_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a TCP reset


class CuttableProxy:
    """Forward a local port to ``upstream`` until :meth:`close`; :meth:`cut` and :meth:`restore` in between."""

    def __init__(self, upstream: tuple[str, int], *, rate: float | None = None, cut_after: int | None = None):
        self.upstream, self.rate, self.cut_after = upstream, rate, cut_after
        self.sent = self.received = self.connections = self.refused = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._down = threading.Event()
        self._closed = False
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    # -- control ----------------------------------------------------------------------------------
    def cut(self) -> None:
        """Reset every open connection; new ones are reset on arrival until :meth:`restore`."""
        self._down.set()
        with self._lock:
            socks, self._open = self._open, []
        for sock in socks:
            _reset(sock)

    def restore(self) -> None:
        """Forward again (counters keep counting; :meth:`reset_counts` to start afresh)."""
        self.cut_after = None
        self._down.clear()

    def reset_counts(self) -> None:
        with self._lock:
            self.sent = self.received = self.connections = self.refused = 0

    @property
    def is_cut(self) -> bool:
        return self._down.is_set()

    def wait_cut(self, timeout: float) -> bool:
        return self._down.wait(timeout)

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> "CuttableProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- forwarding -------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down.is_set():
                with self._lock:
                    self.refused += 1
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self.connections += 1
                self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        chunk = 16384 if self.rate else 65536
        try:
            while data := src.recv(chunk):
                if self._down.is_set():
                    break
                dst.sendall(data)
                if self._count(len(data), upstream):
                    self.cut()
                    break
                if upstream and self.rate:
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def _count(self, n: int, upstream: bool) -> bool:
        """Count ``n`` bytes; True when they crossed ``cut_after``."""
        with self._lock:
            if upstream:
                self.sent += n
            else:
                self.received += n
            return upstream and self.cut_after is not None and self.sent >= self.cut_after


def _reset(sock: socket.socket) -> None:
    """Drop a connection abruptly: the shutdown wakes a pump thread blocked on it, the close sends a reset."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def sigkill_slurm_job(job_id: str) -> list[int]:
    """SIGKILL every process of a Slurm job on this machine at the same moment — the batch script, srun, every
    rank and whatever they started (all carry ``SLURM_JOB_ID``) — as the OOM killer or a node losing power would;
    Slurm is not told. (``scancel --signal=KILL`` cannot do it on the emulated cluster: ``--full`` reaches the batch
    script and the srun clients, whose remote tasks then get the job's SIGTERM and save a checkpoint; ``JOB.0``
    kills the ranks but leaves the batch script to react.) Returns the PIDs killed."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("SLURM_JOB_ID") == job_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    for proc in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    return [p.pid for p in found]
