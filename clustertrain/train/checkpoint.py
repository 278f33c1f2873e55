"""Checkpoints: sharded (torch.distributed.checkpoint), resharding on load, atomic, optionally asynchronous.

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
exactly across a layout change is :mod:`clustertrain.train.state`'s docstring. ``layout`` is
:meth:`clustertrain.train.layout.ParallelLayout.to_dict` of the run that wrote it; the RNG streams are
restored only when it equals the loading run's layout (:meth:`CheckpointManager.same_layout`).

Commit protocol. Every rank writes into ``.tmp-step_N`` (DCP: each rank its files, then the coordinator,
rank 0, gathers every rank's write results and writes ``.metadata`` via ``.metadata.tmp`` + rename; DCP
fsyncs every file). Then rank 0 writes ``meta.json`` (temp + fsync + rename), fsyncs the directory,
renames it to ``step_N``, fsyncs ``checkpoints/``, and only then replaces ``latest`` (temp + rename).
A directory counts as a checkpoint only with both ``meta.json`` and ``.metadata``
(:func:`is_complete`). A kill at any moment therefore leaves ``latest`` naming a complete checkpoint.

Asynchronous saves (``save(..., async_save=True)``). The call first waits for the previous async save
and commits it, then stages the state to CPU memory (pinned on a GPU, reused between saves), starts
``dcp.async_save`` in a background thread on its own gloo process group (so its collectives never
interleave with the training loop's) and returns: training stalls only for the staging copy. Rank 0
commits only after its future resolved. That is sufficient: in torch's ``state_dict_saver._save_state_dict``
the write phase is ``_DistWrapper.all_reduce("write", write_data, finish_checkpoint)`` — every rank
writes its data and the coordinator gathers all ranks' write results, then runs
``storage_writer.finish`` (which writes ``.metadata``), then broadcasts; rank 0's future resolves after
that, so every rank's data and ``.metadata`` are on disk when it does (torch 2.13; DCP fsyncs each data
file before returning its write result). :meth:`~CheckpointManager.commit_finished` (non-blocking, each
step, once every rank has reported its write finished in the trainer's per-step control all-reduce, so all ranks
commit, or fail, at the same step; :meth:`~CheckpointManager.poll` in a single process),
:meth:`~CheckpointManager.wait` (at the end) and the next ``save`` commit it and return its path on rank 0.
The data files are ``torch.save`` records without zip CRC-32s (``torch.load`` never checks them).

Damage after the commit (:meth:`CheckpointManager.load_latest`). ``files`` in ``meta.json`` is the size of
every DCP file (``.metadata`` and each ``.distcp``) when the checkpoint was committed; a checkpoint without it
(written before it was recorded) is checked for ``.metadata`` only. At resume, a checkpoint whose listed files
are missing or of another size, whose ``meta.json`` cannot be read, or that DCP fails to load is skipped: the
resume falls back to the next older complete checkpoint, says so in one line per checkpoint skipped, renames
each skipped one to ``damaged-step_N`` (so pruning and ``latest`` never count it again) and points ``latest``
at the one loaded. Sizes catch truncation and removal before DCP reads garbage; an overwrite of the same
size is caught by DCP's load failing. Only when no checkpoint loads does the resume stop (one line naming
each and the fix).

A save that fails (a full file system, quota, I/O error; in the synchronous write, the asynchronous
write — seen at :meth:`~CheckpointManager.commit_finished`/:meth:`~CheckpointManager.wait` — or the commit) raises one
:class:`~clustertrain.errors.RunDirError` line naming the step, the file system (type, mount point, free and
total space: ``os.statvfs`` and ``/proc/self/mounts``) and the checkpoint ``latest`` still names; rank 0
first removes the half-written ``.tmp-step_N``.

Pruning (``keep_last``) skips the checkpoints a background backup is reading or about to read
(``protected``, see :mod:`clustertrain.train.backup`); they go at a later save or the final
:meth:`CheckpointManager.prune`. A pruned directory is renamed to ``.trash-step_…`` first, so a
kill mid-delete never leaves a half-deleted ``step_…``.

Format versions: 3 (this one: optimizer hyper-parameters per parameter, so pipeline stages save them; any
layout, pipelined or not, loads any other). 2 (the separate q/k/v and gate/up model, hyper-parameters per
parameter group; loaded, written by no pipeline). Format 1 (the fused-qkv model,
``rank_<R>.pt`` side files) is refused in one line (:func:`check_format`). ``meta.json`` is read
leniently (keys a newer clustertrain added are ignored; ``clustertrain`` is the writer's version, see
:mod:`clustertrain.runstate`). Torch is imported inside the methods: the launcher imports this module
to check ownership without loading torch.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from clustertrain.errors import RunDirError
from clustertrain.rundir import fsync_dir, write_atomic
from clustertrain.runstate import StoredRecord, read_record, write_record

if TYPE_CHECKING:
    from concurrent.futures import Future

    from torch.distributed.checkpoint import StorageWriter

FORMAT = "clustertrain-checkpoint"
VERSION = 3
#: oldest format this version loads (2: optimizer hyper-parameters per parameter group)
MIN_VERSION = 2
STEP_DIR = re.compile(r"^step_(\d{8})$")
DAMAGED_PREFIX = "damaged-"
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


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


@dataclass
class LoadedCheckpoint:
    """What :meth:`CheckpointManager.load_latest` loaded; ``notes``: one line per newer checkpoint it skipped."""

    path: Path
    meta: CheckpointMeta
    notes: list[str]


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
    if not path.is_dir():
        return "it does not exist"
    try:
        meta = read_record(path / "meta.json", CheckpointMeta)
    except (RunDirError, ValueError):  # read_record lets a non-UTF-8 file's UnicodeDecodeError through
        return "meta.json is damaged"
    if meta is None:
        return "meta.json is missing"
    for name, size in {".metadata": None, **(meta.files or {})}.items():
        if not (path / name).is_file():
            return f"{name} is missing"
        actual = (path / name).stat().st_size
        if size is not None and actual != size:
            return f"{name} is {actual} bytes, {size} when it was saved"
    return None


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


def clean_stale(root: Path) -> None:
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(p, ignore_errors=True)


WriterFactory = Callable[[Path], "StorageWriter"]
"""Builds the DCP storage writer for one checkpoint directory (default :func:`file_writer`)."""


def file_writer(path: Path) -> StorageWriter:
    """DCP's file writer (one file per rank, every file fsynced), without zip CRC-32s (see :class:`_Writer`)."""
    return _file_writer_class()(str(path), single_file_per_rank=True, sync_files=True)


