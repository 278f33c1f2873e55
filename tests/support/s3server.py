"""Start moto's S3 server on 127.0.0.1 (real HTTP) for tests and benches (a proxy that cuts the connection:
:class:`tests.support.faults.CuttableProxy`).

``s3_server()`` yields the endpoint URL of a fresh ``moto_server`` on a free port and stops it after; ``serve()``
is its start / readiness poll / stop, shared with :func:`tests.support.moto_cfn.cfn_server`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
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
def serve(command: list[str], port: int, timeout_s: float = 20.0, cwd: Path | None = None,
          log: Path | None = None) -> Iterator[str]:
    """Run a moto server ``command`` that listens on 127.0.0.1:``port``; yields its endpoint URL once it answers
    (``/moto-api/``), terminates it after. Its output goes to ``log`` (its tail is in the error if it dies before
    answering), else nowhere."""
    out = log.open("wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT if log else subprocess.DEVNULL, cwd=cwd)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log else ""
                raise RuntimeError(f"{' '.join(command[:3])} exited with {proc.returncode} before listening on {port}"
                                   + (f":\n{tail}" if tail else ""))
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not answer on {endpoint} within {timeout_s} s") from None
                time.sleep(0.05)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            out.close()


@contextlib.contextmanager
def s3_server(timeout_s: float = 20.0) -> Iterator[str]:
    """Run moto's S3 server; yields its endpoint URL (``http://127.0.0.1:PORT``)."""
    port = free_port()
    with serve(_server_command(port), port, timeout_s) as endpoint:
        yield endpoint


def dummy_env(**extra: str) -> dict[str, str]:
    """The current environment with dummy AWS credentials and no shared config files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(DUMMY_ENV, AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, **extra)
    return env


@contextlib.contextmanager
def dummy_environ(**extra: str) -> Iterator[None]:
    """os.environ as :func:`dummy_env` gives it (dummy credentials, no AWS config files, plus ``extra``) inside the
    block, and exactly as before after it: for fixtures whose moto server and boto3 clients read the environment."""
    saved, env = dict(os.environ), dummy_env(**extra)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
