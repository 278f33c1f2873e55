"""Fault injection against moto's S3 server: a killed sync, a vanished endpoint, abandoned uploads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertrain.storage import StoreConfig, sync, verify
from tests.support.faults import CuttableProxy
from tests.support.s3server import dummy_env

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-c", "from clustertrain.cli.storage import app; app()"]


def make_tree(root: Path, n: int) -> None:
    for i in range(n):
        p = root / f"d{i % 8}" / f"f{i:04d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(200 + i))


def count_objects(client, bucket: str, prefix: str) -> int:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sum(len(page.get("Contents", [])) for page in pages)


def manifest_exists(client, bucket: str, key: str) -> bool:
    return "Contents" in client.list_objects_v2(Bucket=bucket, Prefix=key)


def start_sync(src: Path, url: str, endpoint: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, "sync", str(src), url, "--endpoint-url", endpoint, "--jobs", "2"],
        env=dummy_env(PYTHONPATH=str(ROOT), **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for_objects(client, bucket, prefix, at_least: int, proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        n = count_objects(client, bucket, prefix)
        if n >= at_least:
            return n
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.02)
    raise AssertionError("sync made no progress")


def test_killed_sync_resumes_with_only_the_rest(tmp_path, bucket, options, s3_client):
    src = tmp_path / "src"
    make_tree(src, 300)
    url = f"s3://{bucket}/k"
    proc = start_sync(src, url, options.endpoint_url)
    wait_for_objects(s3_client, bucket, "k/", 40, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    present = count_objects(s3_client, bucket, "k/")
    assert 40 <= present < 300 and not manifest_exists(s3_client, bucket, "k/.clustertrain-manifest.json")
    # a multipart upload abandoned by the dead process (made directly: small files never go multipart)
    upload = s3_client.create_multipart_upload(Bucket=bucket, Key="k/huge.bin")
    s3_client.upload_part(Bucket=bucket, Key="k/huge.bin", UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * 1024)
    resumed = sync(src, url, options=options)
    assert resumed.transferred_files == 300 - present
    assert resumed.cleaned_incomplete == 1 and not s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert verify(url, options=options).ok


def test_endpoint_vanishing_mid_sync_fails_cleanly(tmp_path, bucket, options, s3_client):
    src = tmp_path / "src"
    make_tree(src, 300)
    host, port = options.endpoint_url.removeprefix("http://").split(":")
    proxy = CuttableProxy((host, int(port)))
    url = f"s3://{bucket}/cut"
    proc = start_sync(src, url, proxy.endpoint, AWS_MAX_ATTEMPTS="2")
    try:
        wait_for_objects(s3_client, bucket, "cut/", 30, proc)
    finally:
        proxy.close()  # the endpoint goes away: open connections reset, new ones refused
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert stderr.count("\n") == 1 and "cannot reach the S3 endpoint" in stderr and "Traceback" not in stderr
    assert count_objects(s3_client, bucket, "cut/") < 300
    assert not manifest_exists(s3_client, bucket, "cut/.clustertrain-manifest.json")
    assert sync(src, url, options=StoreConfig(endpoint_url=options.endpoint_url)).manifest_written
    assert verify(url, options=options).ok
