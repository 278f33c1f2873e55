"""The records a run directory holds, typed: ``run.json``, ``status.json`` and the ``COMPLETED`` marker
(where they lie: :mod:`clustertrain.core.run_paths`), and how a rank reads the resolved ``config.yaml`` written
by another clustertrain version.

Every record is a :class:`StoredRecord` (a :class:`~clustertrain.core.schema.StoredModel`): keys a newer
clustertrain added are ignored when read. Each carries ``version``, the number of its format (1), and
``clustertrain``, the version of the clustertrain that wrote it (``"unknown"`` in files from before it
was recorded). Writers write ``model_dump_json()`` with :func:`~clustertrain.core.run_paths.write_atomic`.

``run.json`` (:class:`RunInfo`; written by :func:`clustertrain.launch.prepare.prepare_run` at every
``run``/``submit``)::

    {"version": 1, "clustertrain": "0.1.0", "project": "p", "model": "tiny", "fingerprint": "3f2a09c1d4e5b6a7",
     "dataset": "/fsx/p/datasets/tinyshakespeare-byte", "blend": [], "created": 1795000000.0}

``dataset`` is the prefix (``P`` of ``P.bin``/``P.idx``) of the run's one prepared dataset, or of the first source of
a ``data.blend``; ``blend`` is then every source, in the project's order, as ``{"weight": W, "prefix": P}`` (the
weights as written in the project file: relative shares of the samples), and ``[]`` without a blend. Readers take
the sources from :meth:`RunInfo.sources`; a ``run.json`` written before ``blend`` existed reads as one source.

``status.json`` (:class:`RunStatus`; written by rank 0 when the ranks' run ends,
:func:`clustertrain.train.trainer.write_status`, and again once the last checkpoint backup is done)::

    {"version": 1, "clustertrain": "0.1.0", "state": "COMPLETED", "step": 200, "signal": null,
     "checkpoint": "RUN_DIR/checkpoints/step_00000200", "pid": 4242, "time": 1795000100.0,
     "backup": "s3://b/ckpt/p/tiny/step_00000200", "backup_state": "verified", "backup_error": null,
     "backups": [{"checkpoint": "step_00000200", "url": "s3://b/ckpt/p/tiny/step_00000200", "state": "verified",
                  "started": 1795000090.0, "finished": 1795000100.0, "seconds": 10.0, "error": null}]}

``state`` is ``RUNNING`` (written by rank 0 when the ranks start), then ``COMPLETED`` (training reached
``max_steps``), ``STOPPED`` (a stop signal came first; the run resumes from ``checkpoint``) or ``FAILED`` (written
by rank 0 when training itself failed, e.g. a non-finite loss, or by the local launcher when a rank died;
``message`` says why), spelled as :class:`clustertrain.core.states.State`; files from before read
their lower-case ``"completed"``/``"stopped"``. The backup fields are explained in
:mod:`clustertrain.train.checkpoint_backup`; a backup's ``state`` is a :class:`BackupState`, not a run state.

``COMPLETED``: an empty file, written after ``status.json`` when training reached its last step and
removed when the ranks start (:func:`mark_started`, :func:`mark_completed`), so the batch script decides
whether to requeue with ``[ -e "$RUN_DIR/COMPLETED" ]`` and parses no JSON.

The version check (:func:`read_resolved_config`): the ranks read ``config.yaml`` as resolved by the
clustertrain that prepared the run (the login node's), but run their own (under Pyxis, the container
image's). Keys the rank's version does not know are dropped and named; the rank compares ``run.json``'s
``clustertrain`` with its own ``__version__`` and says so in one line when they differ; a config it
cannot validate at all fails with one line naming both versions and the fix.
"""

from __future__ import annotations

import json
import time
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator

from clustertrain import __version__
from clustertrain.core.errors import ClusterTrainError, ConfigError, RunDirError
from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.core.schema import StoredModel, format_validation_error, loc_str, read_yaml
from clustertrain.core.states import State

UNKNOWN_VERSION = "unknown"
R = TypeVar("R", bound="StoredRecord")
M = TypeVar("M", bound=BaseModel)


