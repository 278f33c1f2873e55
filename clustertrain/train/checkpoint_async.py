"""Asynchronous checkpoint saves: the one save whose data is still being written, the writer process that writes it,
and the staging buffers reused between saves. :class:`AsyncSaves` starts a save and hands it back once written;
:class:`clustertrain.train.checkpoint.CheckpointManager` commits it.

Asynchronous saves (``save(..., async_save=True)``). The call first waits for the previous async save and commits it,
then stages the state to CPU memory and hands it to ``dcp.async_save(..., async_checkpointer_type=PROCESS)``: the
serialisation and the writes run in a separate **writer process** per rank, so they never share the rank's GIL with
FSDP2's Python hooks or the training loop. Training stalls only for the staging copy.

The writer process (torch 2.13, ``torch/distributed/checkpoint/_async_process_executor.py``). torch keeps one
``_AsyncCheckpointProcess`` per Python process (the module global ``_CHECKPOINT_PROCESS``): a ``spawn``-ed daemon
that joins a gloo world of its own (``dist.init_process_group(GLOO)`` from ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/
``WORLD_SIZE`` set in its environment: one writer per rank, rank 0's writer serves the TCPStore) and then serves save
requests from a pipe (``_checkpointing_subprocess``), each one a whole ``dcp.save`` on that world. When the global is
None, torch's ``execute_save`` first runs ``_ProcessGroupInitInfo(process_group)`` — a collective broadcast, on the
rank's group, of the store address that rank 0 picked — and starts the process in the executor's thread. We start it
ourselves instead (:class:`WriterProcess`, :meth:`AsyncSaves.prepare`), so that:

* the rank needs **no gloo group of its own**: what the writers need from the rank is one broadcast of
  ``(MASTER_ADDR, a free port on rank 0's node)`` from rank 0, on the group given (the trainer's CPU control
  group; the default group when None), once; and ``dcp.async_save``'s check that the group it is given has a CPU
  backend (``state_dict_saver.async_save``: "A CPU backend must be enabled for async save");
* it starts early (:meth:`CheckpointManager.prepare_async`: spawn, import torch, gloo rendezvous — seconds) in a
  background thread, not inside the first save's stall;
* it **dies with its rank**: a thread in it exits the process as soon as its parent is gone (a SIGKILLed rank's
  writer would otherwise finish its write into ``.tmp-step_N``, possibly while the next run writes the same
  directory); torch's process only notices at its next pipe read;
* it is **shut down** at :meth:`AsyncSaves.release` (``CheckpointManager.close``) and at interpreter exit
  (``atexit``, before multiprocessing's own handler that would SIGTERM it): ``TERMINATE`` on the pipe, join, then
  SIGKILL if it does not exit (a writer stuck in a collective of a failed run). No orphan, no hang at exit;
* it **ignores the stop signals** (USR1, USR2, TERM, INT): Slurm delivers them to every process of the step, and
  the rank's stop checkpoint needs its writer;
* a single process (no process group) uses it too: a one-rank gloo world on ``127.0.0.1``, saves with ``no_dist``.

The writers' gloo world connects lazily (``TORCH_GLOO_LAZY_INIT=1`` in the writer only): DCP's collectives there
are gathers to and scatters/broadcasts from the coordinator, so at 640 ranks the writers open O(ranks)
connections, not the all-pairs mesh an eager gloo init makes.

Plan caching. The planner is ``DefaultSavePlanner(enable_plan_caching=True)`` (``default_planner.py``): the local
plan, the coordinator's global plan and the metadata are cached at class level (``SavePlanner._cached_*`` in
``planner.py``) *in the writer process*, which lives for the run; from the second save on a rank whose plan did not
change sends an empty plan and rank 0 reuses the cached global plan and metadata instead of rebuilding a 640-rank
plan in Python.

Staging (``staging.py``, ``_state_dict_stager.py``). One ``DefaultStager`` for the run with
``StagingOptions(use_pinned_memory=cuda, use_shared_memory=True, use_async_staging=overlap,
use_non_blocking_copy=cuda)``. Overlapped staging (``overlap``, :attr:`CheckpointManager.overlap_staging`) copies in
the stager's thread (on CUDA, its own stream) while the next step's forward and backward run: ``save`` returns
before the copy, and the caller must call :meth:`CheckpointManager.staged` before anything changes the saved tensors
in place — the optimizer step (``AsyncSaveResponse.staging_completion``; forward and backward change no parameter or
optimizer state). The step count, the data position and the RNG streams are read when ``save`` is called. ``StateDictStager`` caches one CPU storage per source storage
(``_cached_storage_mapping``) and copies into it at the next save: allocated (and pinned) once, reused after.
Shared memory is what lets the staged tensors cross the pipe without a copy (``torch.multiprocessing`` sends a
shared storage as a file descriptor; a private one would be moved to shared memory at each first send, and its
pinning lost); on CUDA the shared buffers are pinned in place (``cudaHostRegister``). The buffers live in
``/dev/shm``: a rank's shard of the model and optimizer state, so a container's ``/dev/shm`` must hold a node's
ranks' shards.

Commit rule. Rank 0 commits only after its future resolved. That is sufficient: in torch's
``state_dict_saver._save_state_dict`` (run by the writer process) the write phase is
``_DistWrapper.all_reduce("write", write_data, finish_checkpoint)`` — every rank writes its data and the coordinator
gathers all ranks' write results, then runs ``storage_writer.finish`` (which writes ``.metadata``), then broadcasts;
rank 0's future resolves after its writer answered, so every rank's data and ``.metadata`` are on disk when it does
(DCP fsyncs each data file before returning its write result). The writer never writes ``meta.json`` nor renames:
a rank (or writer) killed at any moment leaves at most a ``.tmp-step_N`` that the next start removes.
:meth:`~CheckpointManager.commit_finished` (non-blocking, each step, once every rank has reported its write finished
in the trainer's per-step control all-reduce, so all ranks commit, or fail, at the same step;
:meth:`~CheckpointManager.poll` in a single process), :meth:`~CheckpointManager.wait` (at the end) and the next
``save`` commit it and return its path on rank 0. A failed write comes back through the pipe as DCP's
``CheckpointException`` (every rank's failure, gathered). The data files are ``torch.save`` records without zip
CRC-32s (``torch.load`` never checks them). The storage writer is pickled to the writer process with each request,
so a writer class must be importable (module level).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.checkpoint import StorageWriter

WriterFactory = Callable[[Path], "StorageWriter"]
"""Builds the DCP storage writer for one checkpoint directory (default :func:`file_writer`); the writer is pickled
to the writer process, so its class must be importable (module level)."""

#: seconds the writer process is given to leave after TERMINATE, then after SIGKILL
SHUTDOWN_GRACE_S = 10.0


def file_writer(path: Path) -> StorageWriter:
    """DCP's file writer (one file per rank, every file fsynced), without zip CRC-32s (see :func:`file_writer_class`)."""
    return file_writer_class()(str(path), single_file_per_rank=True, sync_files=True)


