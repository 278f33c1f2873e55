"""FileStore: a local directory as an object store (the small reference backend)."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from clustertrain.core.errors import StorageError
from clustertrain.storage.manifest import hash_file, scan_directory
from clustertrain.storage.store import (
    PARTIAL_SUFFIX,
    IncompleteCleanup,
    LocalPaths,
    MissingObjectError,
    ObjectInfo,
    check_key,
)


class FileStore(IncompleteCleanup, LocalPaths):
    """Objects are files under ``root``; writes land in ``.<name>.<id>.ct-partial`` then ``os.replace``."""

    key_limit = 4096

    def __init__(self, root: Path, *, progress: bool = False) -> None:
        self.root = Path(os.path.abspath(root))
        self.url = str(self.root)
        self._progress = progress
        self.hashed_files = 0  # files read by the last list()

    def __repr__(self) -> str:
        return f"FileStore({self.url!r})"

    # -- protocol ---------------------------------------------------------------------------------
    def list(self) -> dict[str, ObjectInfo]:
        if not self.root.exists():
            return {}
        manifest, self.hashed_files = scan_directory(self.root, progress=self._progress)
        return {
            e.path: ObjectInfo(key=e.path, size=e.size, sha256=e.sha256, mtime_ns=e.mtime_ns) for e in manifest.files
        }

    def stat(self, key: str) -> ObjectInfo | None:
        path = self.path_of(key)
        if not path.is_file():
            return None
        st = path.stat()
        return ObjectInfo(key=key, size=st.st_size, sha256=hash_file(path), mtime_ns=st.st_mtime_ns)

    def put(self, local_path: Path, key: str, sha256: str) -> ObjectInfo:
        tmp = self.partial_path(key)
        try:
            shutil.copy2(local_path, tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return self.commit(tmp, key, sha256)

    def get(self, key: str, local_path: Path) -> None:
        path = self.path_of(key)
        if not path.is_file():
            raise MissingObjectError(f"{path} does not exist")
        shutil.copyfile(path, local_path)

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            path = self.path_of(key)
            path.unlink(missing_ok=True)
            parent = path.parent
            while parent != self.root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent

    # -- optional ability -------------------------------------------------------------------------
    def clean_incomplete(self) -> int:
        """Remove partial files left by an interrupted write; returns how many."""
        if not self.root.is_dir():
            return 0
        removed = 0
        for dirpath, _dirs, names in os.walk(self.root):
            for name in names:
                if name.endswith(PARTIAL_SUFFIX):
                    Path(dirpath, name).unlink(missing_ok=True)
                    removed += 1
        return removed

    # -- optional ability: local paths (used by sync and verify) ------------------------------------
    def path_of(self, key: str) -> Path:
        """Local path of ``key``; refuses keys that would land outside the root (through symlinks too)."""
        path = self.root / check_key(key)
        real_root = os.path.realpath(self.root)
        parent = path.parent
        while not parent.exists() and parent != self.root:
            parent = parent.parent
        real_parent = os.path.realpath(parent)
        if os.path.commonpath([real_root, real_parent]) != real_root:
            raise StorageError(f"{path} would be written outside {self.root} (through a symlink); remove the link")
        return path

    def partial_path(self, key: str) -> Path:
        """A fresh temporary name next to ``key`` (parent directories created)."""
        path = self.path_of(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}{PARTIAL_SUFFIX}"

    def commit(self, tmp: Path, key: str, sha256: str) -> ObjectInfo:
        """Move a completed partial file into place."""
        path = self.path_of(key)
        os.replace(tmp, path)
        st = path.stat()
        return ObjectInfo(key=key, size=st.st_size, sha256=sha256, mtime_ns=st.st_mtime_ns)