class StoredRecord(StoredModel):
    """Base of every record clustertrain writes and reads back (see the module docstring)."""

    version: int = Field(1, description="Number of the record's format.")
    clustertrain: str = Field(default_factory=lambda: __version__,
                              description="Version of the clustertrain that wrote the record.")


def parse_record(data: Any, model: type[R], source: str, error: type[ClusterTrainError] = RunDirError) -> R:
    """Validate one decoded record; a record without ``clustertrain`` reads as written by an unknown version."""
    if isinstance(data, dict):
        data = {"clustertrain": UNKNOWN_VERSION, **data}
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise error(f"{format_validation_error(e, source, model)}; the file is damaged: remove it, "
                    "clustertrain writes it again at the next run") from None


def read_record(path: Path, model: type[R], error: type[ClusterTrainError] = RunDirError) -> R | None:
    """The record in the JSON file ``path``, or None when there is none; a damaged file is one ``error`` line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise error(f"{path}: not valid JSON ({e}); the file is damaged: remove it, "
                    "clustertrain writes it again at the next run") from None
    return parse_record(data, model, str(path), error)


def write_record(path: Path, record: StoredRecord) -> None:
    write_atomic(Path(path), record.model_dump_json(indent=1) + "\n")


# -- run.json -------------------------------------------------------------------------------------


class BlendPrefix(StoredModel):
    """One source of a blend in ``run.json``: its weight and the prefix of its prepared dataset."""

    weight: float = Field(..., description="Relative share of the samples (data.blend[k].weight).")
    prefix: str = Field(..., description="Prefix of the source's prepared dataset (.bin/.idx).")


class RunInfo(StoredRecord):
    """``run.json``: which project, model, architecture and dataset the run directory belongs to."""

    project: str = Field(..., description="Project name.")
    model: str = Field(..., description="Model name.")
    fingerprint: str = Field(..., description="Architecture fingerprint (project.architecture_fingerprint).")
    dataset: str = Field(..., description="Prefix of the prepared dataset (.bin/.idx); a blend's first source.")
    blend: list[BlendPrefix] = Field(default_factory=list, description="Every source of a data.blend, in order "
                                     "(empty without one).")
    created: float = Field(..., description="When the run directory was first prepared (Unix seconds).")

    def sources(self) -> list[tuple[float, str]]:
        """(weight, prefix) of every dataset the run reads: the blend's, or ``[(1.0, dataset)]``."""
        return [(b.weight, b.prefix) for b in self.blend] or [(1.0, self.dataset)]


def read_run_info(paths: RunPaths) -> RunInfo | None:
    return read_record(paths.run_json, RunInfo)


# -- status.json ----------------------------------------------------------------------------------


class BackupState(StrEnum):
    """The state of one checkpoint backup (not a run's state)."""

    VERIFIED = "verified"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    IN_PROGRESS = "in progress"  # status.json's backup_state only: the last checkpoint is still being copied


class BackupRecord(StoredModel):
    """One checkpoint backup (:mod:`clustertrain.train.checkpoint_backup`); times are Unix seconds."""

    checkpoint: str = Field(..., description="Checkpoint directory name (step_…).")
    url: str = Field(..., description="Where the copy goes.")
    state: BackupState = Field(..., description="verified | failed | superseded.")
    started: float | None = Field(None, description="Upload start (null for a superseded one).")
    finished: float | None = Field(None, description="Upload end.")
    seconds: float | None = Field(None, description="Upload duration.")
    error: str | None = Field(None, description="The failure's message.")


