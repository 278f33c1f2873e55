"""Fast tests of the storage stage without a server: URLs, key rules, manifest format, local scans,
local->local sync/verify and the CLI's exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clustertrain.cli.storage import app
from clustertrain.core.errors import StorageError
from clustertrain.storage import (
    MANIFEST_NAME,
    FileStore,
    LocalPaths,
    Manifest,
    S3Store,
    StoreConfig,
    open_store,
    scan_directory,
    sync,
    verify,
)
from clustertrain.storage.manifest import parse_manifest
from clustertrain.storage.store import check_key


def make_tree(root: Path, n: int = 12) -> None:
    for i in range(n):
        p = root / f"d{i % 3}" / f"f {i}.txt"  # space on purpose
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(50 + i))


def test_open_store_picks_backend(tmp_path):
    assert isinstance(open_store(str(tmp_path)), FileStore)
    assert open_store(f"file://{tmp_path}").root == tmp_path
    store = open_store("s3://my-bucket/some/prefix/", StoreConfig(endpoint_url="http://127.0.0.1:1"))
    assert isinstance(store, S3Store) and store.bucket == "my-bucket" and store.prefix == "some/prefix/"
    assert store.key_limit == 1024 - len("some/prefix/")


@pytest.mark.parametrize(
    "url, needle",
    [("gs://b/p", "unknown storage URL scheme 'gs://'"), ("s3://", "names no bucket"),
     ("s3://Bad_Bucket/x", "not a valid S3 bucket name"), ("file://rel/path", "absolute path")],
)
def test_open_store_rejects_bad_urls(url, needle):
    with pytest.raises(StorageError, match=needle) as err:
        open_store(url)
    assert "\n" not in str(err.value)


def test_store_config_is_strict():
    with pytest.raises(ValueError):
        StoreConfig(part_size_mb=4)  # below S3's 5 MiB minimum
    with pytest.raises(ValueError):
        StoreConfig(multipart_threshold_mb=4)  # a multipart upload of a smaller file would need parts < 5 MiB
    with pytest.raises(ValueError):
        StoreConfig(aws_secret_access_key="x")  # credentials are never configuration


@pytest.mark.parametrize("key", ["a/../b", "/abs", "a//b", "tab\there", "bad\udcff"])
def test_check_key_rejects(key):
    with pytest.raises(StorageError):
        check_key(key)


def test_check_key_length_against_s3_prefix():
    store = open_store("s3://bucket-x/" + "p" * 1000, StoreConfig(endpoint_url="http://127.0.0.1:1"))
    check_key("a" * 23, store)
    with pytest.raises(StorageError, match="at most 23 bytes"):
        check_key("a" * 24, store)


def test_manifest_round_trip_and_foreign_files():
    m = Manifest(files=[{"path": "a", "size": 1, "sha256": "0" * 64, "mtime_ns": 5}])
    assert parse_manifest(m.to_json(), "x").files == m.files
    with pytest.raises(StorageError, match="not a clustertrain manifest"):
        parse_manifest(b"\x00garbage", "m.json")
    with pytest.raises(StorageError, match="not a clustertrain manifest"):
        parse_manifest(json.dumps({"format": "other", "files": []}), "m.json")
    with pytest.raises(StorageError, match="version 9"):
        parse_manifest(json.dumps({"format": "clustertrain-manifest", "version": 9, "files": []}), "m.json")
    newer = json.loads(m.to_json()) | {"future_field": 1}
    assert parse_manifest(json.dumps(newer), "x").files == m.files  # stored state is lenient


def test_scan_rehashes_only_changed_files(tmp_path):
    make_tree(tmp_path)
    manifest, hashed = scan_directory(tmp_path)
    assert hashed == 12 and len(manifest.files) == 12
    old = {e.path: e for e in manifest.files}
    for e in manifest.files:  # age the files past the racy window so the cache keeps them
        os.utime(tmp_path / e.path, ns=(e.mtime_ns - 10**10, e.mtime_ns - 10**10))
    scan_directory(tmp_path)
    manifest, hashed = scan_directory(tmp_path)
    assert hashed == 0
    target = tmp_path / "d0" / "f 0.txt"
    st = target.stat()
    target.write_bytes(b"x" * st.st_size)  # same size, new mtime
    manifest, hashed = scan_directory(tmp_path)
    assert hashed == 1
    assert {e.path: e.sha256 for e in manifest.files}["d0/f 0.txt"] != old["d0/f 0.txt"].sha256


def test_scan_refuses_escaping_symlink_and_follows_inner_ones(tmp_path):
    root = tmp_path / "root"
    make_tree(root, 3)
    (root / "inner").symlink_to(root / "d0")
    manifest, _ = scan_directory(root)
    assert {"inner/f 0.txt", "d0/f 0.txt"} <= {e.path for e in manifest.files}  # inner links are copied
    (root / "d1" / "loop").symlink_to(root)
    with pytest.raises(StorageError, match="symlink loop"):
        scan_directory(root)
    (root / "d1" / "loop").unlink()
    (tmp_path / "secret").write_text("x")
    (root / "escape").symlink_to(tmp_path / "secret")
    with pytest.raises(StorageError, match="outside the source root"):
        scan_directory(root)


def test_scan_refuses_non_utf8_names(tmp_path):
    (tmp_path / os.fsdecode(b"bad\xff.txt")).write_text("x")
    with pytest.raises(StorageError, match="not valid UTF-8"):
        scan_directory(tmp_path)


def test_local_sync_delete_dry_run_and_verify(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src)
    first = sync(src, dst)
    assert first.transferred_files == 12 and (dst / MANIFEST_NAME).is_file()
    assert sync(src, dst).transferred_bytes == 0
    (src / "d1" / "f 1.txt").unlink()
    (src / "d2" / "f 2.txt").write_bytes(b"changed")
    dry = sync(src, dst, delete=True, dry_run=True)
    assert [e.path for e in dry.plan.send] == ["d2/f 2.txt"] and dry.plan.delete == ["d1/f 1.txt"]
    assert (dst / "d1" / "f 1.txt").exists()  # dry run touched nothing
    done = sync(src, dst, delete=True)
    assert done.transferred_files == 1 and done.deleted == 1 and not (dst / "d1" / "f 1.txt").exists()
    assert verify(dst).ok
    (dst / "d0" / "f 3.txt").write_bytes(b"tampered")
    (dst / "stray").write_text("x")
    result = verify(dst)
    assert result.extra == ["stray"] and [k for k, _ in result.corrupt] == ["d0/f 3.txt"]


def test_cli_exit_codes(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["sync", str(tmp_path), "gs://bucket/x"])
    assert res.exit_code == 2 and "unknown storage URL scheme" in res.output and "Traceback" not in res.output
    src = tmp_path / "src"
    make_tree(src, 4)
    assert runner.invoke(app, ["sync", str(src), str(tmp_path / "dst")]).exit_code == 0
    assert runner.invoke(app, ["verify", str(tmp_path / "dst")]).exit_code == 0
    (tmp_path / "dst" / "d0" / "f 0.txt").unlink()
    res = runner.invoke(app, ["verify", str(tmp_path / "dst")])
    assert res.exit_code == 2 and "missing  d0/f 0.txt" in res.output
    (tmp_path / "dst" / MANIFEST_NAME).write_text('{"hello": 1}')
    res = runner.invoke(app, ["verify", str(tmp_path / "dst")])
    assert res.exit_code == 2 and "not a clustertrain manifest" in res.output


def test_damaged_manifest_is_one_line_naming_the_field():
    bad = {"format": "clustertrain-manifest", "version": 1, "files": [{"path": "a", "size": 1, "sha256": "xyz", "mtime_ns": 5}]}
    with pytest.raises(StorageError, match=r"m\.json \(a damaged clustertrain manifest\): files\[0\]\.sha256") as err:
        parse_manifest(json.dumps(bad), "m.json")
    assert "\n" not in str(err.value)


def test_leftover_temp_files_of_our_own_writes_are_never_data(tmp_path):
    """A hash-cache write killed before its rename leaves ``..clustertrain-hashcache.json.<random>``:
    it is ours, so a scan (and therefore a sync) must not ship it as a data file."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, 3)
    (src / "..clustertrain-hashcache.json.k2j4h1").write_text("{")
    manifest, _ = scan_directory(src)
    assert len(manifest.files) == 3 and not any("clustertrain-" in e.path for e in manifest.files)
    sync(src, dst)
    assert sorted(p.name for p in dst.iterdir()) == [MANIFEST_NAME, "d0", "d1", "d2"]