def file_writer_class() -> type:
    """``FileSystemWriter`` whose ``torch.save`` records skip the zip CRC-32: ``torch.load`` (DCP's reader) never
    checks it, and computing it is a quarter of a save's time (bench/checkpoint.py). DCP writes inside
    ``write_data`` (its future is already done on return), so the switch is scoped to our writes. Defined at module
    level on first use (torch is imported late): the writer process unpickles it by name."""
    global _Writer
    if _Writer is None:
        from torch.distributed.checkpoint import FileSystemWriter
        from torch.serialization import get_crc32_options, set_crc32_options

        class NoCrcWriter(FileSystemWriter):
            def write_data(self, plan, planner):
                crc = get_crc32_options()
                set_crc32_options(False)
                try:
                    return super().write_data(plan, planner)
                finally:
                    set_crc32_options(crc)

        NoCrcWriter.__qualname__ = NoCrcWriter.__name__ = "NoCrcWriter"
        NoCrcWriter.__module__ = __name__
        globals()["NoCrcWriter"] = _Writer = NoCrcWriter
    return _Writer


_Writer: type | None = None


def __getattr__(name: str) -> Any:  # the writer process unpickles ``checkpoint_async.NoCrcWriter`` before any use
    if name == "NoCrcWriter":
        return file_writer_class()
    raise AttributeError(name)


@dataclass
class InFlight:
    """An async save whose data is still being written."""

    future: Future
    step: int
    consumed_samples: int
    final: Path
    tmp: Path
    staged: Future | None = None  # overlapped staging: done once the state has been copied


