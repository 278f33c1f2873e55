"""Every backend through the same protocol tests (FileStore on tmp_path, S3Store on moto's server)."""

from __future__ import annotations

import hashlib

import pytest

from clustertrain.storage import IncompleteCleanup, MissingObjectError, ObjectStore, open_store

pytestmark = pytest.mark.slow


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    if request.param == "file":
        return open_store(tmp_path / "store")
    bucket, options = request.getfixturevalue("bucket"), request.getfixturevalue("options")
    return open_store(f"s3://{bucket}/pre fix", options)


def test_protocol_contract(store, tmp_path):
    assert isinstance(store, ObjectStore) and isinstance(store, IncompleteCleanup)
    assert store.list() == {}
    data = b"weird name contents"
    src = tmp_path / "payload"
    src.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    key = "a 0/a\"=0\"/a'; echo foo"  # hostile names travel as keys unchanged
    info = store.put(src, key, sha)
    assert info.size == len(data) and info.sha256 == sha
    listed = store.list()
    assert list(listed) == [key] and listed[key].size == len(data)
    assert store.stat(key).sha256 == sha and store.stat("nope") is None
    out = tmp_path / "out"
    store.get(key, out)
    assert out.read_bytes() == data
    with pytest.raises(MissingObjectError):
        store.get("nope", tmp_path / "never")
    store.delete([key, "nope"])
    assert store.list() == {}
    assert store.clean_incomplete() == 0