class MemoryDirStore(LocalPaths):
    """A store that is not a FileStore but has local paths: sync and verify must ask for the ability,
    not for the class (they read it in place, with no get())."""

    def __init__(self, root: Path) -> None:
        self.inner = FileStore(root)
        self.root, self.url, self.key_limit = self.inner.root, f"mem:{root}", self.inner.key_limit
        self.gets = 0

    def list(self):
        return self.inner.list()

    def stat(self, key):
        return self.inner.stat(key)

    def put(self, local_path, key, sha256):
        return self.inner.put(local_path, key, sha256)

    def get(self, key, local_path):
        self.gets += 1
        return self.inner.get(key, local_path)

    def delete(self, keys):
        return self.inner.delete(keys)

    def path_of(self, key):
        return self.inner.path_of(key)

    def partial_path(self, key):
        return self.inner.partial_path(key)

    def commit(self, tmp, key, sha256):
        return self.inner.commit(tmp, key, sha256)


def test_sync_and_verify_ask_the_store_for_local_paths(tmp_path):
    src = MemoryDirStore(tmp_path / "src")
    make_tree(src.root, 4)
    dst = MemoryDirStore(tmp_path / "dst")
    assert sync(src, dst).transferred_files == 4  # a source with local paths is scanned in place
    assert verify(dst, full=True).ok and dst.gets == 0 and src.gets == 0


def test_importing_the_storage_stage_and_syncing_locally_needs_no_boto3(tmp_path):
    make_tree(tmp_path / "src", 2)
    code = ("import sys\nfrom clustertrain.storage import sync, verify\n"
            f"sync({str(tmp_path / 'src')!r}, {str(tmp_path / 'dst')!r})\nassert verify({str(tmp_path / 'dst')!r}).ok\n"
            "import clustertrain.storage.syncing\nfrom clustertrain.storage import sync as again\nassert callable(again)\n"
            "print(sorted(m for m in ('boto3', 'botocore', 'numpy', 'torch') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
