"""sync / verify / restore against moto's S3 server over real HTTP."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clustertrain.core.errors import StorageError
from clustertrain.storage import (
    StoreConfig,
    backup_directory,
    restore_directory,
    sync,
    verify,
)
from tests.support.s3server import dummy_env

pytestmark = pytest.mark.slow
CLI = ["-c", "from clustertrain.cli.storage import app; app()"]
ROOT = Path(__file__).resolve().parents[3]


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(env or dummy_env(), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *CLI, *args], capture_output=True, text=True, env=env, timeout=120)


def tree_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".clustertrain-")
    }


def make_small_tree(root: Path, n: int) -> None:
    for i in range(n):
        p = root / f"shard{i % 10:02d}" / f"file-{i:04d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(64 + i % 500))
        os.utime(p, ns=(1_700_000_000_000_000_000 + i, 1_700_000_000_000_000_000 + i))  # older than the racy window


def test_round_trip_1000_small_and_large_files(tmp_path, bucket, options, s3_client):
    src, back = tmp_path / "src", tmp_path / "back"
    make_small_tree(src, 1000)
    for i in range(3):  # the "a few 50 MB files"
        (src / f"big-{i}.bin").write_bytes(os.urandom(50 * 2**20 + 123))  # multipart at 5 MiB parts
        os.utime(src / f"big-{i}.bin", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    url = f"s3://{bucket}/run1"
    up = backup_directory(src, url, options=options, jobs=8)
    assert up.ok and up.sync.transferred_files == 1003 and up.sync.manifest_written
    head = s3_client.head_object(Bucket=bucket, Key="run1/big-0.bin", ChecksumMode="ENABLED")
    big_sha = hashlib.sha256((src / "big-0.bin").read_bytes()).hexdigest()
    assert head["Metadata"]["sha256"] == big_sha and head.get("ChecksumSHA256")  # S3 kept its own (per-part) SHA256
    small = s3_client.head_object(Bucket=bucket, Key="run1/shard00/file-0000.bin", ChecksumMode="ENABLED")
    small_sha = hashlib.sha256((src / "shard00/file-0000.bin").read_bytes()).digest()
    assert small["ChecksumSHA256"] == base64.b64encode(small_sha).decode()
    again = sync(src, url, options=options)
    assert again.transferred_bytes == 0 and not again.manifest_written and again.hashed_files == 0
    down = restore_directory(url, back, options=options)
    assert down.transferred_files == 1003
    assert tree_files(back) == tree_files(src)
    assert (back / "big-1.bin").stat().st_mtime_ns == (src / "big-1.bin").stat().st_mtime_ns
    assert restore_directory(url, back, options=options).transferred_bytes == 0


def test_changes_delete_and_dry_run(tmp_path, bucket, options, s3_client):
    src = tmp_path / "src"
    make_small_tree(src, 20)
    url = f"s3://{bucket}/p"
    sync(src, url, options=options)
    s3_client.put_object(Bucket=bucket, Key="p/foreign.txt", Body=b"not ours")
    (src / "shard01" / "file-0001.bin").unlink()
    (src / "shard02" / "file-0002.bin").write_bytes(b"new content")
    (src / "added.bin").write_bytes(b"added")
    dry = run_cli("sync", str(src), url, "--delete", "--dry-run", "--endpoint-url", options.endpoint_url)
    assert dry.returncode == 0, dry.stderr
    assert "send    added.bin" in dry.stdout and "delete  shard01/file-0001.bin" in dry.stdout
    assert "foreign.txt" not in dry.stdout.replace("kept    foreign.txt", "")
    keys = {o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert "p/shard01/file-0001.bin" in keys and "p/added.bin" not in keys  # dry run changed nothing
    done = sync(src, url, delete=True, options=options)
    assert done.transferred_files == 2 and done.deleted == 1 and done.plan.kept == ["foreign.txt"]
    result = verify(url, options=options)
    assert result.extra == ["foreign.txt"] and not result.missing and not result.corrupt


def test_overwrite_behind_our_back_is_named(tmp_path, bucket, options, s3_client):
    src = tmp_path / "src"
    make_small_tree(src, 10)
    url = f"s3://{bucket}/v"
    sync(src, url, options=options)
    assert verify(url, options=options).ok
    s3_client.put_object(Bucket=bucket, Key="v/shard03/file-0003.bin", Body=b"evil")  # no metadata, new size
    victim = src / "shard04" / "file-0004.bin"
    forged = bytes(b ^ 1 for b in victim.read_bytes())  # same size, forged metadata
    meta = {"sha256": hashlib.sha256(victim.read_bytes()).hexdigest()}
    s3_client.put_object(Bucket=bucket, Key="v/shard04/file-0004.bin", Body=forged, Metadata=meta)
    s3_client.delete_object(Bucket=bucket, Key="v/shard05/file-0005.bin")
    quick = verify(url, options=options)
    assert quick.missing == ["shard05/file-0005.bin"]
    assert dict(quick.corrupt)["shard03/file-0003.bin"].startswith("size 4")
    full = verify(url, options=options, full=True)
    assert [k for k, _ in full.corrupt] == ["shard03/file-0003.bin", "shard04/file-0004.bin"]
    res = run_cli("verify", url, "--full", "--endpoint-url", options.endpoint_url)
    assert res.returncode == 2 and "corrupt  shard04/file-0004.bin" in res.stdout
    repaired = sync(src, url, options=options)
    assert repaired.transferred_files == 3 and verify(url, options=options, full=True).ok


def test_bad_input_one_line_errors(tmp_path, bucket, options, s3_endpoint):
    src = tmp_path / "src"
    make_small_tree(src, 2)
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
        sync(src, "s3://no-such-bucket/x", options=options)
    res = run_cli("sync", str(src), f"s3://{bucket}/x", "--endpoint-url", s3_endpoint,
                  env={k: v for k, v in dummy_env().items() if "ACCESS_KEY" not in k})
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "no AWS credentials found" in res.stderr
    res = run_cli("sync", str(src), f"s3://{bucket}/x", "--endpoint-url", s3_endpoint, "--profile", "nope")
    assert res.returncode == 2 and "AWS profile 'nope'" in res.stderr
    (tmp_path / "m.json").write_text("[1, 2]")
    sync(src, f"s3://{bucket}/y", options=options)
    res = run_cli("verify", f"s3://{bucket}/y", "--manifest", str(tmp_path / "m.json"), "--endpoint-url", s3_endpoint)
    assert res.returncode == 2 and "is not a clustertrain manifest" in res.stderr
    with pytest.raises(StorageError, match="has no .clustertrain-manifest.json"):
        restore_directory(f"s3://{bucket}/empty", tmp_path / "r", options=options)
    long_name = src / ("n" * 250)
    long_name.write_text("x")
    with pytest.raises(StorageError, match="at most"):
        sync(src, f"s3://{bucket}/{'p/' * 400}", options=options)


def test_endpoint_from_environment(tmp_path, bucket, s3_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)  # honoured like every boto3 tool
    src = tmp_path / "src"
    make_small_tree(src, 3)
    assert sync(src, f"s3://{bucket}/env", options=StoreConfig()).transferred_files == 3
    assert verify(f"s3://{bucket}/env").ok


def test_files_below_the_multipart_threshold_go_as_one_put_with_a_full_object_checksum(tmp_path, bucket, s3_endpoint,
                                                                                      s3_client):
    """Default options: a 12 MiB file (above the 8 MiB part size, below the 64 MiB threshold) is one PUT, so S3's
    SHA256 checksum covers the whole object and equals the manifest's; at a 5 MiB threshold it goes multipart and
    S3's checksum is a composite of parts (``...-N``)."""
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(12 * 2**20)
    (src / "shard.bin").write_bytes(data)
    digest = hashlib.sha256(data).digest()
    for threshold, prefix in ((64, "one-put"), (5, "multipart")):
        opts = StoreConfig(endpoint_url=s3_endpoint, multipart_threshold_mb=threshold)
        assert sync(src, f"s3://{bucket}/{prefix}", options=opts).transferred_files == 1
        head = s3_client.head_object(Bucket=bucket, Key=f"{prefix}/shard.bin", ChecksumMode="ENABLED")
        assert head["Metadata"]["sha256"] == digest.hex()
        if threshold == 64:
            assert head["ChecksumSHA256"] == base64.b64encode(digest).decode() and "-" not in head["ETag"]
        else:
            assert head["ETag"].strip('"').endswith("-2")
        assert verify(f"s3://{bucket}/{prefix}", options=opts).ok
