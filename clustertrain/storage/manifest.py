"""The sync manifest: what a complete copy holds. Owns the on-disk format and the local directory scan.

Format (versioned JSON, UTF-8), stored as ``.clustertrain-manifest.json`` at the root of a copy::

    {
      "format": "clustertrain-manifest",   # identifies the file as ours
      "version": 1,                        # bumped on incompatible change; readers refuse newer
      "created": "2026-11-22T00:00:00Z",   # UTC time the manifest was written
      "files": [                           # sorted by path
        {"path": "a/b.bin",                # key relative to the root, '/'-separated, UTF-8
         "size": 123,                      # bytes
         "sha256": "<64 hex>",             # of the content
         "mtime_ns": 1700000000000000000,  # source modification time (restored on download)
         "etag": "\"...\""}                # optional: the destination object's ETag when written
      ]
    }

The manifest is written LAST by a sync (and removed first when a sync will change the copy), so a
copy without one is incomplete. Readers ignore unknown fields (a newer minor writer may add some).
The local hash cache ``.clustertrain-hashcache.json`` uses the same format; a scan re-hashes only
files whose size or mtime differ from the cache (or from a manifest already in the directory).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import Field

from clustertrain.core.errors import StorageError
from clustertrain.core.run_paths import write_atomic
from clustertrain.core.schema import StoredModel, validate_model
from clustertrain.storage.progress import make_progress
from clustertrain.storage.store import CACHE_NAME, MANIFEST_NAME, PARTIAL_SUFFIX, check_key, is_ours

FORMAT = "clustertrain-manifest"
VERSION = 1
_RACY_NS = 2_000_000_000  # files modified this recently are not cached (same-tick edits keep size+mtime)


class ManifestEntry(StoredModel):
    """One file of a copy."""

    path: str = Field(description="Key relative to the root, '/'-separated.")
    size: int = Field(ge=0, description="Size in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the content, hex.")
    mtime_ns: int = Field(description="Modification time of the source file, ns since the epoch.")
    etag: str | None = Field(None, description="ETag of the destination object when the manifest was written.")


class Manifest(StoredModel):
    """A complete copy's table of contents (stored state: unknown fields are tolerated)."""

    format: Literal["clustertrain-manifest"] = Field(FORMAT, description="Marks the file as ours.")
    version: int = Field(VERSION, description="Format version.")
    created: str = Field(default_factory=lambda: _now(), description="UTC time of writing, ISO 8601.")
    files: list[ManifestEntry] = Field(default_factory=list, description="Entries sorted by path.")

    def by_path(self) -> dict[str, ManifestEntry]:
        return {e.path: e for e in self.files}

    def same_files(self, other: Manifest | None) -> bool:
        """True when both list the same files with the same size, hash, mtime and ETag."""
        return other is not None and [e.model_dump() for e in self.files] == [e.model_dump() for e in other.files]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=1, ensure_ascii=False) + "\n"


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_manifest(text: str | bytes, where: str) -> Manifest:
    """Parse a manifest; a file that is not ours or too new raises :class:`StorageError` naming ``where``."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StorageError(
            f"{where} is not a clustertrain manifest (no \"format\": \"{FORMAT}\"); "
            "point at one written by `clustertrain storage sync` or pick another destination"
        )
    if not isinstance(data.get("version"), int) or data["version"] > VERSION:
        raise StorageError(
            f"{where} has manifest version {data.get('version')!r}; this clustertrain reads up to {VERSION} — upgrade it"
        )
    return validate_model(data, Manifest, f"{where} (a damaged clustertrain manifest)", error=StorageError)


class _Counted(io.RawIOBase):
    """A binary file that reports every read to ``advance(n)`` (for :func:`hashlib.file_digest`)."""

    def __init__(self, raw, advance) -> None:
        self._raw, self._advance = raw, advance

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._raw.readinto(buffer)
        self._advance(n)
        return n


def hash_file(path: Path, advance=None) -> str:
    """SHA-256 of a file, hex; ``advance(n)`` is called per chunk read."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(_Counted(fh, advance) if advance else fh, "sha256").hexdigest()


