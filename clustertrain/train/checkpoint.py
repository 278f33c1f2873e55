"""Checkpoints: sharded (torch.distributed.checkpoint), resharding on load, atomic, optionally asynchronous.

The format (layout below ``RUN_DIR/checkpoints/``, ``meta.json``, which directory counts, the damage check) is
:mod:`clustertrain.core.checkpoint_format`; asynchronous saves are :mod:`clustertrain.train.checkpoint_async`; the
one line of a failed save, :mod:`clustertrain.train.checkpoint_failures`. This module is the manager that every rank
holds: save, commit, load, prune.

Commit protocol. Every rank writes into ``.tmp-step_N`` (DCP: each rank its files, then the coordinator,
rank 0, gathers every rank's write results and writes ``.metadata`` via ``.metadata.tmp`` + rename; DCP
fsyncs every file). Then rank 0 writes ``meta.json`` (temp + fsync + rename), fsyncs the directory,
renames it to ``step_N``, fsyncs ``checkpoints/``, and only then replaces ``latest`` (temp + rename).
A directory counts as a checkpoint only with both ``meta.json`` and ``.metadata``
(:func:`is_complete`). A kill at any moment therefore leaves ``latest`` naming a complete checkpoint.

Resume (:meth:`CheckpointManager.load_latest`): **rank 0 decides, once, and broadcasts**. Rank 0 alone reads the
run's checkpoints — ownership (:func:`~clustertrain.core.checkpoint_format.check_ownership`: another project, model
or format is refused), then each candidate's ``meta.json`` and the size of each of its DCP files
(:func:`~clustertrain.core.checkpoint_format.inspect`) — and broadcasts what it found (each candidate's path, meta,
damage and set-aside name, or the refusal's one line) on the manager's CPU group. Every other rank then touches only
what DCP's load reads (``.metadata`` and the data files holding its shards): at 640 ranks a restart costs the
metadata server one pass over the files, not 640. A checkpoint whose files do not match its ``meta.json`` or that
DCP fails to load (on every rank alike: DCP gathers load failures) is skipped, set aside as ``damaged-step_N`` by
rank 0, and the resume falls back to the next older one (details: the format's docstring); every rank logs the same
notes and raises the same one-line error.

Pruning (``keep_last``) skips the checkpoints a background backup is reading or about to read
(``protected``, see :mod:`clustertrain.train.checkpoint_backup`); they go at a later save or the final
:meth:`CheckpointManager.prune`. A pruned directory is renamed to ``.trash-step_…-<ns>`` inside the commit (one
rename each: ``latest``, ``keep_last`` and ``find_latest`` see the result at once) and deleted **off the training
path** by a background thread of rank 0 (:class:`Deleter`; ``close``/``prune`` wait for it). A kill mid-delete leaves
a ``.trash-…`` that no reader counts and :func:`clean_stale` removes at the next start.

Torch is imported inside the methods: the launcher reads checkpoints without loading torch (through the format
module), and a rank imports this module before it initialises torch.distributed.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clustertrain.core.checkpoint_format import (
    DAMAGED_PREFIX,
    VERSION,
    CheckpointMeta,
    check_format,
    check_ownership,
    complete_checkpoints,
    dcp_files,
    find_latest,
    inspect,
    read_meta,
    resume_candidates,
    step_dir_name,
)
from clustertrain.core.errors import RunDirError
from clustertrain.core.run_paths import fsync_dir, write_atomic
from clustertrain.core.run_records import write_record
from clustertrain.train.checkpoint_async import (
    AsyncSaves, InFlight, WriterFactory, barrier, distributed, file_writer, save_planner,
)
from clustertrain.train.checkpoint_failures import FULL_ERRNOS, describe_file_system, one_line, os_error, save_errors


@dataclass
class LoadedCheckpoint:
    """What :meth:`CheckpointManager.load_latest` loaded; ``notes``: one line per newer checkpoint it skipped."""

    path: Path
    meta: CheckpointMeta
    notes: list[str]


def clean_stale(root: Path) -> None:
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(p, ignore_errors=True)


class Deleter:
    """Deletes directories already renamed out of the way (``.trash-…``) in one background thread, in order."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Path] = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, path: Path) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="checkpoint-prune", daemon=True)
            self._thread.start()
        self._queue.put(path)

    def drain(self) -> None:
        """Wait until everything submitted is deleted."""
        if self._thread is not None:
            self._queue.join()

    def _run(self) -> None:
        while True:
            path = self._queue.get()
            try:
                shutil.rmtree(path, ignore_errors=True)
            finally:
                self._queue.task_done()


