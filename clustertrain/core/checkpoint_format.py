"""The checkpoint format, read side: where a run's checkpoints lie, what ``meta.json`` holds, which directory
counts, which one a resume takes and whether it is damaged. Pure Python (no torch): the launcher checks ownership,
``status`` and the report list checkpoints with it; the trainer's :mod:`clustertrain.train.checkpoint` writes and
loads them.

Layout below ``RUN_DIR/checkpoints/``::

    step_00000040/          one complete checkpoint
      __<R>_0.distcp        DCP data: what rank R wrote (its local shards; a replicated tensor once)
      .metadata             DCP index: every tensor's global shape and which file holds which chunk
      meta.json             :class:`CheckpointMeta` — written LAST:
                            {"format": "clustertrain-checkpoint", "version": 3, "clustertrain": "0.2.0",
                             "step": 40, "consumed_samples": 640, "world_size": 4,
                             "layout": {"world": 4, "dp": 2, "tp": 2, "pp": 1, "zero_stage": 3, ...},
                             "fingerprint": "3f2a09c1d4e5b6a7", "project": "p", "model": "tiny",
                             "time": 1795000000.0,
                             "files": {".metadata": 5784, "__0_0.distcp": 2353355, ...}}
    latest                  text file naming the newest complete checkpoint directory (atomic rename)
    .tmp-step_...           a save in progress (or killed); removed at the next start
    .trash-step_...         a checkpoint being pruned
    damaged-step_...        a checkpoint found damaged at resume, set aside (kept for a person to look at)

What the DCP state dict holds (model, optimizer, step and data position, per-rank RNG) and what resumes
exactly across a layout change is :mod:`clustertrain.train.checkpoint_state`'s docstring. ``layout`` is
:meth:`clustertrain.core.parallel_layout.ParallelLayout.to_dict` of the run that wrote it; the RNG streams are
restored only when it equals the loading run's layout (:meth:`CheckpointManager.same_layout`).

A directory counts as a checkpoint only with both ``meta.json`` and ``.metadata`` (:func:`is_complete`); the
commit protocol that guarantees it is :mod:`clustertrain.train.checkpoint`'s docstring.

Damage after the commit (:meth:`CheckpointManager.load_latest`). ``files`` in ``meta.json`` is the size of
every DCP file (``.metadata`` and each ``.distcp``) when the checkpoint was committed; a checkpoint without it
(written before it was recorded) is checked for ``.metadata`` only. At resume, a checkpoint whose listed files
are missing or of another size, whose ``meta.json`` cannot be read, or that DCP fails to load is skipped: the
resume falls back to the next older complete checkpoint, says so in one line per checkpoint skipped, renames
each skipped one to ``damaged-step_N`` (so pruning and ``latest`` never count it again) and points ``latest``
at the one loaded. Sizes catch truncation and removal before DCP reads garbage; an overwrite of the same
size is caught by DCP's load failing. Only when no checkpoint loads does the resume stop (one line naming
each and the fix).

Format versions: 3 (this one: optimizer hyper-parameters per parameter, so pipeline stages save them; any
layout, pipelined or not, loads any other). 2 (the separate q/k/v and gate/up model, hyper-parameters per
parameter group; loaded, written by no pipeline). Format 1 (the fused-qkv model,
``rank_<R>.pt`` side files) is refused in one line (:func:`check_format`). ``meta.json`` is read
leniently (keys a newer clustertrain added are ignored; ``clustertrain`` is the writer's version, see
:mod:`clustertrain.core.run_records`). Torch is imported inside the methods: the launcher imports this module
to check ownership without loading torch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import Field

from clustertrain.core.errors import RunDirError
from clustertrain.core.run_records import StoredRecord, read_record

FORMAT = "clustertrain-checkpoint"
VERSION = 3
#: oldest format this version loads (2: optimizer hyper-parameters per parameter group)
MIN_VERSION = 2
STEP_DIR = re.compile(r"^step_(\d{8})$")
DAMAGED_PREFIX = "damaged-"


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def is_complete(path: Path) -> bool:
    return (path / "meta.json").is_file() and (path / ".metadata").is_file()


class CheckpointMeta(StoredRecord):
    """A checkpoint's ``meta.json`` (layout in the module docstring)."""

    format: str = Field(FORMAT, description="Always clustertrain-checkpoint.")
    step: int = Field(..., description="Steps trained when it was saved.")
    consumed_samples: int = Field(0, description="Samples consumed (step x global_batch).")
    world_size: int | None = Field(None, description="Ranks that saved it.")
    layout: dict[str, Any] | None = Field(None, description="ParallelLayout.to_dict() of the run that saved it.")
    fingerprint: str | None = Field(None, description="Architecture fingerprint of the model it holds.")
    project: str | None = Field(None, description="Project name.")
    model: str | None = Field(None, description="Model name.")
    time: float | None = Field(None, description="When it was saved (Unix seconds).")
    files: dict[str, int] | None = Field(None, description="Size in bytes of every DCP file (.metadata, each .distcp) "
                                         "at commit; None in checkpoints saved before it was recorded.")