def _load_hints(root: Path) -> dict[str, ManifestEntry]:
    """Previously computed hashes: the manifest then the cache in ``root`` (unreadable ones are ignored)."""
    hints: dict[str, ManifestEntry] = {}
    for name in (MANIFEST_NAME, CACHE_NAME):
        try:
            hints.update(parse_manifest((root / name).read_bytes(), str(root / name)).by_path())
        except (OSError, StorageError):
            continue
    return hints


def _walk(root: Path) -> list[tuple[str, Path, os.stat_result]]:
    """Every regular file under ``root`` as (key, path, stat); symlinks are followed only inside ``root``."""
    real_root = os.path.realpath(root)
    found: list[tuple[str, Path, os.stat_result]] = []
    def visit(directory: Path, rel: str, ancestors: frozenset[tuple[int, int]]) -> None:
        st = os.stat(directory)
        if (st.st_dev, st.st_ino) in ancestors:
            raise StorageError(f"{directory} is a symlink loop (it leads back to its own parent); remove the link")
        ancestors = ancestors | {(st.st_dev, st.st_ino)}
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            key = f"{rel}{entry.name}"
            if entry.name.endswith(PARTIAL_SUFFIX) or (not rel and is_ours(entry.name)):
                continue
            path = Path(entry.path)
            if entry.is_symlink():
                target = os.path.realpath(path)
                if os.path.commonpath([real_root, target]) != real_root:
                    raise StorageError(
                        f"{path} is a symlink to {target}, outside the source root {root}; "
                        "replace it with a copy or remove it"
                    )
                if not os.path.exists(target):
                    raise StorageError(f"{path} is a dangling symlink (to {target}); remove it")
            st = os.stat(path)
            if stat.S_ISDIR(st.st_mode):
                visit(path, key + "/", ancestors)
            elif stat.S_ISREG(st.st_mode):
                found.append((check_key(key), path, st))
            else:
                raise StorageError(f"{path} is not a regular file (fifo, socket or device); remove it or move it out")

    visit(root, "", frozenset())
    return found


def scan_directory(root: Path, *, progress: bool = False) -> tuple[Manifest, int]:
    """Manifest of every file under ``root`` and how many files were (re)hashed.

    Only files whose size or mtime changed since the cached hashes are read; the cache is then
    rewritten next to the data (skipped silently when the directory is read-only).
    """
    if not root.is_dir():
        raise StorageError(f"{root} is not a directory; give an existing directory to sync from")
    files = _walk(root)
    hints = _load_hints(root)
    entries: list[ManifestEntry] = []
    todo: list[tuple[str, Path, os.stat_result]] = []
    for key, path, st in files:
        hint = hints.get(key)
        if hint and hint.size == st.st_size and hint.mtime_ns == st.st_mtime_ns:
            entries.append(ManifestEntry(path=key, size=st.st_size, sha256=hint.sha256, mtime_ns=st.st_mtime_ns))
        else:
            todo.append((key, path, st))
    if todo:
        with make_progress(progress) as bar:
            task = bar.add_task(f"hashing {root}", total=sum(st.st_size for _, _, st in todo))
            for key, path, st in todo:
                digest = hash_file(path, lambda n: bar.advance(task, n))
                entries.append(ManifestEntry(path=key, size=st.st_size, sha256=digest, mtime_ns=st.st_mtime_ns))
    entries.sort(key=lambda e: e.path)
    manifest = Manifest(files=entries)
    if todo or len(hints) != len(entries):
        _save_cache(root, manifest)
    return manifest, len(todo)


def _save_cache(root: Path, manifest: Manifest) -> None:
    cutoff = time.time_ns() - _RACY_NS
    cache = Manifest(files=[e for e in manifest.files if e.mtime_ns < cutoff])
    try:
        write_atomic(root / CACHE_NAME, cache.to_json())
    except OSError:
        pass  # read-only source: hashes are simply recomputed next time