def save_planner(lowest_rank: bool, caching: bool = False):
    """DCP's save planner (``default_planner.py``). ``lowest_rank``: every replicated entry is written by the lowest
    rank that holds it (``dedup_save_to_lowest_rank``) instead of being spread over the ranks. With FSDP the
    replicated entries are small (AdamW's ``step`` and the hyper-parameters, 12 per parameter tensor), and spread they
    put a piece into every rank's file, so a resume opens every rank's file from every rank (ranks² opens at a
    restart: bench/restart_stats.py); written by rank 0 they are read from its file alone. Not for replicated layouts
    (DDP, or dp replicas of a pipeline stage or a tensor-parallel shard): there the replicated entries are the model,
    and the lowest rank would write all of it."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    return DefaultSavePlanner(enable_plan_caching=caching, dedup_save_to_lowest_rank=lowest_rank)


@dataclass
class AsyncSaves:
    """At most one async save in flight (:meth:`start`, :meth:`finished_step`, :meth:`take`), the writer process
    (:meth:`prepare`) and the stager (:meth:`release` frees the staging memory and stops the writer process).

    ``process_group``: a group with a CPU backend over every rank that saves (the trainer's control group); None: the
    default group. Used once, for the broadcast of the writers' store address, and for ``dcp.async_save``'s check."""

    process_group: Any = None
    overlap: bool = False
    lowest_rank: bool = False  # replicated entries written by the lowest rank holding them (:func:`save_planner`)
    _inflight: InFlight | None = field(default=None, init=False, repr=False)
    _stagers: dict[bool, Any] = field(default_factory=dict, init=False, repr=False)  # by ``overlap``
    _writer: WriterProcess | None = field(default=None, init=False, repr=False)

    def prepare(self) -> None:
        """Start the writer process in the background (every rank together: one broadcast on ``process_group``)."""
        if self._writer is None:
            self._writer = WriterProcess.start(self.process_group)

    def start(self, state: dict[str, Any], writer: "StorageWriter", step: int, consumed_samples: int,
              final: Path, tmp: Path) -> None:
        """Stage ``state`` to CPU and start writing it into ``tmp`` in the writer process (the last save was taken)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse

        assert self._inflight is None, "take() the save in flight before starting another"
        self.prepare()
        self._writer.install()  # waits for the writer's start-up if it is still under way (the first save)
        response = dcp.async_save(state, storage_writer=writer, process_group=self.process_group,
                                  async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                                  planner=save_planner(self.lowest_rank, caching=True),
                                  async_stager=self._staging(), no_dist=not distributed())
        if isinstance(response, AsyncSaveResponse):
            self._inflight = InFlight(response.upload_completion, step, consumed_samples, final, tmp,
                                      response.staging_completion)
        else:
            self._inflight = InFlight(response, step, consumed_samples, final, tmp)

    def staged(self) -> None:
        """Wait until the in-flight save's state has been copied (overlapped staging); at once otherwise."""
        if self._inflight is not None and self._inflight.staged is not None:
            self._inflight.staged.result()

    @property
    def step(self) -> int | None:
        """The step of the save in flight, or None."""
        return self._inflight.step if self._inflight is not None else None

    def finished_step(self) -> int:
        """The step of the in-flight save when this rank's write has finished (written or failed), else -1."""
        return self._inflight.step if self._inflight is not None and self._inflight.future.done() else -1

    def take(self) -> InFlight | None:
        """The save in flight (its future may still run), which is no longer this object's."""
        inflight, self._inflight = self._inflight, None
        return inflight

    @property
    def writer_pid(self) -> int | None:
        """The writer process's pid once it runs (tests: it must be gone after :meth:`release`)."""
        return self._writer.pid if self._writer is not None else None

    def release(self) -> None:
        """Free the staging memory and stop the writer process (the next save starts both again)."""
        for stager in self._stagers.values():
            stager.close()
        self._stagers.clear()
        if self._writer is not None:
            self._writer.stop()
            self._writer = None

    def _staging(self) -> Any:
        """One stager for the run: its CPU copies (shared, and pinned on a GPU) are allocated once and reused — where
        the stager allows it. torch 2.11's DefaultStager is spent after one stage (its copy table is cleared; the next
        stage fails with ``KeyError: <class 'type'>``, seen on an H200 with torch 2.11.0+cu130, the PyTorch of the NGC
        26.02 image): then a new one is made for each save. torch 2.13 leaves a stager it was given to its owner."""
        stager = self._stagers.get(self.overlap)
        if stager is None or getattr(stager._state_dict_stager, "_deepcopy_dispatch", None) == {}:
            import torch
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            gpu = torch.cuda.is_available()
            stager = self._stagers[self.overlap] = DefaultStager(StagingOptions(
                use_pinned_memory=gpu, use_shared_memory=True, use_async_staging=self.overlap,
                use_non_blocking_copy=gpu))
        return stager


class WriterProcess:
    """This rank's writer process: torch's ``_AsyncCheckpointProcess`` started by us (see the module docstring),
    installed as torch's ``_CHECKPOINT_PROCESS`` for ``dcp.async_save``. One per Python process."""

    _current: WriterProcess | None = None

    def __init__(self, info: Any) -> None:
        self._ready: Future = Future()
        self._process: Any = None
        self._stopped = False
        threading.Thread(target=self._spawn, args=(info,), name="checkpoint-writer-start", daemon=True).start()

    @classmethod
    def start(cls, group: Any = None) -> WriterProcess:
        """Every rank together: rank 0 picks the writers' store address, broadcasts it on ``group``, and each rank
        starts its writer in a background thread. A writer left by an earlier manager in this process is stopped."""
        if cls._current is not None:
            cls._current.stop()
        cls._current = writer = cls(_init_info(group))
        return writer

    def _spawn(self, info: Any) -> None:
        # The stop signals blocked in this thread only: the writer inherits the mask through fork and exec, so a
        # signal that reaches it before writer_main ignores them stays pending (then ignored) instead of killing it
        # while it starts (spawn, import torch: seconds on a loaded node)
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            from torch.distributed.checkpoint._async_process_executor import _AsyncCheckpointProcess

            class _Process(_AsyncCheckpointProcess):
                _checkpointing_subprocess = staticmethod(writer_main)

                @property
                def ctx(self):
                    return self._ctx

                @ctx.setter
                def ctx(self, value):  # torch's __init__ sets the spawn context: name the process it makes
                    self._ctx = _NamedContext(value)

            self._process = _Process(info)  # spawns and waits for the writers' gloo world (torch: up to 1800 s)
            self._ready.set_result(self._process)
        except BaseException as e:  # noqa: BLE001 — handed to the first save, which raises it
            self._ready.set_exception(e)

    @property
    def pid(self) -> int | None:
        proc = self._process
        return proc._save_process.pid if proc is not None else None

    def install(self) -> None:
        """Wait until the writer runs, then make it the process torch's PROCESS executor sends saves to."""
        from torch.distributed.checkpoint import _async_process_executor as executor

        process = self._ready.result()
        if not process._save_process.is_alive():
            raise RuntimeError(f"the checkpoint writer process exited (code {process._save_process.exitcode})")
        executor._CHECKPOINT_PROCESS = process

    def stop(self) -> None:
        """TERMINATE, join; then SIGKILL if it stays (a writer stuck in a collective of a failed run; it ignores
        SIGTERM, which is the rank's stop signal: :func:`writer_main`)."""
        if self._stopped:
            return
        self._stopped = True
        if WriterProcess._current is self:
            WriterProcess._current = None
        try:
            process = self._ready.result(timeout=SHUTDOWN_GRACE_S)
        except BaseException:  # noqa: BLE001 — never started, or still starting
            process = self._process
        if process is None:
            _kill_starting_writers()
            return
        from torch.distributed.checkpoint import _async_process_executor as executor

        child = process._save_process
        try:
            if child.is_alive():
                try:
                    process._send(_terminate())
                except OSError:
                    pass
                child.join(SHUTDOWN_GRACE_S)
            if child.is_alive():
                child.kill()
                child.join(SHUTDOWN_GRACE_S)
        finally:
            if executor._CHECKPOINT_PROCESS is process:
                executor._CHECKPOINT_PROCESS = None


#: the name of every writer process (:class:`_NamedContext`), how a writer still starting is found
WRITER_NAME = "clustertrain-checkpoint-writer"


class _NamedContext:
    """A multiprocessing context whose ``Process`` is named :data:`WRITER_NAME` (everything else is the context's):
    a writer is found by name while torch's ``__init__`` still waits for it (``Process`` drops its target at start)."""

    def __init__(self, ctx: Any):
        self._ctx = ctx

    def Process(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 — multiprocessing's name
        return self._ctx.Process(*args, name=WRITER_NAME, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def _kill_starting_writers() -> None:
    """Kill a writer that is still starting (torch's ``_AsyncCheckpointProcess.__init__`` has not returned: it waits
    in the writers' start-up barrier for peers that may be gone). It ignores SIGTERM, so multiprocessing's exit
    handler, which TERMs then joins without a limit, would wait for it forever (seen at 16 ranks under load)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        if child.name == WRITER_NAME:
            child.kill()
            child.join(SHUTDOWN_GRACE_S)


def _terminate() -> Any:
    from torch.distributed.checkpoint._async_process_executor import _CheckpointSaveProcessControlOpts

    return _CheckpointSaveProcessControlOpts.TERMINATE


def _init_info(group: Any) -> Any:
    """torch's ``_ProcessGroupInitInfo`` for this rank's writer, filled as its ``__init__`` does but with the address
    broadcast by us on ``group`` (one collective) — or a one-rank world on 127.0.0.1 without a process group."""
    from torch.distributed.checkpoint._async_process_executor import _ProcessGroupInitInfo

    info = _ProcessGroupInitInfo.__new__(_ProcessGroupInitInfo)
    info.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    info.use_prefix_store = False
    info.disable_automatic_gc = os.environ.get("DCP_DISABLE_AUTOMATIC_GC", "0") == "1"
    info.disable_manual_gc = os.environ.get("DCP_DISABLE_MANUAL_GC", "0") == "1"
    if not distributed():
        info.global_rank, info.world_size = 0, 1
        info.tcp_store_master_addr, info.tcp_store_master_port = "127.0.0.1", _free_port()
        return info
    import torch.distributed as dist

    info.global_rank, info.world_size = dist.get_rank(group), dist.get_world_size(group)
    address = [os.environ.get("MASTER_ADDR") or socket.getfqdn(), _free_port()] if info.global_rank == 0 else [None, None]
    dist.broadcast_object_list(address, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    info.tcp_store_master_addr, info.tcp_store_master_port = address
    return info


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


#: the rank's stop signals, which the writer ignores (:func:`writer_main`)
STOP_SIGNALS = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT}


def writer_main(info: Any, parent_conn: Any) -> None:
    """The writer process's entry point: leave as soon as the rank that started it is gone, connect the writers'
    gloo world lazily, then torch's serving loop (``_AsyncCheckpointProcess._checkpointing_subprocess``)."""
    from torch.distributed.checkpoint import _async_process_executor as executor
    from torch.distributed.checkpoint._async_process_executor import _AsyncCheckpointProcess

    # The stop signals are the rank's: Slurm delivers the batch script's USR2 (and scancel's TERM, and a terminal's
    # INT) to every process of the step, this one too, and by default they would end it — the rank's stop checkpoint
    # then has no writer (a real failure on the local Slurm: "the checkpoint writer process exited (code -12)").
    # The writer leaves when the rank tells it (TERMINATE), when the rank is gone (below) or on SIGKILL.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked since the spawn (WriterProcess._spawn)
    logging.getLogger("torch.distributed.device_mesh").setLevel(logging.ERROR)  # a warning per DTensor unpickled
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(70)  # the rank died (SIGKILL): stop writing now, mid-file if need be — never committed

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")
    executor._init_logger = _quiet_logger  # torch's INFO lines and its traceback-laden ERROR stay out of the job log
    _AsyncCheckpointProcess._checkpointing_subprocess(info, parent_conn)


def _quiet_logger(rank: int) -> None:
    """torch's ``logger._init_logger``, quiet: torch logs three INFO lines per save, and a failed save as an ERROR
    whose text holds every rank's traceback; the failure also comes back through the pipe, and the rank says it in one
    line (:mod:`clustertrain.train.checkpoint_failures`). Only CRITICAL lines reach the rank's stderr."""
    import logging

    handler = logging.StreamHandler()
    handler.setLevel(logging.CRITICAL)
    handler.setFormatter(logging.Formatter(f"[checkpoint writer {rank}] %(levelname)s %(message)s"))
    logging.getLogger().addHandler(handler)


@atexit.register
def _stop_at_exit() -> None:
    """A run that ends without ``close`` (an exception) stops its writer before multiprocessing's exit handler."""
    if WriterProcess._current is not None:
        WriterProcess._current.stop()


def distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if distributed():
        import torch.distributed as dist

        dist.barrier()
