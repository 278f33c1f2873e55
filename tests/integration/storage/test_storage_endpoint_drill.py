"""Fault drill 3 of issue 18, `clustertrain storage sync` side: the S3 endpoint disappears mid-transfer (a proxy
between boto3 and moto's server is cut): botocore retries (standard mode, counted at the proxy), then one line
naming the endpoint and the bucket, exit 2, in bounded time; once the endpoint is back, the same command sends
only what is missing (counted in bytes through the proxy). The checkpoint-backup side:
tests/integration/train/test_fault_drills_storage.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertrain.storage import StoreConfig, verify
from clustertrain.storage.s3 import DEFAULT_ATTEMPTS
from clustertrain.storage.store import is_ours
from clustertrain.core.checkpoint_format import find_latest
from tests.support.faults import CuttableProxy
from tests.support.s3server import dummy_env
from tests.support.training import metrics, run_cli

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
FILES, SIZE = 40, 32 * 1024
REQUEST_OVERHEAD = 2048  # headers of one request (auth, checksum, metadata), generous


def sync_cli(src: Path, url: str, endpoint: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clustertrain", "storage", "sync", str(src), url, "--endpoint-url",
                           endpoint], capture_output=True, text=True, env=dummy_env(PYTHONPATH=str(ROOT)), timeout=120)


def objects(client, bucket: str, prefix: str) -> dict[str, int]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"].removeprefix(prefix): o["Size"] for page in pages for o in page.get("Contents", [])}


def test_endpoint_cut_mid_sync_is_retried_then_one_line_and_the_rerun_sends_only_the_rest(
        tmp_path, bucket, s3_client, s3_endpoint):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(FILES):
        (src / f"f{i:02d}.bin").write_bytes(os.urandom(SIZE))
    url, prefix = f"s3://{bucket}/drill", "drill/"
    host, port = s3_endpoint.removeprefix("http://").split(":")
    with CuttableProxy((host, int(port)), rate=256 * 1024, cut_after=FILES * SIZE // 3) as proxy:
        started = time.monotonic()
        first = sync_cli(src, url, proxy.endpoint)
        seconds = time.monotonic() - started
        assert proxy.is_cut, first.stdout + first.stderr
        assert first.returncode == 2, first.stdout + first.stderr
        [line] = [ln for ln in first.stderr.splitlines() if ln.strip()]
        assert line.startswith(f"error: cannot reach the S3 endpoint {proxy.endpoint} to upload s3://{bucket}/drill/f")
        assert f"up to {DEFAULT_ATTEMPTS} attempts in " in line and "run the same command again" in line
        assert proxy.refused >= DEFAULT_ATTEMPTS - 1  # the retries came, each reset by the vanished endpoint
        assert seconds < 30  # bounded: refused attempts back off for under a second each request
        landed = objects(s3_client, bucket, prefix)
        assert 0 < len(landed) < FILES and ".clustertrain-manifest.json" not in landed

        proxy.restore()
        proxy.reset_counts()
        second = sync_cli(src, url, proxy.endpoint)
        assert second.returncode == 0, second.stdout + second.stderr
        missing = FILES - len(landed)
        assert f"sent {missing} files ({missing * SIZE} B)" in second.stdout
        # what crossed the wire: the missing files, their requests, the HEADs of the landed ones, the manifest
        overhead = (FILES + 4) * REQUEST_OVERHEAD + 16 * 1024
        assert missing * SIZE <= proxy.sent < missing * SIZE + overhead, (proxy.sent, missing * SIZE)
    assert verify(url, options=StoreConfig(endpoint_url=s3_endpoint)).ok


PROJECT = """
name: drill
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: 2, threads_per_worker: 1}}
storage: {{root: {root}, checkpoint_bucket: "s3://{bucket}/ckpts", endpoint_url: "{endpoint}"}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 4, micro_batch: 4, global_batch: 8, checkpoint_every: 4, log_every: 1}}
"""


def test_endpoint_cut_during_checkpoint_backup_leaves_training_alone_and_the_retry_sends_the_rest(
        tmp_path, bucket, s3_client, s3_endpoint):
    host, port = s3_endpoint.removeprefix("http://").split(":")
    with CuttableProxy((host, int(port)), rate=256 * 1024, cut_after=160 * 1024) as proxy:
        project = tmp_path / "p.yaml"
        project.write_text(PROJECT.format(root=json.dumps(str(tmp_path / "fsx")), bucket=bucket,
                                          endpoint=proxy.endpoint))
        run_dir = tmp_path / "run"
        res = run_cli("run", str(project), "--run-dir", str(run_dir), env=dummy_env())
        assert res.returncode == 0, res.stdout  # a failed backup never fails the run
        assert proxy.is_cut and [r["step"] for r in metrics(run_dir)] == [1, 2, 3, 4]
        ckpt = run_dir / "checkpoints" / "step_00000004"
        assert find_latest(run_dir / "checkpoints") == ckpt  # the checkpoint itself is intact on the file system
        url = f"s3://{bucket}/ckpts/drill/tiny/step_00000004"
        [line] = [ln for ln in res.stdout.splitlines() if "FAILED" in ln]
        assert f"backup of step_00000004 to {url} FAILED: cannot reach the S3 endpoint {proxy.endpoint} to " in line
        assert f"up to {DEFAULT_ATTEMPTS} attempts in " in line and "training goes on" in line
        status = json.loads((run_dir / "status.json").read_text())
        assert status["backup_state"] == "failed" and status["backup"] is None
        assert status["backup_error"].startswith(f"cannot reach the S3 endpoint {proxy.endpoint} to upload {url}/")
        landed = objects(s3_client, bucket, "ckpts/drill/tiny/step_00000004/")
        assert ".clustertrain-manifest.json" not in landed  # an interrupted copy never counts as complete

        retry = shlex.split(line.split("(retry by hand: ")[1].removesuffix(")"))
        assert retry[:5] == ["clustertrain", "storage", "sync", str(ckpt), url]
        assert retry[5:] == ["--endpoint-url", proxy.endpoint]
        proxy.restore()
        proxy.reset_counts()
        again = run_cli(*retry[1:], env=dummy_env())
        assert again.returncode == 0, again.stdout
        files = {p.name: p.stat().st_size for p in ckpt.iterdir() if not is_ours(p.name)}  # not the hash cache
        missing = {k: v for k, v in files.items() if k not in landed}
        assert missing and f"sent {len(missing)} files ({sum(missing.values())} B)" in again.stdout
        assert proxy.sent < sum(missing.values()) + (len(files) + 4) * REQUEST_OVERHEAD + 16 * 1024
    assert verify(url, options=StoreConfig(endpoint_url=s3_endpoint)).ok