def read_meta(path: Path) -> CheckpointMeta:
    """The ``meta.json`` of the checkpoint directory ``path`` (a damaged one is one :class:`RunDirError` line)."""
    meta = read_record(path / "meta.json", CheckpointMeta)
    if meta is None:
        raise RunDirError(f"{path}: has no meta.json, so it is not a complete checkpoint; move it out of {path.parent}")
    return meta


def check_format(path: Path, meta: CheckpointMeta) -> None:
    """Refuse a checkpoint whose format this version cannot load (one :class:`RunDirError` line)."""
    if MIN_VERSION <= meta.version <= VERSION:
        return
    if meta.version < MIN_VERSION:
        raise RunDirError(
            f"{path}: written by clustertrain {meta.clustertrain} with the fused-qkv model (checkpoint format "
            f"{meta.version}); this version cannot load it — use --no-resume to archive it or another --run-dir")
    raise RunDirError(
        f"{path}: written by clustertrain {meta.clustertrain} in checkpoint format {meta.version}, newer than this "
        f"version reads ({VERSION}); upgrade clustertrain, or use --no-resume to archive it or another --run-dir")


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint directories, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name) and is_complete(p)]
    return sorted(found, key=lambda p: p.name)


def resume_candidates(root: Path) -> list[Path]:
    """Where a resume looks, in order: the directory ``latest`` names (complete or not), then every other
    complete checkpoint, newest first."""
    pointer = root / "latest"
    named = pointer.read_bytes().decode("utf-8", "replace").strip() if pointer.is_file() else ""  # may be garbage
    first = [root / named] if STEP_DIR.match(named) else []
    return first + [p for p in reversed(complete_checkpoints(root)) if p.name != named]


def find_latest(root: Path) -> Path | None:
    """The checkpoint ``latest`` names if it is complete, else the newest complete one."""
    return next((p for p in resume_candidates(root) if is_complete(p)), None)


def dcp_files(path: Path) -> dict[str, int]:
    """Size of every DCP file (``.metadata`` and each ``.distcp``) in the checkpoint directory ``path``."""
    return {p.name: p.stat().st_size for p in sorted(path.iterdir())
            if p.is_file() and (p.name == ".metadata" or p.name.endswith(".distcp"))}


def damage(path: Path) -> str | None:
    """Why the checkpoint directory ``path`` cannot be loaded as committed (a file missing, of another size than
    ``meta.json`` records, or an unreadable ``meta.json``), or None."""
    return inspect(path)[1]


def inspect(path: Path) -> tuple[CheckpointMeta | None, str | None]:
    """The checkpoint directory ``path``'s ``meta.json`` (None when unreadable) and its :func:`damage` — one
    ``stat`` per DCP file, one listing of the directory, one read of ``meta.json``."""
    if not path.is_dir():
        return None, "it does not exist"
    try:
        meta = read_record(path / "meta.json", CheckpointMeta)
    except (RunDirError, ValueError):  # read_record lets a non-UTF-8 file's UnicodeDecodeError through
        return None, "meta.json is damaged"
    if meta is None:
        return None, "meta.json is missing"
    sizes = {e.name: e.stat().st_size for e in os.scandir(path) if e.is_file()}
    for name, size in {".metadata": None, **(meta.files or {})}.items():
        if name not in sizes:
            return meta, f"{name} is missing"
        if size is not None and sizes[name] != size:
            return meta, f"{name} is {sizes[name]} bytes, {size} when it was saved"
    return meta, None


def check_ownership(root: Path, fingerprint: str, project: str, model: str) -> None:
    """Refuse to resume from checkpoints another project/model/architecture wrote, or in a format this
    version cannot load. Judged on the newest complete checkpoint whose ``meta.json`` reads (a damaged one is
    skipped, as :meth:`CheckpointManager.load_latest` skips it)."""
    readable = ((p, _readable_meta(p)) for p in resume_candidates(root) if is_complete(p))
    found = next(((p, m) for p, m in readable if m is not None), None)
    if found is None:
        return
    latest, meta = found
    if meta.fingerprint != fingerprint:
        raise RunDirError(
            f"{root.parent}: holds checkpoints of project {meta.project!r} model {meta.model!r} "
            f"(another project or architecture than {project!r}/{model!r}); use another --run-dir, "
            "or --no-resume to archive them and start over"
        )
    check_format(latest, meta)


def _readable_meta(path: Path) -> CheckpointMeta | None:
    try:
        return read_meta(path)
    except (RunDirError, ValueError):  # read_record lets a non-UTF-8 file's UnicodeDecodeError through
        return None
