"""Object-storage stage: copy directories to and from S3 (or local directories), verify copies.

Public API (imported lazily, so that commands which never touch storage do not pay for boto3):
    open_store, ObjectStore, ObjectInfo, StoreConfig, FileStore, S3Store, IncompleteCleanup, LocalPaths,
    MissingObjectError, Manifest, ManifestEntry, MANIFEST_NAME, scan_directory, read_manifest,
    sync, SyncPlan, SyncResult, verify, VerifyResult, backup_directory, restore_directory, BackupResult

Modules: ``store`` (the protocol, its options and optional abilities), ``stores`` (URL -> backend),
``file`` and ``s3`` (the backends), ``manifest`` (the manifest format and the local scan), ``syncing``,
``verifying`` and ``backup`` (what the rest of clustertrain calls; not named ``sync``/``verify``, which are
the functions: a submodule would shadow them as package attributes).
"""

from clustertrain.core.lazy import lazy_exports

_PUBLIC = {
    "BackupResult": "clustertrain.storage.directory_backup",
    "backup_directory": "clustertrain.storage.directory_backup",
    "restore_directory": "clustertrain.storage.directory_backup",
    "FileStore": "clustertrain.storage.file",
    "Manifest": "clustertrain.storage.manifest",
    "ManifestEntry": "clustertrain.storage.manifest",
    "scan_directory": "clustertrain.storage.manifest",
    "S3Store": "clustertrain.storage.s3",
    "MANIFEST_NAME": "clustertrain.storage.store",
    "IncompleteCleanup": "clustertrain.storage.store",
    "LocalPaths": "clustertrain.storage.store",
    "MissingObjectError": "clustertrain.storage.store",
    "ObjectInfo": "clustertrain.storage.store",
    "ObjectStore": "clustertrain.storage.store",
    "StoreConfig": "clustertrain.storage.store",
    "open_store": "clustertrain.storage.stores",
    "SyncPlan": "clustertrain.storage.syncing",
    "SyncResult": "clustertrain.storage.syncing",
    "read_manifest": "clustertrain.storage.syncing",
    "sync": "clustertrain.storage.syncing",
    "VerifyResult": "clustertrain.storage.verifying",
    "verify": "clustertrain.storage.verifying",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _PUBLIC)