def _file_writer_class() -> type:
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.serialization import get_crc32_options, set_crc32_options

    class _Writer(FileSystemWriter):
        """``FileSystemWriter`` whose ``torch.save`` records skip the zip CRC-32: ``torch.load`` (DCP's
        reader) never checks it, and computing it is a quarter of a save's time (bench/checkpoint.py).
        DCP writes inside ``write_data`` (its future is already done on return), so the switch is
        scoped to our writes; only a concurrent ``torch.save`` elsewhere in the process could see it."""

        def write_data(self, plan, planner):
            crc = get_crc32_options()
            set_crc32_options(False)
            try:
                return super().write_data(plan, planner)
            finally:
                set_crc32_options(crc)

    return _Writer


@dataclass
class _InFlight:
    """An async save whose data is still being written."""

    future: Future
    step: int
    consumed_samples: int
    final: Path
    tmp: Path


@dataclass
class CheckpointManager:
    """Saves, commits, loads and prunes one run's checkpoints (protocol in the module docstring).
    Every rank holds one and calls :meth:`save`, :meth:`wait` and :meth:`load` together.

    ``process_group``: where async saves run their collectives, from a background thread. Nothing else
    may use that group meanwhile (two threads issuing collectives on one group can pair them differently
    on different ranks); None makes a dedicated gloo group at the first async save.
    ``writer``: the DCP storage writer for a directory (a test passes a slow one)."""

    root: Path
    keep_last: int
    fingerprint: str
    project: str
    model_name: str
    rank: int
    world_size: int
    layout: dict[str, Any] | None = None
    process_group: Any = None
    protected: Callable[[], AbstractContextManager[set[str]]] | None = None
    writer: WriterFactory = file_writer
    _inflight: _InFlight | None = field(default=None, init=False, repr=False)
    _stager: Any = field(default=None, init=False, repr=False)
    _async_group: Any = field(default=None, init=False, repr=False)

    # -- saving ----------------------------------------------------------------------------------
    def save(self, step: int, consumed_samples: int, state: dict[str, Any], *, async_save: bool = False) -> Path | None:
        """Save ``state`` (:func:`clustertrain.train.state.app_state`) as step ``step``. Synchronous: returns
        the committed directory on every rank. Asynchronous: waits for the previous async save and commits
        it, stages ``state`` to CPU, starts writing it and returns the previous save's directory if this
        call committed it (rank 0), else None; :meth:`poll`/:meth:`wait` commit the new one. A synchronous save
        commits an async save still in flight without returning it: call :meth:`wait` first to see it."""
        import torch.distributed.checkpoint as dcp

        previous = self.wait()
        final = self.root / step_dir_name(step)
        tmp = self.root / f".tmp-{final.name}"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        if not async_save:
            try:
                dcp.save(state, storage_writer=self.writer(tmp), no_dist=not _distributed())
            except _save_errors() as e:  # every rank gets the same failure (DCP gathers them)
                raise self._failed(step, tmp, e) from None
            if self.rank == 0:
                self._commit(_InFlight(None, step, consumed_samples, final, tmp))  # type: ignore[arg-type]
            _barrier()
            return final
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
        response = dcp.async_save(state, storage_writer=self.writer(tmp), process_group=self._group(),
                                  async_stager=self._staging(), no_dist=not _distributed())
        future = response.upload_completion if isinstance(response, AsyncSaveResponse) else response
        self._inflight = _InFlight(future, step, consumed_samples, final, tmp)
        return previous

    def poll(self) -> Path | None:
        """Without blocking, in a single process: if the in-flight async save has finished, commit it and return
        its path. Ranks of a group must not each poll (their writes finish at different moments, so they would
        commit, or fail, at different steps): they agree on :meth:`finished_step` and call
        :meth:`commit_finished` with the agreed step."""
        return self.commit_finished(self.finished_step())

    def finished_step(self) -> int:
        """The step of the in-flight async save when this rank's write has finished (written or failed), else -1."""
        return self._inflight.step if self._inflight is not None and self._inflight.future.done() else -1

    def commit_finished(self, step: int) -> Path | None:
        """Every rank, with the same ``step``: the minimum of every rank's :meth:`finished_step` (as Megatron-LM's
        ``AsyncCallsQueue`` all-reduces "is done" before finalizing). Commits the in-flight save if it is that
        step (every rank has finished writing it, so :meth:`wait` does not block); its path on rank 0, else None.
        A failed write raises here on every rank at once."""
        if self._inflight is None or self._inflight.step != step:
            return None
        return self.wait()

    def wait(self) -> Path | None:
        """Block until the in-flight async save is written; commit it. Its path on rank 0, else None."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return None
        try:
            inflight.future.result()  # a failed write raises here, on every rank (DCP broadcasts failures)
        except _save_errors() as e:
            raise self._failed(inflight.step, inflight.tmp, e) from None
        return self._commit(inflight) if self.rank == 0 else None

    def close(self) -> Path | None:
        """:meth:`wait`, then release the staging memory; returns what :meth:`wait` returns."""
        try:
            return self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    def _commit(self, done: _InFlight) -> Path:
        """Rank 0: meta.json, rename to ``step_N``, then ``latest`` (each step durable before the next)."""
        meta = CheckpointMeta(version=VERSION, step=done.step, consumed_samples=done.consumed_samples,
                              world_size=self.world_size, layout=self.layout, fingerprint=self.fingerprint,
                              project=self.project, model=self.model_name, time=time.time(), files=dcp_files(done.tmp))
        try:
            write_record(done.tmp / "meta.json", meta)
            fsync_dir(done.tmp)
        except OSError as e:
            raise self._failed(done.step, done.tmp, e) from None
        if done.final.exists():  # an earlier save of the same step that `latest` never named
            trash = self.root / f".trash-{done.final.name}-{os.getpid()}"
            os.replace(done.final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(done.tmp, done.final)
        fsync_dir(self.root)
        try:
            write_atomic(self.root / "latest", done.final.name + "\n")
        except OSError as e:  # the checkpoint is complete; `latest` still names the one before it
            raise self._failed(done.step, done.tmp, e) from None
        self._prune(done.final)
        return done.final

    def _failed(self, step: int, tmp: Path, error: BaseException) -> RunDirError:
        """The one line for a save that failed (rank 0 first removes its half-written directory): the step, the
        file system (full, or the error), the checkpoint ``latest`` still names, and the fix."""
        where = describe_file_system(self.root)  # before the cleanup frees space: shows what the save met
        no_space = os.statvfs(self.root).f_bavail == 0  # torch's zip writer reports ENOSPC as "unexpected pos ..."
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        cause = _os_error(error)
        if cause is not None and cause.errno in FULL_ERRNOS:
            what = f"the file system is full ({cause.strerror}): {where}"
        elif no_space:
            what = f"the file system is full (No space left on device): {where}"
        else:
            what = f"the write failed ({_one_line(cause or error)}) on {where}"
        latest = find_latest(self.root)
        kept = f"latest still names {latest.name}" if latest is not None else "no earlier checkpoint exists"
        return RunDirError(f"checkpoint step {step} was not saved in {self.root}: {what}; {kept}; free space there "
                           "or move the run to a larger file system (--run-dir or storage.root), then run the same "
                           "command again to resume")

    def _group(self) -> Any:
        """The process group of async saves' background collectives: the one given, else a gloo group of
        all ranks made at the first async save (every rank saves together, so every rank makes it)."""
        if self.process_group is not None or not _distributed():
            return self.process_group
        if self._async_group is None:
            import torch.distributed as dist

            self._async_group = dist.new_group(backend="gloo")
        return self._async_group

    def _staging(self) -> Any:
        """One stager for the run: its CPU copies (pinned on a GPU) are allocated once and reused — where the
        stager allows it. torch 2.11's DefaultStager is spent after one stage (its copy table is cleared; the
        next stage fails with ``KeyError: <class 'type'>``, seen on an H200 with torch 2.11.0+cu130, the
        PyTorch of the NGC 26.02 image): then a new one is made for each save."""
        spent = getattr(getattr(self._stager, "_state_dict_stager", None), "_deepcopy_dispatch", None) == {}
        if self._stager is None or spent:
            import torch
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            gpu = torch.cuda.is_available()
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=gpu, use_shared_memory=False,
                                                        use_async_staging=False, use_non_blocking_copy=gpu))
        return self._stager

    # -- pruning ---------------------------------------------------------------------------------
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

    # -- loading ---------------------------------------------------------------------------------
    def same_layout(self, meta: CheckpointMeta) -> bool:
        """Whether the checkpoint was written by ranks laid out as this run's (then its RNG streams apply)."""
        if meta.world_size != self.world_size or meta.layout is None or self.layout is None:
            return meta.world_size == self.world_size and meta.layout == self.layout
        from clustertrain.train.layout import LAYOUT_DEFAULTS

        return {**LAYOUT_DEFAULTS, **meta.layout} == {**LAYOUT_DEFAULTS, **self.layout}  # keys added since default

    def load_latest(self, state: dict[str, Any]) -> LoadedCheckpoint | None:
        """Load the newest checkpoint that loads (:meth:`load`; order: :func:`resume_candidates`) into ``state``;
        None when there is none. A damaged one (:func:`damage`, or DCP cannot read it) is skipped, set aside and
        named in one note; rank 0 then points ``latest`` at the one loaded. Every rank calls it together (the
        checks read the same files, and DCP's load fails on every rank alike). Refusals of :meth:`load` (another
        architecture, another format) are raised, not skipped; when every checkpoint is damaged, one line
        names each."""
        skipped: list[tuple[Path, str]] = []
        for path in resume_candidates(self.root):
            problem = damage(path)
            if problem is None:
                try:
                    meta = self._load(path, state)
                except _Unloadable as e:
                    problem = f"DCP cannot load it: {e}"
                else:
                    return LoadedCheckpoint(path, meta, self._set_aside(skipped, path))
            skipped.append((path, problem))
        if not skipped:
            return None
        named = "; ".join(f"{p.name}: {why}" for p, why in skipped)
        raise RunDirError(f"{self.root}: no checkpoint can be loaded ({named}); restore one from its backup "
                          "(clustertrain storage restore URL RUN_DIR/checkpoints/step_N) or use --no-resume to "
                          "archive them and start over")

    def _set_aside(self, skipped: list[tuple[Path, str]], loaded: Path) -> list[str]:
        """Rank 0: rename each skipped checkpoint to ``damaged-step_N`` and point ``latest`` at ``loaded``
        (after the collective load, so every rank has done its checks). The notes, one per skipped one."""
        notes = []
        for path, why in skipped:
            note = f"skipped checkpoint {path} ({why}): resuming from {loaded.name} instead"
            if path.is_dir():
                aside = self.root / f"{DAMAGED_PREFIX}{path.name}"
                if aside.exists():
                    aside = self.root / f"{DAMAGED_PREFIX}{path.name}-{time.time_ns()}"
                note += f"; set aside as {aside.name}"
                if self.rank == 0:
                    os.replace(path, aside)
            notes.append(note)
        if self.rank == 0 and skipped:
            fsync_dir(self.root)
            write_atomic(self.root / "latest", loaded.name + "\n")
        return notes

    def load(self, path: Path, state: dict[str, Any]) -> CheckpointMeta:
        """Load the checkpoint ``path`` into ``state`` in place, resharding to this run's layout. The
        ``rng`` entry is loaded only at :meth:`same_layout`, else left out (those streams restart)."""
        try:
            return self._load(path, state)
        except _Unloadable as e:
            raise RunDirError(f"{path}: cannot be loaded into this model ({e}); resume with the "
                              "architecture that wrote it, or use --no-resume to archive it or another "
                              "--run-dir") from None

    def _load(self, path: Path, state: dict[str, Any]) -> CheckpointMeta:
        """:meth:`load`, raising :class:`_Unloadable` when DCP cannot read the checkpoint into ``state``."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        meta = read_meta(path)
        if meta.fingerprint != self.fingerprint:
            raise RunDirError(f"{path}: holds model {meta.model!r} of project {meta.project!r}, another "
                              f"architecture than {self.project!r}/{self.model_name!r}; use another --run-dir, "
                              "or --no-resume to archive it and start over")
        check_format(path, meta)
        if not self.same_layout(meta):
            state = {k: v for k, v in state.items() if k != "rng"}
        if meta.version < 3 and "model_optim" in state:  # format 2: optimizer hyper-parameters per parameter group
            from clustertrain.train.state import ModelOptimState

            old = state["model_optim"]
            state = {**state, "model_optim": ModelOptimState(old.model, old.optimizer, flatten=False)}
        try:
            dcp.load(state, checkpoint_id=str(path), no_dist=not _distributed())
        except (CheckpointException, RuntimeError, ValueError, KeyError, EOFError, OSError) as e:
            raise _Unloadable(_one_line(e)) from None
        return meta


def _save_errors() -> tuple[type[BaseException], ...]:
    """What a failed DCP write raises: its CheckpointException is a BaseException (gathered rank failures)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


