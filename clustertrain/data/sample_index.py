"""GPT samples over one or more indexed datasets: Megatron's doc_idx / sample_idx / shuffle_idx scheme.

For each dataset, a split ``"98,1,1"`` (train, valid, test ratios) cuts the dataset's sequences
(= documents for data written by :mod:`clustertrain.data.preprocess`) into contiguous ranges with
Megatron's rounding: part k keeps sequences ``[round(b_k * S), round(b_{k+1} * S))``. Over a part:

* **document index** — the part's sequence ids repeated for ``E`` epochs and shuffled with
  ``numpy.random.RandomState(seed)``; ``E`` is the fewest epochs holding ``num_samples``
  samples (one epoch when ``num_samples`` is None). When the last epoch would contribute
  fewer than 80 % of an epoch's samples it is shuffled separately (Megatron's
  ``separate_final_epoch``).
* **sample index** — ``[n + 1, 2]`` (position in the document index, token offset): sample ``k``
  is the ``seq_len + 1`` tokens starting at token ``k * seq_len`` of the concatenated shuffled
  documents, packing across document boundaries; consecutive samples share one token (input =
  ``s[:-1]``, target = ``s[1:]``). ``n = (E * tokens_per_epoch - 1) // seq_len``: the last partial
  sample is dropped, so no sample is ever padded.
* **shuffle index** — a permutation of the ``n`` samples from the same RandomState.

With the same files, seed, split and ``num_samples`` these are exactly the arrays megatron-core's
``GPTDataset`` builds, so ``sample(i)`` equals GPTDataset's ``i``-th sample text (tests check it).

Several datasets are blended with weights using Megatron's greedy rule (sample ``i`` goes to the
dataset whose share lags its weight most); per-dataset sample counts and the blend size follow
``BlendedMegatronDatasetBuilder`` (``ceil(ceil(N * w) * 1.005)`` per dataset, blend size
``sum(ceil(N * w))``).

Intended differences from Megatron:

* Any non-negative index works. Index ``i >= len`` wraps into *cycle* ``c = i // len``; cycle 0
  is the Megatron-identical order, cycle ``c > 0`` rebuilds the same arrays with seed
  ``seed + c * 1_000_003`` (a fresh shuffle, still a pure function of (seed, i)). For a blend, the
  blend pattern repeats and each dataset continues with its next samples.
* Blends without weights are weighted by each dataset's sample count and use the greedy rule
  (Megatron uses its "exhaustive" blend there); ``num_samples=None`` with weights builds
  ``sum of one-epoch sample counts`` blended samples (Megatron requires a size).
* Samples are returned as token ids only (no masks or position ids; the trainer derives them).
* Given the tokenizer's ``vocab_size``, :meth:`GPTSamples.batch` refuses a token id outside
  ``[0, vocab_size)`` in one :class:`~clustertrain.core.errors.DataError` line naming the file (a corrupt file,
  or one prepared with another tokenizer), where a model would index past its embedding or silently train on
  rows no token owns. Tokens are read with :meth:`IndexedDataset.read` (positional reads: a file truncated
  under the running job is one line too, not a SIGBUS).

Index arrays are cached as ``.npy`` in ``<prefix>.samples/`` next to the data (or ``cache_dir``),
named by a hash of everything that shapes them (format version, the ``.idx`` size and mtime,
sequence range, seq_len, seed, num_samples), written to a temporary name and renamed, so ranks
building the same arrays concurrently are safe. An unwritable cache dir just means no cache.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from clustertrain.data.indexed import IndexedDataset, idx_path
from clustertrain.core.errors import DataError
from clustertrain.core.run_paths import write_atomic

INDEX_VERSION = 1
PARTS = ("train", "valid", "test")
SURPLUS = 0.005
CYCLE_SEED_STRIDE = 1_000_003


def parse_split(split: str | Sequence[float]) -> list[tuple[float, float] | None]:
    """``"98,1,1"`` -> book-ends ``[(0, .98), (.98, .99), (.99, 1)]`` (None for an empty part)."""
    if isinstance(split, str):
        nums = [float(x) for x in re.findall(r"[.0-9]+", split)]
    else:
        nums = [float(x) for x in split]
    if not nums or len(nums) > 3 or any(x < 0 for x in nums) or sum(nums) <= 0:
        raise DataError(f"split {split!r}: give up to three non-negative ratios for train,valid,test, e.g. '98,1,1'")
    nums = nums + [0.0] * (3 - len(nums))
    total = sum(nums)
    nums = [x / total for x in nums]
    ends = [0.0]
    for x in nums:
        ends.append(ends[-1] + x)
    return [None if b <= a else (a, b) for a, b in zip(ends[:-1], ends[1:])]


def _document_index(docs: np.ndarray, epochs: int, rs: np.random.RandomState, separate: bool) -> np.ndarray:
    if not separate or epochs == 1:
        out = np.mgrid[0:epochs, 0 : len(docs)][1]
        out[:] = docs
        out = out.reshape(-1).astype(np.int32)
        rs.shuffle(out)
        return out
    return np.concatenate((_document_index(docs, epochs - 1, rs, False), _document_index(docs, 1, rs, False)))


def _shuffle_index(n: int, total: int, rs: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(0, n, dtype=dtype)
    rs.shuffle(first)
    if n == total:
        return first
    last = np.arange(n, total, dtype=dtype)
    rs.shuffle(last)
    return np.concatenate((first, last))


def build_indices(lengths: np.ndarray, beg: int, end: int, seq_len: int, seed: int,
                  num_samples: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document index, sample index, shuffle index) for sequences ``[beg, end)`` (see module docstring)."""
    docs = np.arange(beg, end, dtype=np.int32)
    tpe = int(lengths[beg:end].sum(dtype=np.int64))
    epochs = 1
    if num_samples is not None:
        while epochs * tpe < num_samples * seq_len + 1:
            epochs += 1
    separate = False
    if epochs > 1:
        before_final = ((epochs - 1) * tpe - 1) // seq_len
        per_epoch = (tpe - 1) // seq_len
        separate = num_samples - before_final < int(0.80 * per_epoch)
    rs = np.random.RandomState(seed)
    doc_index = _document_index(docs, epochs, rs, separate)
    n = (epochs * tpe - 1) // seq_len
    dl = lengths[doc_index].astype(np.int64)
    ends = np.cumsum(dl)
    pos = np.arange(n + 1, dtype=np.int64) * seq_len
    where = np.searchsorted(ends, pos, side="right")
    offsets = pos - (ends[where] - dl[where])
    big = max(len(doc_index), int(lengths.max(initial=0))) > np.iinfo(np.int32).max
    sample_index = np.stack([where, offsets], axis=1).astype(np.int64 if big else np.int32)
    if separate:
        shuffle = _shuffle_index(before_final, n, rs)
    else:
        shuffle = _shuffle_index(n, n, rs)
    return doc_index, sample_index, shuffle


