"""Library entry points for the rest of clustertrain: back a directory up, restore it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clustertrain.storage.store import StoreConfig
from clustertrain.storage.syncing import SyncResult, sync
from clustertrain.storage.verifying import VerifyResult, verify


@dataclass
class BackupResult:
    """A sync followed by a verify of the destination."""

    sync: SyncResult
    verify: VerifyResult

    @property
    def ok(self) -> bool:
        return self.verify.ok


def backup_directory(
    local_dir: str | Path,
    dest_url: str,
    *,
    options: StoreConfig | None = None,
    delete: bool = False,
    jobs: int = 8,
    progress: bool = False,
) -> BackupResult:
    """Sync ``local_dir`` to ``dest_url`` and verify the copy (quick mode) against its new manifest."""
    done = sync(Path(local_dir), dest_url, delete=delete, jobs=jobs, options=options, progress=progress)
    return BackupResult(sync=done, verify=verify(dest_url, jobs=jobs, options=options))


def restore_directory(
    src_url: str,
    local_dir: str | Path,
    *,
    options: StoreConfig | None = None,
    delete: bool = False,
    jobs: int = 8,
    progress: bool = False,
) -> SyncResult:
    """Download the complete copy at ``src_url`` into ``local_dir``; every file is hash-checked on arrival."""
    return sync(src_url, Path(local_dir), delete=delete, jobs=jobs, options=options, progress=progress)