class _Unloadable(Exception):
    """DCP could not read a checkpoint into the state (damaged files, or another shape); the message is one line."""


def describe_file_system(path: Path) -> str:
    """``"<type> mounted at <mount point>, <free> free of <total>"`` for the file system holding ``path``
    (its mount from ``/proc/self/mounts``: the longest mount point above it, the last mounted on top)."""
    real = os.path.realpath(path)
    mount, kind = "/", "unknown"
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])  # \040 is a space
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(mount):
                    mount, kind = point, fields[2]
    except OSError:
        pass
    st = os.statvfs(path)
    return (f"{kind} mounted at {mount}, {_size(st.f_bavail * st.f_frsize)} free of "
            f"{_size(st.f_blocks * st.f_frsize)}")


def _size(n: int) -> str:
    """Bytes for a person: ``812 B``, ``3.4 MiB``, ``1.2 TiB``."""
    if n < 1024:
        return f"{n} B"
    power = min(4, (n.bit_length() - 1) // 10)
    return f"{n / 1024 ** power:.1f} {('KiB', 'MiB', 'GiB', 'TiB')[power - 1]}"


def _os_error(e: BaseException | None, depth: int = 0) -> OSError | None:
    """The first :class:`OSError` behind ``e``: itself, a DCP rank failure (``failures``), a cause or context
    (torch.save turns a failed write into a RuntimeError whose context is the OSError)."""
    if e is None or depth > 8:
        return None
    if isinstance(e, OSError) and e.errno is not None:
        return e
    failures = getattr(e, "failures", None) or {}
    inner = [failures[r][0] for r in sorted(failures)] + [e.__cause__, e.__context__]
    return next((found for x in inner if (found := _os_error(x, depth + 1)) is not None), None)


def _one_line(e: BaseException) -> str:
    """The lowest failing rank's message, on one line (DCP wraps each rank's exception with its traceback)."""
    failures = getattr(e, "failures", None)
    if failures:
        e = failures[min(failures)][0]
    text = " ".join(str(e).split())
    return text[:300] + ("…" if len(text) > 300 else "")


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        import torch.distributed as dist

        dist.barrier()