@dataclass
class Candidate:
    """What rank 0 found about one checkpoint a resume may take (broadcast to every rank): its ``meta.json`` (None if
    unreadable), why it cannot be loaded as committed (None: it can), and the name it is set aside as if skipped."""

    path: Path
    meta: CheckpointMeta | None
    problem: str | None
    aside: str | None


@dataclass
class CheckpointManager:
    """Saves, commits, loads and prunes one run's checkpoints (protocol in the module docstring).
    Every rank holds one and calls :meth:`save`, :meth:`wait` and :meth:`load` together.

    ``process_group``: a CPU (gloo) group over every rank — the trainer's control group; None: the default group.
    It carries rank 0's resume decision (:meth:`load_latest`) and, once, the writer processes' store address
    (:mod:`clustertrain.train.checkpoint_async`); async saves' own collectives run in the writer processes.
    ``writer``: the DCP storage writer for a directory (a test passes a slow one; pickled to the writer process,
    so its class is defined at module level).
    ``overlap_staging``: an async save returns before its state is copied; call :meth:`staged` before the next
    optimizer step (see :mod:`clustertrain.train.checkpoint_async`)."""

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
    overlap_staging: bool = False
    _async: AsyncSaves = field(init=False, repr=False)
    _deleter: Deleter = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._async = AsyncSaves(self.process_group, overlap=self.overlap_staging, lowest_rank=self.lowest_rank)
        self._deleter = Deleter()

    @property
    def lowest_rank(self) -> bool:
        """Replicated entries written by the lowest rank holding them: in a sharded (FSDP) layout of several ranks
        (:func:`clustertrain.train.checkpoint_async.save_planner`)."""
        return self.world_size > 1 and (self.layout or {}).get("zero_stage") == 3

    def prepare_async(self) -> None:
        """Start this rank's checkpoint writer process in the background, so that the first async save does not wait
        for it (spawn, import torch, the writers' rendezvous). Every rank together (one broadcast); optional: the
        first async save starts it otherwise."""
        self._async.prepare()

    # -- saving ----------------------------------------------------------------------------------
    def save(self, step: int, consumed_samples: int, state: dict[str, Any], *, async_save: bool = False) -> Path | None:
        """Save ``state`` (:func:`clustertrain.train.checkpoint_state.app_state`) as step ``step``. Synchronous: returns
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
        barrier()
        if not async_save:
            try:
                dcp.save(state, storage_writer=self.writer(tmp), planner=save_planner(self.lowest_rank),
                         no_dist=not distributed())
            except save_errors() as e:  # every rank gets the same failure (DCP gathers them)
                raise self._failed(step, tmp, e) from None
            if self.rank == 0:
                self._commit(InFlight(None, step, consumed_samples, final, tmp))  # type: ignore[arg-type]
            barrier()
            return final
        self._async.start(state, self.writer(tmp), step, consumed_samples, final, tmp)
        return previous

    def staged(self) -> None:
        """With ``overlap_staging``: wait until the async save in flight has copied the state (call it before the
        optimizer step changes parameters and moments in place); at once otherwise."""
        self._async.staged()

    def poll(self) -> Path | None:
        """Without blocking, in a single process: if the in-flight async save has finished, commit it and return
        its path. Ranks of a group must not each poll (their writes finish at different moments, so they would
        commit, or fail, at different steps): they agree on :meth:`finished_step` and call
        :meth:`commit_finished` with the agreed step."""
        return self.commit_finished(self.finished_step())

    def finished_step(self) -> int:
        """The step of the in-flight async save when this rank's write has finished (written or failed), else -1."""
        return self._async.finished_step()

    def commit_finished(self, step: int) -> Path | None:
        """Every rank, with the same ``step``: the minimum of every rank's :meth:`finished_step` (as Megatron-LM's
        ``AsyncCallsQueue`` all-reduces "is done" before finalizing). Commits the in-flight save if it is that
        step (every rank has finished writing it, so :meth:`wait` does not block); its path on rank 0, else None.
        A failed write raises here on every rank at once."""
        if self._async.step is None or self._async.step != step:
            return None
        return self.wait()

    def wait(self) -> Path | None:
        """Block until the in-flight async save is written; commit it. Its path on rank 0, else None."""
        inflight = self._async.take()
        if inflight is None:
            return None
        try:
            inflight.future.result()  # a failed write raises here, on every rank (DCP broadcasts failures)
        except save_errors() as e:
            raise self._failed(inflight.step, inflight.tmp, e) from None
        return self._commit(inflight) if self.rank == 0 else None

    def close(self) -> Path | None:
        """:meth:`wait`, then release the staging memory, stop the writer process and finish pending deletes; returns
        what :meth:`wait` returns. Call it at the end of a run, and on failure (it never hangs: a writer that does not
        stop is killed)."""
        try:
            return self.wait()
        finally:
            self._async.release()
            self._deleter.drain()

    def _commit(self, done: InFlight) -> Path:
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
            self._deleter.submit(self._trash(done.final))
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
        cause = os_error(error)
        if cause is not None and cause.errno in FULL_ERRNOS:
            what = f"the file system is full ({cause.strerror}): {where}"
        elif no_space:
            what = f"the file system is full (No space left on device): {where}"
        else:
            what = f"the write failed ({one_line(cause or error)}) on {where}"
        latest = find_latest(self.root)
        kept = f"latest still names {latest.name}" if latest is not None else "no earlier checkpoint exists"
        return RunDirError(f"checkpoint step {step} was not saved in {self.root}: {what}; {kept}; free space there "
                           "or move the run to a larger file system (--run-dir or storage.root), then run the same "
                           "command again to resume")

    # -- pruning ---------------------------------------------------------------------------------
    def prune(self) -> None:
        """Apply ``keep_last`` now and wait for the deletes (rank 0; e.g. once the backups a run waited for are done)."""
        newest = find_latest(self.root)
        if newest is not None:
            self._prune(newest)
        self._deleter.drain()

    def _prune(self, newest: Path) -> None:
        """Rename what ``keep_last`` drops out of the way now; the background thread deletes it."""
        with self.protected() if self.protected is not None else nullcontext(set()) as keep:
            done = [p for p in complete_checkpoints(self.root) if p != newest]
            trash = [self._trash(old) for old in done[: max(0, len(done) - (self.keep_last - 1))] if old.name not in keep]
        for t in trash:
            self._deleter.submit(t)

    def _trash(self, path: Path) -> Path:
        """Rename ``path`` to a unique ``.trash-…`` name (atomic: it is no checkpoint from now on)."""
        trash = self.root / f".trash-{path.name}-{time.time_ns()}"
        os.replace(path, trash)
        return trash

    # -- loading ---------------------------------------------------------------------------------
    def same_layout(self, meta: CheckpointMeta) -> bool:
        """Whether the checkpoint was written by ranks laid out as this run's (then its RNG streams apply)."""
        if meta.world_size != self.world_size or meta.layout is None or self.layout is None:
            return meta.world_size == self.world_size and meta.layout == self.layout
        from clustertrain.core.parallel_layout import normalized_layout

        return normalized_layout(meta.layout) == normalized_layout(self.layout)  # keys added since, and their defaults

    def load_latest(self, state: dict[str, Any]) -> LoadedCheckpoint | None:
        """Load the newest checkpoint that loads (:meth:`load`; order: :func:`resume_candidates`) into ``state``;
        None when there is none. Every rank calls it together: rank 0 checks ownership and each candidate
        (:meth:`decide`) and broadcasts; the others read nothing but what DCP's load needs. A damaged checkpoint
        (:func:`inspect`, or DCP cannot read it) is skipped, set aside and named in one note; rank 0 then points
        ``latest`` at the one loaded. Refusals (another project or architecture, another format) are raised on
        every rank, the same line; when every checkpoint is damaged, one line names each."""
        decided = self.decide()
        if isinstance(decided, str):
            raise RunDirError(decided)
        skipped: list[Candidate] = []
        for cand in decided:
            if cand.problem is None:
                try:
                    meta = self._load(cand.path, state, cand.meta)
                except _Unloadable as e:
                    cand.problem = f"DCP cannot load it: {e}"
                else:
                    return LoadedCheckpoint(cand.path, meta, self._set_aside(skipped, cand.path))
            skipped.append(cand)
        if not skipped:
            return None
        named = "; ".join(f"{c.path.name}: {c.problem}" for c in skipped)
        raise RunDirError(f"{self.root}: no checkpoint can be loaded ({named}); restore one from its backup "
                          "(clustertrain storage restore URL RUN_DIR/checkpoints/step_N) or use --no-resume to "
                          "archive them and start over")

    def decide(self) -> list[Candidate] | str:
        """What a resume may take, newest first (:class:`Candidate`), or the one line refusing to resume — judged by
        rank 0 alone and broadcast on ``process_group`` (every rank together)."""
        found: list[Any] = [None]
        if self.rank == 0:
            try:
                check_ownership(self.root, self.fingerprint, self.project, self.model_name)
                found[0] = [self._candidate(path) for path in resume_candidates(self.root)]
            except RunDirError as e:
                found[0] = str(e)
            except OSError as e:
                found[0] = f"{self.root}: cannot read the checkpoints ({one_line(e)}); check that file system"
        if distributed():
            import torch.distributed as dist

            group = self.process_group
            dist.broadcast_object_list(found, src=dist.get_global_rank(group, 0) if group is not None else 0,
                                       group=group)
        return found[0]

    def _candidate(self, path: Path) -> Candidate:
        meta, problem = inspect(path)
        aside = None
        if problem != "it does not exist":
            aside = f"{DAMAGED_PREFIX}{path.name}"
            if (self.root / aside).exists():
                aside = f"{aside}-{time.time_ns()}"
        return Candidate(path, meta, problem, aside)

    def _set_aside(self, skipped: list[Candidate], loaded: Path) -> list[str]:
        """Rank 0: rename each skipped checkpoint to ``damaged-step_N`` and point ``latest`` at ``loaded``
        (after the collective load, so every rank has done its reads). The notes, one per skipped one."""
        notes = []
        for cand in skipped:
            note = f"skipped checkpoint {cand.path} ({cand.problem}): resuming from {loaded.name} instead"
            if cand.aside is not None:
                note += f"; set aside as {cand.aside}"
                if self.rank == 0:
                    os.replace(cand.path, self.root / cand.aside)
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

    def _load(self, path: Path, state: dict[str, Any], meta: CheckpointMeta | None = None) -> CheckpointMeta:
        """:meth:`load`, raising :class:`_Unloadable` when DCP cannot read the checkpoint into ``state``; ``meta``:
        its ``meta.json`` as rank 0 read it (None: read it here)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        meta = meta if meta is not None else read_meta(path)
        if meta.fingerprint != self.fingerprint:
            raise RunDirError(f"{path}: holds model {meta.model!r} of project {meta.project!r}, another "
                              f"architecture than {self.project!r}/{self.model_name!r}; use another --run-dir, "
                              "or --no-resume to archive it and start over")
        check_format(path, meta)
        if not self.same_layout(meta):
            state = {k: v for k, v in state.items() if k != "rng"}
        if meta.version < 3 and "model_optim" in state:  # format 2: optimizer hyper-parameters per parameter group
            from clustertrain.train.checkpoint_state import ModelOptimState

            old = state["model_optim"]
            state = {**state, "model_optim": ModelOptimState(old.model, old.optimizer, flatten=False)}
        try:
            dcp.load(state, checkpoint_id=str(path), no_dist=not distributed())
        except (CheckpointException, RuntimeError, ValueError, KeyError, EOFError, OSError) as e:
            raise _Unloadable(one_line(e)) from None
        return meta


class _Unloadable(Exception):
    """DCP could not read a checkpoint into the state (damaged files, or another shape); the message is one line."""
