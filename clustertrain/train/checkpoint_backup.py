"""Checkpoint backup to the project's checkpoint bucket, in the background, on rank 0.

Destination: ``<storage.checkpoint_bucket>/<project>/<model>/step_<N>/`` — a verified copy with its
manifest (see :mod:`clustertrain.storage`; a copy counts only once its manifest is written, last).
To resume elsewhere, restore it into a run directory's ``checkpoints/``
(``clustertrain storage restore URL RUN_DIR/checkpoints/step_<N>``) and run: the trainer resumes
from the newest complete checkpoint there.

Which checkpoints
    With ``training.backup_every: N``, every checkpoint whose step is a multiple of
    ``N x checkpoint_every`` (every Nth periodic checkpoint, the same ones after a resume); and
    always the last checkpoint a run saves (at ``max_steps`` or on a stop signal). Unset: only the last.

How (:class:`CheckpointBackup`)
    Right after a save, rank 0 hands the checkpoint over and goes on training. One upload at a time
    runs in a child process (``python -m clustertrain.train.checkpoint_backup DIR URL``: sync, then verify), at
    lower CPU priority, so it never competes with the training loop for the interpreter lock; a thread
    of rank 0 only waits for it. A checkpoint handed over while an upload runs waits in a single slot;
    a later one replaces it (the earlier is recorded as ``superseded``). ``keep_last`` never deletes
    the checkpoint being uploaded nor the waiting one (:meth:`CheckpointBackup.protected`; they are
    deleted at a later save, or by the final prune). Before the process exits, rank 0 waits for the
    last one. A failed upload is logged and recorded; it never stops training, and the run still
    ends with exit code 0 (its checkpoints are intact on the file system). The log line gives the error
    (for an endpoint that went away: which one, after the retries of :mod:`clustertrain.storage.s3`) and the
    command that finishes the copy by hand, with the project's endpoint and region; it sends only what is missing.

Records (in ``status.json``, written by :func:`clustertrain.train.trainer.write_status`; the format is
:class:`clustertrain.core.run_records.RunStatus`)
    ``backup``: URL of the verified copy of the run's last checkpoint, else null; ``backup_state``: that
    checkpoint's backup state (``verified``, ``failed``, ``superseded``, ``in progress``), else null;
    ``backup_error``: the last failure's message, else null; ``backups``: the last :data:`KEEP_RECORDS`
    records :class:`~clustertrain.core.run_records.BackupRecord` ``{"checkpoint": "step_…", "url", "state":
    "verified"|"failed"|"superseded", "started", "finished", "seconds", "error"}`` (times are Unix seconds;
    ``started`` is null for a superseded one). A backup's state is a :class:`~clustertrain.core.run_records.BackupState`,
    not a run's :class:`~clustertrain.core.states.State`.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from clustertrain.core.errors import ClusterTrainError, StorageError
from clustertrain.project import ModelEntry, Project
from clustertrain.core.run_records import BackupRecord, BackupState

KEEP_RECORDS = 50
NICE = 10  # the uploader's CPU priority offset: training threads come first


def checkpoint_backup_url(project: Project, entry: ModelEntry, checkpoint: Path) -> str | None:
    bucket = project.storage.checkpoint_bucket
    if not bucket:
        return None
    return f"{bucket.rstrip('/')}/{project.name}/{entry.name}/{checkpoint.name}"


def backup_every(entry: ModelEntry) -> int | None:
    """``training.backup_every`` (None where the project model does not have the field yet)."""
    return getattr(entry.training, "backup_every", None)


def is_due(entry: ModelEntry, step: int) -> bool:
    """Whether the periodic checkpoint of ``step`` is one ``training.backup_every`` asks to back up."""
    n = backup_every(entry)
    return bool(n) and step % (n * entry.training.checkpoint_every) == 0


Upload = Callable[[Path, str], None]
"""Copy a checkpoint directory to a URL and verify it; raise on failure."""


def child_upload(endpoint_url: str | None, region: str | None) -> Upload:
    """The default :data:`Upload`: one child process per checkpoint (see the module docstring)."""
    def upload(checkpoint: Path, url: str) -> None:
        cmd = [sys.executable, "-m", "clustertrain.train.checkpoint_backup", str(checkpoint), url]
        if endpoint_url:
            cmd += ["--endpoint-url", endpoint_url]
        if region:
            cmd += ["--region", region]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            lines = [line for line in (proc.stderr or "").splitlines() if line.strip()]
            raise StorageError(lines[-1].removeprefix("error: ") if lines else f"uploader exited with {proc.returncode}")

    return upload


class CheckpointBackup:
    """Background uploads of rank 0's checkpoints: at most one in flight, one waiting (the newest)."""

    def __init__(self, url_for: Callable[[Path], str], upload: Upload, log: Callable[[str], None] = print,
                 sync_flags: list[str] | None = None):
        """``sync_flags``: what `clustertrain storage sync` needs besides the two places to reach the bucket
        (``--endpoint-url``, ``--region``), for the retry command of a failed upload's log line."""
        self._url_for, self._upload, self._log = url_for, upload, log
        self._sync_flags = sync_flags or []
        self._cond = threading.Condition()
        self._pending: Path | None = None
        self._active: Path | None = None
        self._closing = False
        self.records: list[BackupRecord] = []
        self._thread = threading.Thread(target=self._loop, name="clustertrain-backup", daemon=True)
        self._thread.start()

    @classmethod
    def for_run(cls, project: Project, entry: ModelEntry, log: Callable[[str], None] = print) -> "CheckpointBackup | None":
        """The uploader for a run, or None when the project names no checkpoint bucket."""
        if not project.storage.checkpoint_bucket:
            return None
        storage = project.storage
        flags = [*(["--endpoint-url", storage.endpoint_url] if storage.endpoint_url else []),
                 *(["--region", storage.region] if storage.region else [])]
        return cls(lambda ckpt: checkpoint_backup_url(project, entry, ckpt) or "",
                   child_upload(storage.endpoint_url, storage.region), log, flags)

    # -- the training side -------------------------------------------------------------------
    def submit(self, checkpoint: Path) -> None:
        """Queue ``checkpoint`` (returns at once); it replaces a checkpoint still waiting."""
        with self._cond:
            if self._closing:
                raise RuntimeError("CheckpointBackup.submit after close")
            if self._pending is not None and self._pending != checkpoint:
                self._record(BackupRecord(checkpoint=self._pending.name, url=self._url_for(self._pending),
                                          state=BackupState.SUPERSEDED))
                self._log(f"backup of {self._pending.name} skipped: superseded by {checkpoint.name} "
                          f"while {self._active.name if self._active else 'an upload'} was in flight")
            if checkpoint != self._active:
                self._pending = checkpoint
            self._cond.notify_all()

    @contextmanager
    def protected(self) -> Iterator[set[str]]:
        """Hold the hand-over lock; yields the names of checkpoints that must not be deleted now."""
        with self._cond:
            yield {p.name for p in (self._active, self._pending) if p is not None}

    def busy(self) -> bool:
        with self._cond:
            return self._active is not None or self._pending is not None

    def close(self, timeout: float | None = None) -> list[BackupRecord]:
        """Wait for the upload in flight and the waiting one, then stop the thread; return all records."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return list(self.records)

    def last(self, checkpoint: Path) -> BackupRecord | None:
        with self._cond:
            return next((r for r in reversed(self.records) if r.checkpoint == checkpoint.name), None)

    def status_fields(self, final: Path | None) -> dict:
        """The ``status.json`` fields (module docstring) for a run whose last checkpoint is ``final``."""
        with self._cond:
            rec = next((r for r in reversed(self.records) if final is not None and r.checkpoint == final.name), None)
            failed = [r for r in self.records if r.state == BackupState.FAILED]
            waiting = final is not None and final in (self._active, self._pending)
            return {
                "backup": rec.url if rec is not None and rec.state == BackupState.VERIFIED else None,
                "backup_state": BackupState.IN_PROGRESS if waiting else (rec.state if rec is not None else None),
                "backup_error": failed[-1].error if failed else None,
                "backups": [r.model_copy() for r in self.records[-KEEP_RECORDS:]],
            }

    # -- the upload thread -------------------------------------------------------------------
    def _record(self, rec: BackupRecord) -> None:
        self.records.append(rec)
        del self.records[:-KEEP_RECORDS]

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closing:
                    self._cond.wait()
                if self._pending is None:
                    return
                self._active, self._pending = self._pending, None
                ckpt = self._active
            url = self._url_for(ckpt)
            started = time.time()
            try:
                self._upload(ckpt, url)
                rec = BackupRecord(checkpoint=ckpt.name, url=url, state=BackupState.VERIFIED)
                self._log(f"backed up {ckpt.name} to {url} (verified, {time.time() - started:.1f} s)")
            except Exception as e:  # noqa: BLE001 - any failure of a backup is reported, never raised into training
                message = str(e).splitlines()[0] if str(e) else type(e).__name__
                rec = BackupRecord(checkpoint=ckpt.name, url=url, state=BackupState.FAILED, error=message)
                retry = shlex.join(["clustertrain", "storage", "sync", str(ckpt), url, *self._sync_flags])
                self._log(f"backup of {ckpt.name} to {url} FAILED: {message}; training goes on "
                          f"(retry by hand: {retry})")
            rec.started, rec.finished = started, time.time()
            rec.seconds = round(rec.finished - started, 3)
            with self._cond:
                self._record(rec)
                self._active = None
                self._cond.notify_all()


# -- the child process ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """``python -m clustertrain.train.checkpoint_backup DIR URL [--endpoint-url E] [--region R]``: copy and verify."""
    import os

    from clustertrain.storage import StoreConfig, backup_directory

    ap = argparse.ArgumentParser(prog="python -m clustertrain.train.checkpoint_backup")
    ap.add_argument("checkpoint")
    ap.add_argument("url")
    ap.add_argument("--endpoint-url")
    ap.add_argument("--region")
    args = ap.parse_args(argv)
    try:
        os.nice(NICE)
    except OSError:
        pass
    try:
        result = backup_directory(args.checkpoint, args.url,
                                  options=StoreConfig(endpoint_url=args.endpoint_url, region=args.region))
        if not result.ok:
            raise StorageError(f"the copy of {args.checkpoint} at {args.url} did not verify; "
                               f"run `clustertrain storage verify {args.url}`")
    except ClusterTrainError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
