"""Object-storage stage: copy directories to and from S3 (or local directories), verify copies.

Public API:
    open_store, ObjectStore, ObjectInfo, StoreConfig, FileStore, S3Store, IncompleteCleanup,
    MissingObjectError, Manifest, ManifestEntry, MANIFEST_NAME, scan_directory, read_manifest,
    sync, SyncPlan, SyncResult, verify, VerifyResult, backup_directory, restore_directory, BackupResult
"""

from clustertrain.storage.backup import BackupResult, backup_directory, restore_directory
from clustertrain.storage.file import FileStore
from clustertrain.storage.manifest import Manifest, ManifestEntry, scan_directory
from clustertrain.storage.s3 import S3Store
from clustertrain.storage.store import (
    MANIFEST_NAME,
    IncompleteCleanup,
    MissingObjectError,
    ObjectInfo,
    ObjectStore,
    StoreConfig,
    open_store,
)
from clustertrain.storage.sync import SyncPlan, SyncResult, read_manifest, sync
from clustertrain.storage.verify import VerifyResult, verify

__all__ = [
    "MANIFEST_NAME",
    "BackupResult",
    "FileStore",
    "IncompleteCleanup",
    "Manifest",
    "ManifestEntry",
    "MissingObjectError",
    "ObjectInfo",
    "ObjectStore",
    "S3Store",
    "StoreConfig",
    "SyncPlan",
    "SyncResult",
    "VerifyResult",
    "backup_directory",
    "open_store",
    "read_manifest",
    "restore_directory",
    "scan_directory",
    "sync",
    "verify",
]
