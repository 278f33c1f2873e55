"""Back the final checkpoint up to the project's checkpoint bucket (rank 0, after the final save).

Destination: ``<storage.checkpoint_bucket>/<project>/<model>/step_<N>/`` — a verified copy with its
manifest (see :mod:`clustertrain.storage`). To resume elsewhere, restore it into a run directory's
``checkpoints/`` (``clustertrain storage restore URL RUN_DIR/checkpoints/step_<N>``) and run: the
trainer resumes from the newest complete checkpoint there.
"""

from __future__ import annotations

from pathlib import Path

from clustertrain.errors import StorageError
from clustertrain.project import ModelEntry, Project


def checkpoint_backup_url(project: Project, entry: ModelEntry, checkpoint: Path) -> str | None:
    bucket = project.storage.checkpoint_bucket
    if not bucket:
        return None
    return f"{bucket.rstrip('/')}/{project.name}/{entry.name}/{checkpoint.name}"


def backup_checkpoint(project: Project, entry: ModelEntry, checkpoint: Path) -> str | None:
    """Copy and verify ``checkpoint``; return where it went (None when no bucket is configured)."""
    from clustertrain.storage import StoreConfig, backup_directory

    url = checkpoint_backup_url(project, entry, checkpoint)
    if url is None:
        return None
    options = StoreConfig(endpoint_url=project.storage.endpoint_url, region=project.storage.region)
    result = backup_directory(checkpoint, url, options=options)
    if not result.ok:
        raise StorageError(f"backup of {checkpoint} to {url} did not verify; run `clustertrain storage verify {url}`")
    return url
