"""Which backend serves a storage URL: ``s3://bucket[/prefix]`` -> :class:`~clustertrain.storage.s3.S3Store`,
``file:///dir`` or a plain path -> :class:`~clustertrain.storage.file.FileStore`.

The factory lives apart from the protocol (:mod:`clustertrain.storage.store`) so that the backends can
import the protocol without a cycle; boto3 is imported only when an ``s3://`` URL is opened.
"""

from __future__ import annotations

import re
from pathlib import Path

from clustertrain.core.errors import StorageError
from clustertrain.storage.file import FileStore
from clustertrain.storage.store import ObjectStore, StoreConfig

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def open_store(url: str | Path, options: StoreConfig | None = None, *, progress: bool = False) -> ObjectStore:
    """The store behind ``url``: ``s3://bucket[/prefix]`` -> S3Store, ``file:///dir`` or a plain path -> FileStore."""
    options = options or StoreConfig()
    text = str(url)
    if "://" not in text:
        return FileStore(Path(text), progress=progress)
    scheme, _, rest = text.partition("://")
    if scheme == "file":
        if not rest.startswith("/"):
            raise StorageError(f"{text!r}: a file URL needs an absolute path, e.g. file:///data/run1")
        return FileStore(Path(rest), progress=progress)
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise StorageError(f"{text!r} names no bucket; write s3://BUCKET/PREFIX")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise StorageError(
                f"{text!r}: {bucket!r} is not a valid S3 bucket name (3-63 chars of a-z, 0-9, '.', '-')"
            )
        from clustertrain.storage.s3 import S3Store  # boto3: only when an S3 URL is opened

        return S3Store(bucket, prefix.strip("/"), options)
    raise StorageError(
        f"unknown storage URL scheme {scheme + '://'!r} in {text!r}; use s3://bucket/prefix, file:///path or a plain path"
    )
