"""Start moto's S3 server on 127.0.0.1 (real HTTP) for tests and benches, plus a cuttable TCP proxy.

``s3_server()`` yields the endpoint URL of a fresh ``moto_server`` on a free port and stops it after.
``TcpProxy`` forwards a local port to the server; ``stop()`` drops every connection and the listener,
which is what a client sees when the endpoint goes away mid-transfer.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_command(port: int) -> list[str]:
    exe = Path(sys.executable).with_name("moto_server")
    if exe.exists():
        return [str(exe), "-H", "127.0.0.1", "-p", str(port)]
    found = shutil.which("moto_server")
    return [found, "-H", "127.0.0.1", "-p", str(port)] if found else [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


@contextlib.contextmanager
def s3_server(timeout_s: float = 20.0) -> Iterator[str]:
    """Run moto's S3 server; yields its endpoint URL (``http://127.0.0.1:PORT``)."""
    port = free_port()
    proc = subprocess.Popen(_server_command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {proc.returncode} before listening on {port}")
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not answer on {endpoint} within {timeout_s} s") from None
                time.sleep(0.05)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class TcpProxy:
    """Forward 127.0.0.1:<port> to ``upstream`` (host, port) until :meth:`stop`."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._stopped:
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        """Close the listener and every open connection (clients then get resets / refusals)."""
        self._stopped = True
        with self._lock:
            socks, self._sockets = self._sockets, []
        with contextlib.suppress(OSError):
            self._listener.close()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def dummy_env(**extra: str) -> dict[str, str]:
    """The current environment with dummy AWS credentials and no shared config files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(DUMMY_ENV, AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, **extra)
    return env
