"""Checkpoints: atomic, sharded-ready (torch.distributed.checkpoint), resumable.

Layout below ``RUN_DIR/checkpoints/``::

    step_00000040/          one complete checkpoint
      .metadata, *.distcp   DCP: model and optimizer state (replicated DDP tensors written once)
      rank_<R>.pt           per-rank state: torch/CUDA RNG, LR-scheduler state
      meta.json             :class:`CheckpointMeta` — written LAST:
                            {"format": "clustertrain-checkpoint", "version": 1, "clustertrain": "0.1.0", "step": 40,
                             "consumed_samples": 640, "world_size": 2, "fingerprint": "3f2a09c1d4e5b6a7",
                             "project": "p", "model": "tiny", "time": 1795000000.0}
    latest                  text file naming the newest complete checkpoint directory (atomic rename)
    .tmp-step_...           a save in progress (or killed); removed at the next start

Save protocol: every rank writes into ``.tmp-step_N``; after a barrier rank 0 writes
``meta.json``, fsyncs, renames the directory to ``step_N``, fsyncs the parent, and only then
replaces ``latest``. A kill at any moment therefore leaves ``latest`` at a complete checkpoint.
A directory counts as a checkpoint only when it has both ``meta.json`` and ``.metadata``.

Pruning (``keep_last``) skips the checkpoints a background backup is reading or about to read
(``protected``, see :mod:`clustertrain.train.backup`); they go at a later save or the final
:meth:`CheckpointManager.prune`. A pruned directory is renamed to ``.trash-step_…`` first, so a
kill mid-delete never leaves a half-deleted ``step_…``.

``meta.json`` is read leniently (keys a newer clustertrain added are ignored; ``version`` is the
format's number, ``clustertrain`` the writer's version, see :mod:`clustertrain.runstate`).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from clustertrain.errors import RunDirError
from clustertrain.rundir import fsync_dir, write_atomic
from clustertrain.runstate import StoredRecord, read_record, write_record

if TYPE_CHECKING:  # torch is imported where it is used, so launchers that only read the layout stay light
    import torch

FORMAT = "clustertrain-checkpoint"
VERSION = 1
STEP_DIR = re.compile(r"^step_(\d{8})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def is_complete(path: Path) -> bool:
    return (path / "meta.json").is_file() and (path / ".metadata").is_file()


class CheckpointMeta(StoredRecord):
    """A checkpoint's ``meta.json`` (layout in the module docstring)."""

    format: str = Field(FORMAT, description="Always clustertrain-checkpoint.")
    step: int = Field(..., description="Steps trained when it was saved.")
    consumed_samples: int = Field(0, description="Samples consumed (step x global_batch).")
    world_size: int | None = Field(None, description="Ranks that saved it (their RNG state is in rank_<R>.pt).")
    fingerprint: str | None = Field(None, description="Architecture fingerprint of the model it holds.")
    project: str | None = Field(None, description="Project name.")
    model: str | None = Field(None, description="Model name.")
    time: float | None = Field(None, description="When it was saved (Unix seconds).")


def read_meta(path: Path) -> CheckpointMeta:
    """The ``meta.json`` of the checkpoint directory ``path`` (a damaged one is one :class:`RunDirError` line)."""
    meta = read_record(path / "meta.json", CheckpointMeta)
    if meta is None:
        raise RunDirError(f"{path}: has no meta.json, so it is not a complete checkpoint; move it out of {path.parent}")
    return meta


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint directories, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name) and is_complete(p)]
    return sorted(found, key=lambda p: p.name)


def find_latest(root: Path) -> Path | None:
    """The checkpoint ``latest`` names if it is complete, else the newest complete one."""
    pointer = root / "latest"
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if STEP_DIR.match(candidate.name) and is_complete(candidate):
            return candidate
    done = complete_checkpoints(root)
    return done[-1] if done else None


def check_ownership(root: Path, fingerprint: str, project: str, model: str) -> None:
    """Refuse to resume from checkpoints another project/model/architecture wrote."""
    latest = find_latest(root)
    if latest is None:
        return
    meta = read_meta(latest)
    if meta.fingerprint != fingerprint:
        raise RunDirError(
            f"{root.parent}: holds checkpoints of project {meta.project!r} model {meta.model!r} "
            f"(another project or architecture than {project!r}/{model!r}); use another --run-dir, "
            "or --no-resume to archive them and start over"
        )


def clean_stale(root: Path) -> None:
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(p, ignore_errors=True)


@dataclass
class CheckpointManager:
    root: Path
    keep_last: int
    fingerprint: str
    project: str
    model_name: str
    rank: int
    world_size: int
    protected: Callable[[], AbstractContextManager[set[str]]] | None = None

    def save(self, step: int, consumed_samples: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             extra: dict[str, Any]) -> Path:
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        final = self.root / step_dir_name(step)
        tmp = self.root / f".tmp-{final.name}"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        rank_file = tmp / f"rank_{self.rank}.pt"
        with open(rank_file, "wb") as f:
            torch.save(extra, f)
            f.flush()
            os.fsync(f.fileno())
        _barrier()
        if self.rank == 0:
            meta = CheckpointMeta(version=VERSION, step=step, consumed_samples=consumed_samples,
                                  world_size=self.world_size, fingerprint=self.fingerprint, project=self.project,
                                  model=self.model_name, time=time.time())
            write_record(tmp / "meta.json", meta)
            fsync_dir(tmp)
            if final.exists():  # an earlier save of the same step that `latest` never named
                trash = self.root / f".trash-{final.name}-{os.getpid()}"
                os.replace(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, final)
            fsync_dir(self.root)
            write_atomic(self.root / "latest", final.name + "\n")
            self._prune(final)
        _barrier()
        return final

    def prune(self) -> None:
        """Apply ``keep_last`` now (rank 0; e.g. once the backups a run waited for are done)."""
        newest = find_latest(self.root)
        if newest is not None:
            self._prune(newest)

    def _prune(self, newest: Path) -> None:
        trash: list[Path] = []
        with self.protected() if self.protected is not None else nullcontext(set()) as keep:
            done = [p for p in complete_checkpoints(self.root) if p != newest]
            for old in done[: max(0, len(done) - (self.keep_last - 1))]:
                if old.name in keep:
                    continue
                trash.append(self.root / f".trash-{old.name}")
                os.replace(old, trash[-1])
        for t in trash:
            shutil.rmtree(t, ignore_errors=True)

    def load(self, path: Path, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer) -> tuple[CheckpointMeta, dict[str, Any] | None]:
        """Load model+optimizer in place; return (meta, this rank's extra state or None if the world size changed)."""
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        meta = read_meta(path)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rank_file = path / f"rank_{self.rank}.pt"
        extra = None
        if meta.world_size == self.world_size and rank_file.is_file():
            extra = torch.load(rank_file, weights_only=True)
        return meta, extra


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
