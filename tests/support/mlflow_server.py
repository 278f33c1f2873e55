"""A real MLflow tracking server on 127.0.0.1 for tests: ``mlflow server`` (the venv's) with a SQLite backend store and
proxied artifacts under a temp directory, on a free port; ready when ``GET /health`` answers ``OK``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> "MlflowServer":
        self.root.mkdir(parents=True, exist_ok=True)
        mlflow = Path(sys.executable).parent / "mlflow"
        self.log = open(self.root / "server.log", "w")
        self.proc = subprocess.Popen(
            [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root,
            env={**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.read().strip() == b"OK":
                        return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server not ready in {timeout}s: {(self.root / 'server.log').read_text()[-2000:]}")

    def stop(self) -> None:
        """Stop the server and every process it started (its workers), by its process group."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc is not None:
            self.log.close()
