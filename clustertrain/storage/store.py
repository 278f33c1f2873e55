"""The object-store interface, its options and optional abilities (the backends implement it;
:func:`clustertrain.storage.stores.open_store` picks one from a URL).

A store holds objects under *keys* relative to its root: ``a/b.bin`` is ``<dir>/a/b.bin`` in a
:class:`~clustertrain.storage.file.FileStore` and ``<prefix>/a/b.bin`` in a
:class:`~clustertrain.storage.s3.S3Store`. Keys use ``/``, are valid UTF-8, hold no control characters
and no ``.``/``..``/empty components (:func:`check_key`). Names starting with ``.clustertrain-`` at the
root are ours (manifest, hash cache; ``..clustertrain-*`` are leftovers of their atomic writes) and never
appear in :meth:`ObjectStore.list` (:func:`is_ours`).

Optional abilities are mixins that sync and verify test with ``isinstance``: :class:`IncompleteCleanup`
(remove leftovers of interrupted writes) and :class:`LocalPaths` (objects are files on this machine).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from pydantic import Field

from clustertrain.core.errors import StorageError
from clustertrain.core.schema import StrictModel

MANIFEST_NAME = ".clustertrain-manifest.json"
"""Key of the manifest at a store's root: written last, so its presence marks a complete copy."""
CACHE_NAME = ".clustertrain-hashcache.json"
"""Local hash cache next to the data (same format as the manifest); never transferred."""
PARTIAL_SUFFIX = ".ct-partial"
"""Suffix of a local file still being written (renamed into place when complete)."""
RESERVED_NAMES = frozenset({MANIFEST_NAME, CACHE_NAME})
OURS_PREFIX = ".clustertrain-"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class MissingObjectError(StorageError):
    """The object asked for does not exist in the store."""


class StoreConfig(StrictModel):
    """How to reach an object store. Credentials are never part of it: boto3's standard chain
    (environment, ``~/.aws``, instance role) supplies them."""

    endpoint_url: str | None = Field(
        None,
        description="S3-compatible endpoint, e.g. http://127.0.0.1:9000. Unset: boto3 decides "
        "(AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS).",
    )
    region: str | None = Field(None, description="AWS region; unset: boto3's chain (AWS_REGION, profile).")
    profile: str | None = Field(None, description="Named profile from ~/.aws/config; unset: boto3's chain.")
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        "auto", description="S3 addressing style; 'path' for most self-hosted S3-compatible stores."
    )
    part_size_mb: int = Field(
        8, ge=5, le=5120, description="Multipart part size in MiB (S3 minimum 5); files at least this big go multipart."
    )
    multipart_threshold_mb: int = Field(
        64, ge=5, le=5120,
        description="Files at least this big (MiB) go multipart in part_size_mb parts; smaller ones go as one PUT, "
        "whose SHA256 checksum S3 checks against the whole object (a multipart checksum covers parts only).",
    )
    part_concurrency: int = Field(4, ge=1, le=64, description="Parts of one large file moved at the same time.")
    checksum: bool = Field(
        True,
        description="Ask S3 to store and check a SHA256 checksum (ChecksumAlgorithm=SHA256); "
        "turn off for endpoints that reject checksum headers.",
    )
    max_attempts: int | None = Field(
        None, ge=1, description="Attempts per request (botocore's standard retry mode: exponential backoff with "
        "jitter); unset: AWS_MAX_ATTEMPTS or the profile's max_attempts, else 5 (clustertrain.storage.s3)."
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="Seconds to wait for a connection.")
    read_timeout_s: float = Field(60.0, gt=0, description="Seconds to wait for a response chunk.")


@dataclass(frozen=True)
class ObjectInfo:
    """One object as a store reports it. ``sha256`` is the checksum recorded with the object (S3 user
    metadata; a local file's hash), None when unknown; ``s3_sha256`` is S3's own base64 checksum."""

    key: str
    size: int
    sha256: str | None = None
    etag: str | None = None
    mtime_ns: int | None = None
    s3_sha256: str | None = None

    def checksum_contradicts(self, sha256_hex: str) -> bool:
        """True when the store's own full-object checksum disagrees with ``sha256_hex`` (content replaced,
        metadata kept). Multipart checksums (``...-N``) cover parts, not the object: they prove nothing."""
        return bool(self.s3_sha256) and "-" not in self.s3_sha256 and self.s3_sha256 != b64_of_hex(sha256_hex)


@runtime_checkable
class ObjectStore(Protocol):
    """The five operations sync and verify need. Keys are relative to the store's root."""

    url: str
    key_limit: int  # longest key (UTF-8 bytes) the store can hold

    def list(self) -> dict[str, ObjectInfo]:
        """Every data object under the root (reserved names hidden); ``sha256`` only where cheap."""

    def stat(self, key: str) -> ObjectInfo | None:
        """One object with its recorded ``sha256``, or None when absent."""

    def put(self, local_path: Path, key: str, sha256: str) -> ObjectInfo:
        """Store a local file under ``key``, recording ``sha256``; all-or-nothing."""

    def get(self, key: str, local_path: Path) -> None:
        """Write the object to ``local_path`` (the caller picks a temporary name)."""

    def delete(self, keys: list[str]) -> None:
        """Remove objects; absent ones are ignored."""


class IncompleteCleanup:
    """Optional ability: remove leftovers of interrupted writes (partial files, multipart uploads)."""

    def clean_incomplete(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError


class LocalPaths:
    """Optional ability: the objects are files on this machine under ``root``. Sync then scans and hashes
    them in place, reads sources without a copy and lands downloads beside their final name."""

    root: Path

    def path_of(self, key: str) -> Path:  # pragma: no cover - interface
        """Local path of ``key`` (never outside ``root``)."""
        raise NotImplementedError

    def partial_path(self, key: str) -> Path:  # pragma: no cover - interface
        """A fresh temporary name next to ``key``'s path (parent directories created)."""
        raise NotImplementedError

    def commit(self, tmp: Path, key: str, sha256: str) -> ObjectInfo:  # pragma: no cover - interface
        """Move a completed temporary file into place as ``key``."""
        raise NotImplementedError


def is_ours(name: str) -> bool:
    """A root-level name clustertrain keeps for itself (manifest, hash cache, their temporary files)."""
    return name.startswith(OURS_PREFIX) or name.startswith("." + OURS_PREFIX)


def b64_of_hex(sha256_hex: str) -> str:
    """A hex SHA-256 in S3's checksum form (base64 of the digest)."""
    return base64.b64encode(bytes.fromhex(sha256_hex)).decode("ascii")


def check_key(key: str, store: ObjectStore | None = None) -> str:
    """Return ``key`` if every store can hold it, else raise :class:`StorageError` naming it."""
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError:
        shown = key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise StorageError(f"file name {shown!r} is not valid UTF-8, which S3 keys must be; rename it") from None
    if not key or key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
        raise StorageError(f"object name {key!r} is not a clean relative path (empty, '.', '..' or leading '/')")
    if _CONTROL.search(key):
        raise StorageError(f"file name {key!r} contains control characters S3 cannot list safely; rename it")
    if store is not None and len(raw) > store.key_limit:
        raise StorageError(
            f"file name {key!r} is {len(raw)} bytes; {store.url} holds keys of at most {store.key_limit} bytes "
            "(S3: 1024 with the prefix); shorten it"
        )
    return key
