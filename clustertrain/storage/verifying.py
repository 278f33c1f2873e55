"""verify: check that a copy matches its manifest, naming every missing, extra or corrupt object.

Quick mode trusts what each object records: sizes from the listing; content through the ETag the
manifest recorded (equal ETag = the very object we wrote) or else the object's ``sha256`` metadata
and S3's own SHA256 checksum (HEAD). ``full=True`` downloads every object and re-hashes it.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from clustertrain.core.errors import StorageError
from clustertrain.storage.manifest import Manifest, ManifestEntry, hash_file, parse_manifest
from clustertrain.storage.store import MANIFEST_NAME, LocalPaths, MissingObjectError, ObjectInfo, ObjectStore, StoreConfig
from clustertrain.storage.stores import open_store
from clustertrain.storage.syncing import read_manifest


@dataclass
class VerifyResult:
    """Outcome of :func:`verify`; ``ok`` only when nothing is missing, extra or corrupt."""

    url: str
    full: bool
    checked: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    corrupt: list[tuple[str, str]] = field(default_factory=list)  # (key, reason)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.corrupt)


def load_manifest(store: ObjectStore, manifest: str | Path | None) -> Manifest:
    """The manifest file given, or the one at the store's root."""
    if manifest is not None:
        path = Path(manifest)
        if not path.is_file():
            raise StorageError(f"manifest file {path} does not exist; give the path of a .clustertrain-manifest.json")
        return parse_manifest(path.read_bytes(), str(path))
    found = read_manifest(store)
    if found is None:
        raise StorageError(
            f"{store.url} has no {MANIFEST_NAME}: the copy is incomplete or not ours; "
            "finish the sync, or pass --manifest"
        )
    return found


def _check_quick(store: ObjectStore, entry: ManifestEntry, listed: ObjectInfo) -> str | None:
    if listed.sha256 is not None:  # local file: hash (cached by size+mtime)
        return None if listed.sha256 == entry.sha256 else f"sha256 {listed.sha256[:12]}... != manifest {entry.sha256[:12]}..."
    if entry.etag and listed.etag == entry.etag:
        return None
    info = store.stat(entry.path)
    if info is None:
        return "vanished during verify"
    if info.sha256 is None:
        return "replaced after the sync: no sha256 metadata (not written by clustertrain)"
    if info.sha256 != entry.sha256:
        return f"sha256 metadata {info.sha256[:12]}... != manifest {entry.sha256[:12]}..."
    if info.checksum_contradicts(entry.sha256):
        return "S3's SHA256 checksum does not match the manifest (content replaced, metadata kept)"
    return None


def _check_full(store: ObjectStore, entry: ManifestEntry) -> str | None:
    if isinstance(store, LocalPaths):
        digest = hash_file(store.path_of(entry.path))
    else:
        with tempfile.TemporaryDirectory(prefix="ct-verify-") as tmp:
            target = Path(tmp) / "object"
            try:
                store.get(entry.path, target)
            except MissingObjectError:
                return "vanished during verify"
            digest = hash_file(target)
    return None if digest == entry.sha256 else f"content sha256 {digest[:12]}... != manifest {entry.sha256[:12]}..."


def verify(
    dst: str | Path | ObjectStore,
    manifest: str | Path | None = None,
    *,
    full: bool = False,
    jobs: int = 8,
    options: StoreConfig | None = None,
    progress: bool = False,
) -> VerifyResult:
    """Compare the copy at ``dst`` with ``manifest`` (default: the copy's own)."""
    store = dst if isinstance(dst, ObjectStore) else open_store(dst, options, progress=progress)
    wanted = load_manifest(store, manifest).by_path()
    listing = store.list()
    result = VerifyResult(url=store.url, full=full)
    result.missing = sorted(set(wanted) - set(listing))
    result.extra = sorted(set(listing) - set(wanted))
    present = [wanted[k] for k in sorted(set(wanted) & set(listing))]

    def check(entry: ManifestEntry) -> str | None:
        listed = listing[entry.path]
        if listed.size != entry.size:
            return f"size {listed.size} != manifest {entry.size}"
        return _check_full(store, entry) if full else _check_quick(store, entry, listed)

    with ThreadPoolExecutor(jobs) as pool:
        reasons = list(pool.map(check, present))
    result.checked = len(present)
    result.corrupt = [(e.path, r) for e, r in zip(present, reasons) if r]
    return result
