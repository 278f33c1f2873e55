"""The data path of one rank: which micro-batches it reads at a step, read one micro-batch ahead.

Micro-batch ``m`` of step ``s`` (steps counted from 0) on data-parallel rank ``d`` is the ``micro_batch`` samples
starting at ``s * global_batch + (d * accum + m) * micro_batch`` of :class:`clustertrain.data.GPTSamples` — a pure
function of the step, so a resumed run reads exactly what the interrupted one would have.

**Prefetch.** On a GPU the next micro-batch (the first of the next step after the last of this one) is read from
the memory-mapped dataset, copied into pinned memory and sent to the device on a copy stream of its own
(``non_blocking``) as soon as the current one is handed out, i.e. while the device still computes on the batches
before it; the compute stream waits for the copy with ``wait_stream`` and the tensor is marked used there with
``record_stream`` so the caching allocator does not reuse it early (the pattern of torch's
``torch/utils/data/_utils/pin_memory.py`` plus ``torch.cuda.Stream``'s documented ``wait_stream``/``record_stream``
rules in ``torch/cuda/streams.py`` and ``torch/_tensor_docs.py`` ``record_stream``). Nothing here reads the device
back: the feed adds no host sync. On CPU there is no asynchrony to hide a read behind, so reads happen at their turn
unless ``prefetch=True`` is asked for (tests do, to check that a read-ahead feed yields the same batches).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Callable

import torch

Batch = tuple[torch.Tensor, torch.Tensor]


class BatchFeed:
    """Micro-batches of one data-parallel rank, step by step (see the module doc)."""

    def __init__(self, samples, *, global_batch: int, micro_batch: int, dp_rank: int, accum: int,
                 device: torch.device, prefetch: bool | None = None, slow_data_s: float = 0.0):
        self.samples, self.global_batch, self.micro_batch = samples, global_batch, micro_batch
        self.dp_rank, self.accum, self.device, self.slow_data_s = dp_rank, accum, device, slow_data_s
        self.prefetch = device.type == "cuda" if prefetch is None else prefetch
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._ahead: tuple[tuple[int, int], Batch] | None = None  # ((step, micro), batch) read ahead
        self.reads: list[tuple[int, int]] = []  # (step, micro) in the order they were read (tests, bench)

    def start(self, step: int, micro: int) -> int:
        """The first sample of micro-batch ``micro`` of step ``step`` (0-based) on this rank."""
        return step * self.global_batch + (self.dp_rank * self.accum + micro) * self.micro_batch

    def _read(self, step: int, micro: int) -> Batch:
        self.reads.append((step, micro))
        if self.slow_data_s:
            time.sleep(self.slow_data_s)
        data = torch.from_numpy(self.samples.batch(self.start(step, micro), self.micro_batch))
        if self._stream is not None:
            data = data.pin_memory()
            self._stream.wait_stream(torch.cuda.current_stream(self.device))  # the copy follows what came before
            with torch.cuda.stream(self._stream):
                data = data.to(self.device, non_blocking=True)
        return data[:, :-1], data[:, 1:]

    def get(self, step: int, micro: int) -> Batch:
        """Micro-batch ``micro`` of ``step``, ready for the current stream; with prefetch on, the next one is
        started before this returns."""
        if self._ahead is not None and self._ahead[0] == (step, micro):
            batch = self._ahead[1]
        else:
            batch = self._read(step, micro)
        self._ahead = None
        if self._stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self._stream)
            for t in batch:
                t.record_stream(current)
        if self.prefetch:
            nxt = (step, micro + 1) if micro + 1 < self.accum else (step + 1, 0)
            self._ahead = (nxt, self._read(*nxt))
        return batch

    def step_batches(self, step: int, part: Callable[[str], AbstractContextManager] = lambda name: nullcontext(),
                     lazy: bool = True) -> Sequence[Batch]:
        """The ``accum`` micro-batches of ``step``: lazily (each read at its turn, timed as ``part("data")``) or,
        ``lazy=False`` (a pipeline schedule takes them all at once), read now."""
        if not lazy:
            with part("data"):
                return [self.get(step, m) for m in range(self.accum)]
        return _Lazy(lambda m: _timed(part, lambda: self.get(step, m)), self.accum)


def _timed(part, read):
    with part("data"):
        return read()


class _Lazy(Sequence):
    """``count`` items, item ``i`` made by ``make(i)`` when it is asked for (a micro-batch read at its turn)."""

    def __init__(self, make, count: int):
        self.make, self.count = make, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):
        if not 0 <= i < self.count:
            raise IndexError(i)
        return self.make(i)


def open_samples(paths, entry) -> tuple:
    """The run's prepared data as :class:`clustertrain.data.GPTSamples` — its one dataset, or every source of its
    ``data.blend`` mixed by weight (``run.json``'s sources, :func:`clustertrain.data.staging.training_samples`, as
    run preparation built them) — and the tokenizer's vocabulary size (from each dataset's manifest:
    :func:`dataset_vocab`); one-line errors for a run directory or dataset that is missing, sources whose
    vocabularies differ, or a ``model.vocab`` the tokenizer disagrees with."""
    from pathlib import Path

    from clustertrain.core.errors import ConfigError, DataError, RunDirError
    from clustertrain.core.run_records import read_run_info
    from clustertrain.data.staging import training_samples
    from clustertrain.data.vocab import check_vocab

    run = read_run_info(paths)
    if run is None:
        raise RunDirError(f"{paths.run_json}: missing; start runs with `clustertrain run`/`submit`, which write it")
    sources = run.sources()
    vocabs: dict[str, int] = {}
    for _, prefix in sources:
        if not Path(prefix + ".idx").is_file():
            raise DataError(f"{prefix}: prepared dataset is missing; re-run `clustertrain run` to prepare it")
        vocabs[prefix] = dataset_vocab(prefix, entry)
        problem = check_vocab(entry, vocabs[prefix])
        if problem:
            raise ConfigError(problem)
    if len(set(vocabs.values())) > 1:
        shown = ", ".join(f"{p} ({v})" for p, v in vocabs.items())
        raise DataError(f"the sources of data.blend were prepared with vocabularies of different sizes: {shown}; "
                        "prepare every source with data.tokenizer, then re-run `clustertrain run`")
    vocab = next(iter(vocabs.values()))
    samples = training_samples(sources, entry.data, entry.model.seq_len, entry.training.seed, vocab_size=vocab)
    return samples, vocab


def dataset_vocab(dataset: str, entry) -> int:
    """The tokenizer's vocabulary size as recorded in the prepared dataset's manifest (staging checked that
    the manifest names ``data.tokenizer``; for a blend, each source's), so ranks need not read the tokenizer file;
    loading the tokenizer only for datasets without a manifest (e.g. made by Megatron's preprocess_data.py)."""
    from clustertrain.data import load_tokenizer, read_manifest

    manifest = read_manifest(dataset)
    if manifest is not None and isinstance(manifest.get("vocab_size"), int):
        return manifest["vocab_size"]
    return load_tokenizer(entry.data.tokenizer).vocab_size