def blend_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Megatron's greedy blend: (dataset of each sample, its index within that dataset)."""
    w = [float(x) for x in weights]
    counts = [0] * len(w)
    which = np.empty(size, dtype=np.int16)
    within = np.empty(size, dtype=np.int64)
    rng = range(1, len(w))
    for i in range(size):
        t = float(max(i, 1))
        best, err = 0, w[0] * t - counts[0]
        for d in rng:
            e = w[d] * t - counts[d]
            if e > err:
                best, err = d, e
        which[i] = best
        within[i] = counts[best]
        counts[best] += 1
    return which, within


def _cached(directory: Path | None, key: dict, names: Sequence[str], build) -> tuple[np.ndarray, ...]:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    if directory is not None:
        paths = [directory / f"{digest}-{n}.npy" for n in names]
        if all(p.is_file() for p in paths):
            try:
                return tuple(np.load(p, mmap_mode="r") for p in paths)
            except (OSError, ValueError):
                pass
    arrays = build()
    if directory is not None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for p, a in zip(paths, arrays):
                buf = io.BytesIO()
                np.save(buf, a)
                write_atomic(p, buf.getbuffer())
        except OSError:
            pass
    return arrays


class _Part:
    """One split of one dataset, any index (cycles built lazily)."""

    def __init__(self, ds: IndexedDataset, part: int, bounds: tuple[float, float], seq_len: int, seed: int,
                 num_samples: int | None, cache_dir: Path | None):
        self.ds, self.seq_len, self.seed, self.num_samples, self.cache_dir = ds, seq_len, seed, num_samples, cache_dir
        s = len(ds)
        self.beg, self.end = int(round(bounds[0] * float(s))), int(round(bounds[1] * float(s)))
        tokens = int(ds.sequence_lengths[self.beg : self.end].sum(dtype=np.int64))
        if tokens < seq_len + 1:
            raise DataError(f"{ds.prefix}: the {PARTS[part]} split holds {tokens} tokens, fewer than seq_len+1 = "
                            f"{seq_len + 1}; lower seq_len, add data or change the split")
        st = idx_path(ds.prefix).stat()
        self._key = {"v": INDEX_VERSION, "idx": [st.st_size, st.st_mtime_ns], "range": [self.beg, self.end],
                     "seq_len": seq_len, "num_samples": num_samples}
        self._cycles: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.itemsize = ds.dtype.itemsize
        self.len = len(self._arrays(0)[2])

    def _arrays(self, cycle: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if cycle not in self._cycles:
            if len(self._cycles) > 2:
                self._cycles.pop(next(k for k in self._cycles if k != 0))
            seed = self.seed + cycle * CYCLE_SEED_STRIDE
            self._cycles[cycle] = _cached(
                self.cache_dir, {**self._key, "seed": seed}, ("document_index", "sample_index", "shuffle_index"),
                lambda: build_indices(self.ds.sequence_lengths, self.beg, self.end, self.seq_len, seed, self.num_samples))
        return self._cycles[cycle]

    def sample(self, i: int) -> np.ndarray:
        cycle, pos = divmod(i, self.len)
        doc_index, sample_index, shuffle = self._arrays(cycle)
        j = int(shuffle[pos])
        d0, o0 = int(sample_index[j, 0]), int(sample_index[j, 1])
        d1, o1 = int(sample_index[j + 1, 0]), int(sample_index[j + 1, 1])
        ds, ptr = self.ds, self.ds.sequence_pointers
        if d0 == d1:
            start = int(ptr[doc_index[d0]]) // self.itemsize + o0
            return ds.read(start, o1 - o0 + 1)
        parts = []
        for d in range(d0, d1 + 1):
            seq = int(doc_index[d])
            start = int(ptr[seq]) // self.itemsize
            a = o0 if d == d0 else 0
            b = o1 + 1 if d == d1 else int(ds.sequence_lengths[seq])
            parts.append(ds.read(start + a, b - a))
        return np.concatenate(parts)


class GPTSamples:
    """Seeded GPT samples of ``seq_len + 1`` tokens over one dataset or a weighted blend.

    ``sample(i)`` / ``batch(start, count)`` accept any non-negative global index; sample ``i`` is
    a pure function of the files and (seq_len, seed, split, part, weights, num_samples, i).
    ``vocab_size``: the tokenizer's; :meth:`batch` then refuses token ids outside it (None: not checked).
    """

    def __init__(self, prefixes: str | os.PathLike | Sequence[str | os.PathLike], seq_len: int, seed: int = 1234,
                 split: str | Sequence[float] = "100,0,0", part: str = "train", weights: Sequence[float] | None = None,
                 num_samples: int | None = None, cache_dir: str | os.PathLike | None = None, cache: bool = True,
                 vocab_size: int | None = None):
        paths = [prefixes] if isinstance(prefixes, (str, os.PathLike)) else list(prefixes)
        if not paths:
            raise DataError("GPTSamples: no dataset prefixes given")
        if seq_len < 2:
            raise DataError(f"seq_len={seq_len}: must be at least 2")
        if part not in PARTS:
            raise DataError(f"part {part!r}: valid parts are {', '.join(PARTS)}")
        if weights is not None and (len(weights) != len(paths) or any(w <= 0 for w in weights)):
            raise DataError(f"weights {list(weights)}: give one positive weight per dataset ({len(paths)})")
        if num_samples is not None and num_samples < 1:
            raise DataError(f"num_samples={num_samples}: must be at least 1 (or None for one epoch)")
        k = PARTS.index(part)
        bounds = parse_split(split)[k]
        if bounds is None:
            raise DataError(f"split {split!r} gives the {part} part no data; give it a non-zero ratio")
        self.seq_len, self.seed, self.vocab_size = seq_len, seed, vocab_size
        datasets = [IndexedDataset(p) for p in paths]

        def cdir(ds: IndexedDataset) -> Path | None:
            if not cache:
                return None
            return Path(cache_dir) if cache_dir is not None else Path(f"{ds.prefix}.samples")

        if len(paths) == 1:
            self._parts = [_Part(datasets[0], k, bounds, seq_len, seed, num_samples, cdir(datasets[0]))]
            self._blend = None
            self._len = self._parts[0].len
            return
        if weights is None:
            self._parts = [_Part(ds, k, bounds, seq_len, seed, None, cdir(ds)) for ds in datasets]
            norm = [p.len for p in self._parts]
            size = sum(norm)
        else:
            total = float(sum(weights))
            norm = [w / total for w in weights]
            size = num_samples
            if size is None:
                size = sum(_Part(ds, k, bounds, seq_len, seed, None, cdir(ds)).len for ds in datasets)
            per = [int(math.ceil(math.ceil(size * w) * (1 + SURPLUS))) for w in norm]
            self._parts = [_Part(ds, k, bounds, seq_len, seed, n, cdir(ds)) for ds, n in zip(datasets, per)]
            size = sum(int(math.ceil(size * w)) for w in norm)
        if weights is None:
            norm = [n / size for n in norm]
        key = {"v": INDEX_VERSION, "parts": [p._key for p in self._parts], "seed": seed, "weights": norm, "size": size}
        self._blend = _cached(cdir(datasets[0]), key, ("blend_dataset_index", "blend_sample_index"),
                              lambda: blend_indices(norm, size))
        self._counts = np.bincount(np.asarray(self._blend[0]), minlength=len(self._parts))
        self._len = size

    def __len__(self) -> int:
        """Samples before the order wraps into its next cycle (any index still works)."""
        return self._len

    def sample(self, i: int) -> np.ndarray:
        """Global sample ``i`` (``seq_len + 1`` token ids, in the file's dtype)."""
        part, j = self._locate(i)
        return part.sample(j)

    def _locate(self, i: int) -> tuple[_Part, int]:
        """The part (dataset) holding global sample ``i`` and its index there."""
        if i < 0:
            raise IndexError(f"sample index {i} is negative")
        if self._blend is None:
            return self._parts[0], i
        cycle, pos = divmod(i, self._len)
        d = int(self._blend[0][pos])
        return self._parts[d], cycle * int(self._counts[d]) + int(self._blend[1][pos])

    def batch(self, start: int, count: int) -> np.ndarray:
        """``count`` consecutive global samples from ``start`` as int64 ``[count, seq_len + 1]``."""
        out = np.empty((count, self.seq_len + 1), dtype=np.int64)
        for r in range(count):
            out[r] = self.sample(start + r)
        if self.vocab_size is not None and out.size and (out.max() >= self.vocab_size or out.min() < 0):
            self._refuse(start, out)
        return out

    def _refuse(self, start: int, out: np.ndarray) -> None:
        """One DataError line for the first sample of ``out`` holding a token outside the vocabulary."""
        row = int(np.flatnonzero(((out >= self.vocab_size) | (out < 0)).any(axis=1))[0])
        token = int(next(t for t in out[row] if t >= self.vocab_size or t < 0))
        prefix = self._locate(start + row)[0].ds.prefix
        raise DataError(
            f"{prefix}.bin: sample {start + row} holds token id {token}, outside the tokenizer's vocabulary "
            f"[0, {self.vocab_size}): the file is corrupt or was prepared with another tokenizer; find it with "
            f"`clustertrain data validate {prefix} --full`, prepare it again, then run the same command to resume "
            "from the last checkpoint")
