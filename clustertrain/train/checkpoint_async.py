"""Asynchronous checkpoint saves: the one save whose data is still being written, the gloo process group its
background collectives run on, and the staging buffers reused between saves. :class:`AsyncSaves` starts a save and
hands it back once written; :class:`clustertrain.train.checkpoint.CheckpointManager` commits it.

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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import Future

    from torch.distributed.checkpoint import StorageWriter

WriterFactory = Callable[[Path], "StorageWriter"]
"""Builds the DCP storage writer for one checkpoint directory (default :func:`file_writer`)."""


def file_writer(path: Path) -> StorageWriter:
    """DCP's file writer (one file per rank, every file fsynced), without zip CRC-32s (see :func:`file_writer_class`)."""
    return file_writer_class()(str(path), single_file_per_rank=True, sync_files=True)


def file_writer_class() -> type:
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
class InFlight:
    """An async save whose data is still being written."""

    future: Future
    step: int
    consumed_samples: int
    final: Path
    tmp: Path


@dataclass
class AsyncSaves:
    """At most one async save in flight (:meth:`start`, :meth:`finished_step`, :meth:`take`), its process group and
    its stager (:meth:`release` frees the staging memory).

    ``process_group``: where async saves run their collectives, from a background thread. Nothing else may use that
    group meanwhile (two threads issuing collectives on one group can pair them differently on different ranks);
    None makes a dedicated gloo group at the first async save."""

    process_group: Any = None
    _inflight: InFlight | None = field(default=None, init=False, repr=False)
    _stager: Any = field(default=None, init=False, repr=False)
    _async_group: Any = field(default=None, init=False, repr=False)

    def start(self, state: dict[str, Any], writer: "StorageWriter", step: int, consumed_samples: int,
              final: Path, tmp: Path) -> None:
        """Stage ``state`` to CPU and start writing it into ``tmp`` in the background (the last save was taken)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

        assert self._inflight is None, "take() the save in flight before starting another"
        response = dcp.async_save(state, storage_writer=writer, process_group=self._group(),
                                  async_stager=self._staging(), no_dist=not distributed())
        future = response.upload_completion if isinstance(response, AsyncSaveResponse) else response
        self._inflight = InFlight(future, step, consumed_samples, final, tmp)

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

    def release(self) -> None:
        """Free the staging memory (the next save allocates it again)."""
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def _group(self) -> Any:
        """The process group of async saves' background collectives: the one given, else a gloo group of
        all ranks made at the first async save (every rank saves together, so every rank makes it)."""
        if self.process_group is not None or not distributed():
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


def distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if distributed():
        import torch.distributed as dist

        dist.barrier()