class RunStatus(StoredRecord):
    """``status.json``: how the last run of the ranks ended."""

    state: State = Field(..., description="RUNNING (written when the ranks start), then COMPLETED, STOPPED or FAILED.")
    step: int = Field(0, description="Last step trained.")
    signal: str | None = Field(None, description="The stop signal's name (STOPPED).")
    checkpoint: str | None = Field(None, description="The last complete checkpoint.")
    pid: int | None = Field(None, description="Rank 0's process id.")
    message: str | None = Field(None, description="FAILED: why, in one line.")
    time: float | None = Field(None, description="When it was written (Unix seconds).")
    backup: str | None = Field(None, description="URL of the verified copy of the last checkpoint.")
    backup_state: BackupState | None = Field(None, description="State of the last checkpoint's backup.")
    backup_error: str | None = Field(None, description="The last backup failure's message.")
    backups: list[BackupRecord] = Field(default_factory=list, description="The latest backup records, oldest first.")
    stop_saved_s: float | None = Field(None, description="STOPPED: seconds from the stop signal to the committed stop "
                                       "checkpoint (the proof that the save landed before the kill).")

    @field_validator("state", mode="before")
    @classmethod
    def _state(cls, v: Any) -> Any:
        return State.parse(v) if isinstance(v, str) else v


def read_status(paths: RunPaths) -> RunStatus | None:
    return read_record(paths.status, RunStatus)


def write_status_record(paths: RunPaths, status: RunStatus) -> None:
    """Write ``status.json``; when the run completed, then the ``COMPLETED`` marker (after it, so a reader
    that sees the marker finds the final status)."""
    write_record(paths.status, status)
    if status.state == State.COMPLETED:
        mark_completed(paths)


def record_failure(paths: RunPaths, message: str) -> None:
    """The local launcher saw the ranks fail: ``status.json`` says FAILED with the launcher's one-line reason
    (it knows which rank died first; rank 0 may only have seen its peer vanish), keeping the step and checkpoint."""
    try:
        previous = read_status(paths)
    except RunDirError:
        previous = None
    fields = previous.model_dump(exclude={"state", "message", "time", "version", "clustertrain"}) if previous else {}
    write_record(paths.status, RunStatus(**{**fields, "state": State.FAILED, "message": message.splitlines()[0],
                                            "time": time.time()}))


def mark_started(paths: RunPaths) -> None:
    """The ranks start: the run is not completed (again) until they say so."""
    paths.completed.unlink(missing_ok=True)


def mark_completed(paths: RunPaths) -> None:
    write_atomic(paths.completed, b"")


def is_completed(paths: RunPaths) -> bool:
    return paths.completed.is_file()


# -- config.yaml as resolved, read by the ranks -----------------------------------------------------


def unknown_keys(raw: Any, model: type[BaseModel]) -> list[str]:
    """The keys of ``raw`` that ``model`` (strict, at every level) does not know, as ``a.b[0].c`` paths."""
    try:
        model.model_validate(raw)
    except ValidationError as e:
        return [loc_str(tuple(err["loc"])) for err in e.errors() if err["type"] == "extra_forbidden"]
    return []


def read_resolved_config(path: Path, model: type[M], written_by: str,
                         running: str = __version__) -> tuple[M, str | None]:
    """Read the resolved config ``path`` (written by clustertrain ``written_by``) leniently as ``model``:
    return it and the one line to show (None when versions agree and every key is known). A config that
    does not validate raises :class:`ConfigError` naming both versions and the fix."""
    raw = read_yaml(path, ConfigError)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: not a mapping; it is written by `clustertrain run`/`submit`: prepare the run again")
    skewed = written_by not in (running, UNKNOWN_VERSION)
    try:
        config = model.model_validate(raw, extra="ignore")
    except ValidationError as e:
        msg = format_validation_error(e, str(path), model, path)
        if skewed:
            msg += (f"; the run was prepared by clustertrain {written_by}, but this node runs clustertrain {running}: "
                    f"install clustertrain {written_by} on the compute nodes (rebuild the container image), "
                    f"or prepare the run again with clustertrain {running}")
        raise ConfigError(msg) from None
    dropped = unknown_keys(raw, model)
    if not skewed and not dropped:
        return config, None
    parts = [f"warning: {path}:"]
    if skewed:
        parts.append(f"the run was prepared by clustertrain {written_by}, but this node runs clustertrain {running};")
    if dropped:
        parts.append(f"ignored the keys clustertrain {running} does not know: {', '.join(dropped)};")
    parts.append("training goes on; to train exactly what was prepared, install the same clustertrain on the login "
                 "and compute nodes (rebuild the container image, or reinstall)")
    return config, " ".join(parts)
