"""Megatron's indexed dataset (``MMIDIDX`` version 1): a ``.bin`` of tokens plus an ``.idx`` index.

A dataset is a path prefix ``P``: ``P.bin`` and ``P.idx``. Files written here are byte-identical
to megatron-core's ``IndexedDatasetBuilder`` output for the same input, and Megatron reads them.

``P.bin`` — the token arrays of all sequences concatenated, no header, no padding, in the dtype
named by the index (little-endian).

``P.idx`` — little-endian, packed::

    offset      size  field
    0           9     magic b"MMIDIDX\\x00\\x00"
    9           8     u64 version = 1
    17          1     u8 dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
                      7 float32, 8 uint16
    18          8     u64 S = number of sequences
    26          8     u64 D = number of document indices (documents + 1)
    34          4*S   int32 sequence lengths, in tokens
    34+4S       8*S   int64 sequence pointers: byte offset of each sequence in P.bin (first 0,
                      pointer[i+1] = pointer[i] + length[i] * itemsize)
    34+12S      8*D   int64 document indices: sequence index where each document starts; the
                      first is 0, the last is S (a document may hold several sequences, or none)
    (34+12S+8D  S     int8 sequence modes — multimodal datasets only, not flagged in the file;
                      not written by this module)

The token dtype follows Megatron's preprocessing: uint16 when the vocabulary has fewer than
65,500 entries, otherwise int32 (:func:`token_dtype`).

Reading. :class:`IndexedDataset` maps both files; training reads tokens with :meth:`IndexedDataset.read`,
a positional read (``os.pread``) of the ``.bin`` rather than its memory map: touching a mapping past the end
of a file truncated under a running job kills the process with SIGBUS (no message, no traceback), while a short
read is one :class:`~clustertrain.core.errors.DataError` line naming the file and its sizes. Opening a ``.bin``
shorter than its index says is refused the same way. ``python bench/data_read.py`` measures the cost against
the memory map (docs/training.md, "Storage failures").

:class:`IndexedWriter` streams: tokens go straight to ``P.bin`` and the per-sequence lengths
and the document indices are spilled to temporary files in chunks, so memory stays bounded
however large the input. Both files are written under temporary names and renamed into place
by :meth:`IndexedWriter.finalize` (``.idx`` last), so a crash never leaves a half-written
dataset that looks complete.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from clustertrain.core.errors import DataError
from clustertrain.core.run_paths import fsync_dir

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = 34
DTYPE_CODES: dict[int, type[np.number]] = {
    1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16,
}
CODE_OF_DTYPE = {np.dtype(v): k for k, v in DTYPE_CODES.items()}
_CHUNK = 1 << 20  # entries per spill/copy chunk (bounded memory)


def token_dtype(vocab_size: int | None) -> type[np.number]:
    """Megatron's choice: uint16 when ``vocab_size < 65500``, else int32."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def idx_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}.idx")


def bin_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}.bin")


def read_header(path: Path) -> tuple[int, int, int, int]:
    """(version, dtype code, S, D) of an ``.idx`` file; DataError when it is not one."""
    with open(path, "rb") as f:
        head = f.read(HEADER_SIZE)
    if len(head) < HEADER_SIZE:
        raise DataError(f"{path}: {len(head)} bytes, shorter than the {HEADER_SIZE}-byte MMIDIDX header; re-create the dataset")
    if head[:9] != MAGIC:
        raise DataError(f"{path}: bad magic {head[:9]!r} at byte 0 (want {MAGIC!r}); not a Megatron .idx file")
    version, code, s, d = struct.unpack("<QBQQ", head[9:HEADER_SIZE])
    return version, code, s, d


class IndexedDataset:
    """Read-only, memory-mapped view of ``P.idx`` + ``P.bin``.

    ``len(ds)`` is the number of sequences; ``ds[i]`` / :meth:`get` return sequence ``i``
    (a view into the mapped ``.bin``); :meth:`document` returns the tokens of one document.
    """

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = os.fspath(prefix)
        path = idx_path(prefix)
        if not path.is_file():
            raise DataError(f"{path}: no such index file; run `clustertrain data prepare` to create {self.prefix}.idx/.bin")
        version, code, s, d = read_header(path)
        if version != VERSION:
            raise DataError(f"{path}: version {version} at byte 9, only version {VERSION} is supported")
        if code not in DTYPE_CODES:
            raise DataError(f"{path}: unknown dtype code {code} at byte 17; valid codes 1-8")
        self.dtype = np.dtype(DTYPE_CODES[code])
        want = HEADER_SIZE + 12 * s + 8 * d
        size = path.stat().st_size
        if size not in (want, want + s):
            raise DataError(f"{path}: {size} bytes but the header (S={s}, D={d}) needs {want}; the index is truncated or corrupt")
        mm = np.memmap(path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
        buf = memoryview(mm)
        self._idx_mmap = mm
        self.sequence_lengths = np.frombuffer(buf, dtype="<i4", count=s, offset=HEADER_SIZE)
        self.sequence_pointers = np.frombuffer(buf, dtype="<i8", count=s, offset=HEADER_SIZE + 4 * s)
        self.document_indices = np.frombuffer(buf, dtype="<i8", count=d, offset=HEADER_SIZE + 12 * s)
        bpath = bin_path(prefix)
        if not bpath.is_file():
            raise DataError(f"{bpath}: missing data file next to {path}; re-create the dataset")
        self.bin_size = bpath.stat().st_size
        need = int(self.sequence_pointers[-1]) + int(self.sequence_lengths[-1]) * self.dtype.itemsize if s else 0
        if self.bin_size < need:
            raise DataError(f"{bpath}: {self.bin_size} bytes but {path} points at {need}; the data file is truncated, "
                            "re-create the dataset")
        self._bin = open(bpath, "rb", buffering=0)  # for read(): closed with the dataset
        self.tokens = (np.memmap(bpath, dtype=self.dtype.newbyteorder("<"), mode="r")
                       if self.bin_size >= self.dtype.itemsize else np.zeros(0, self.dtype))

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def n_documents(self) -> int:
        return max(len(self.document_indices) - 1, 0)

    @property
    def n_tokens(self) -> int:
        return int(self.sequence_lengths.sum(dtype=np.int64))

    def read(self, start: int, count: int) -> np.ndarray:
        """``count`` tokens from token ``start`` of ``.bin``, by a positional read (see the module docstring): a
        file that shrank since it was opened is one DataError line, never a SIGBUS."""
        size = self.dtype.itemsize
        data = os.pread(self._bin.fileno(), count * size, start * size)
        if len(data) < count * size:
            now = os.fstat(self._bin.fileno()).st_size
            raise DataError(
                f"{bin_path(self.prefix)}: {now} bytes now, {self.bin_size} when training opened it (tokens at bytes "
                f"{start * size}-{(start + count) * size} are gone): the file was truncated or overwritten under the "
                "running job; restore it (`clustertrain run` re-tokenizes a dataset it prepared; else prepare or copy "
                "it again) and run the same command to resume from the last checkpoint")
        return np.frombuffer(data, dtype=self.dtype.newbyteorder("<"))

    def token_offset(self, i: int) -> int:
        """Offset of sequence ``i`` in tokens (not bytes) inside ``.bin``."""
        return int(self.sequence_pointers[i]) // self.dtype.itemsize

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        start = self.token_offset(i) + offset
        n = int(self.sequence_lengths[i]) - offset if length is None else length
        return self.tokens[start : start + n]

    def __getitem__(self, i: int) -> np.ndarray:
        return self.get(i)

    def document(self, j: int) -> np.ndarray:
        """All tokens of document ``j`` (its sequences concatenated)."""
        a, b = int(self.document_indices[j]), int(self.document_indices[j + 1])
        if a == b:
            return np.zeros(0, self.dtype)
        start = self.token_offset(a)
        end = self.token_offset(b - 1) + int(self.sequence_lengths[b - 1])
        return self.tokens[start:end]


class _Spill:
    """An append-only typed array kept on disk in chunks (bounded memory)."""

    def __init__(self, path: Path, dtype: str):
        self.path, self.dtype = path, np.dtype(dtype)
        self.f = open(path, "wb")
        self.buf: list[int] = []
        self.count = 0

    def append(self, value: int) -> None:
        self.buf.append(value)
        if len(self.buf) >= _CHUNK:
            self.flush()

    def extend(self, values: np.ndarray) -> None:
        self.flush()
        arr = np.asarray(values, dtype=self.dtype)
        self.f.write(arr.tobytes())
        self.count += len(arr)

    def flush(self) -> None:
        if self.buf:
            self.f.write(np.asarray(self.buf, dtype=self.dtype).tobytes())
            self.count += len(self.buf)
            self.buf = []

    def chunks(self) -> Iterable[np.ndarray]:
        self.flush()
        self.f.close()
        with open(self.path, "rb") as f:
            while data := f.read(_CHUNK * self.dtype.itemsize):
                yield np.frombuffer(data, dtype=self.dtype)

    def close(self) -> None:
        if not self.f.closed:
            self.f.close()
        self.path.unlink(missing_ok=True)


class IndexedWriter:
    """Stream sequences and documents into ``P.bin`` / ``P.idx`` (Megatron-identical bytes).

    ``add_item(tokens)`` appends one sequence, ``end_document()`` closes the current document,
    ``add_document(tokens)`` does both; ``add_dataset(prefix)`` appends a whole existing dataset.
    ``finalize()`` writes the index and renames both files into place; ``abort()`` removes the
    temporary files. Usable as a context manager (finalize on success, abort on error).
    """

    def __init__(self, prefix: str | os.PathLike, dtype: type[np.number] | np.dtype = np.uint16):
        self.prefix = os.fspath(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_OF_DTYPE:
            raise DataError(f"dtype {self.dtype} cannot be stored in a Megatron index; valid: {', '.join(str(np.dtype(v)) for v in DTYPE_CODES.values())}")
        tag = f".tmp-{os.getpid()}"
        self._bin_tmp = Path(f"{self.prefix}.bin{tag}")
        self._idx_tmp = Path(f"{self.prefix}.idx{tag}")
        self._bin_tmp.parent.mkdir(parents=True, exist_ok=True)
        self._bin = open(self._bin_tmp, "wb", buffering=1 << 22)
        self._lengths = _Spill(Path(f"{self.prefix}.lengths{tag}"), "<i4")
        self._docs = _Spill(Path(f"{self.prefix}.docs{tag}"), "<i8")
        self._docs.append(0)
        self.n_sequences = 0
        self.n_tokens = 0

    def add_item(self, tokens: np.ndarray | Sequence[int]) -> None:
        arr = np.ascontiguousarray(tokens, dtype=self.dtype)
        self._bin.write(memoryview(arr))
        self._lengths.append(arr.size)
        self.n_sequences += 1
        self.n_tokens += arr.size

    def add_items(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append many sequences at once: ``tokens`` concatenated, ``lengths`` per sequence (written as they are, no
        copy, when already contiguous in the dataset's dtype)."""
        arr = np.ascontiguousarray(tokens, dtype=self.dtype)
        self._bin.write(memoryview(arr))
        self._lengths.extend(lengths)
        self.n_sequences += len(lengths)
        self.n_tokens += arr.size

    def add_items_from(self, fd: int, nbytes: int, lengths: np.ndarray) -> None:
        """Append many sequences whose tokens, already in this dataset's dtype, are the first ``nbytes`` of the open
        file ``fd``: copied by the kernel (``os.copy_file_range``, no trip through this process's memory) where the
        file system allows, else read and written."""
        if nbytes % self.dtype.itemsize:
            raise ValueError(f"{nbytes} bytes is not a whole number of {self.dtype} tokens")
        self._bin.flush()
        out, done = self._bin.fileno(), 0
        copy = getattr(os, "copy_file_range", None)
        while copy is not None and done < nbytes:
            try:
                n = copy(fd, out, nbytes - done, done)
            except OSError:  # EXDEV, ENOSYS, EINVAL on some file systems: copy by hand below
                break
            if n <= 0:
                break
            done += n
        while done < nbytes:
            data = os.pread(fd, min(nbytes - done, 1 << 22), done)
            if not data:
                raise DataError(f"fd {fd}: {done} bytes, {nbytes} expected; the part file was truncated")
            self._bin.write(data)
            done += len(data)
        self._lengths.extend(lengths)
        self.n_sequences += len(lengths)
        self.n_tokens += nbytes // self.dtype.itemsize

    def end_document(self) -> None:
        self._docs.append(self.n_sequences)

    def end_documents(self, ends: np.ndarray) -> None:
        """Close several documents at once: ``ends`` are absolute sequence counts, ascending."""
        self._docs.extend(ends)

    def add_document(self, tokens: np.ndarray | Sequence[int]) -> None:
        self.add_item(tokens)
        self.end_document()

    def add_dataset(self, prefix: str | os.PathLike) -> None:
        """Append every sequence and document of an existing dataset (same dtype)."""
        other = IndexedDataset(prefix)
        if other.dtype != self.dtype:
            raise DataError(f"{other.prefix}.idx: dtype {other.dtype} differs from the merged dataset's {self.dtype}; re-prepare it with the same tokenizer")
        base = self.n_sequences
        for a in range(0, len(other), _CHUNK):
            self._lengths.extend(other.sequence_lengths[a : a + _CHUNK])
        for a in range(1, len(other.document_indices), _CHUNK):
            self._docs.extend(other.document_indices[a : a + _CHUNK] + base)
        self.n_sequences += len(other)
        self.n_tokens += other.n_tokens
        self._bin.flush()
        with open(bin_path(prefix), "rb") as f:
            shutil.copyfileobj(f, self._bin, 1 << 22)

    def finalize(self) -> None:
        self._bin.flush()
        os.fsync(self._bin.fileno())
        self._bin.close()
        itemsize = self.dtype.itemsize
        with open(self._idx_tmp, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", VERSION))
            f.write(struct.pack("<B", CODE_OF_DTYPE[self.dtype]))
            self._docs.flush()
            f.write(struct.pack("<Q", self.n_sequences))
            f.write(struct.pack("<Q", self._docs.count))
            lengths_path = self._lengths.path
            for chunk in self._lengths.chunks():
                f.write(chunk.tobytes())
            start = 0
            with open(lengths_path, "rb") as lf:
                while data := lf.read(_CHUNK * 4):
                    sizes = np.frombuffer(data, dtype="<i4").astype(np.int64) * itemsize
                    ends = np.cumsum(sizes) + start
                    f.write((ends - sizes).astype("<i8").tobytes())
                    start = int(ends[-1])
            for chunk in self._docs.chunks():
                f.write(chunk.tobytes())
            f.flush()
            os.fsync(f.fileno())
        self._lengths.close()
        self._docs.close()
        os.replace(self._bin_tmp, bin_path(self.prefix))
        os.replace(self._idx_tmp, idx_path(self.prefix))
        fsync_dir(bin_path(self.prefix).parent)  # the renames themselves survive a crash

    def abort(self) -> None:
        if not self._bin.closed:
            self._bin.close()
        self._lengths.close()
        self._docs.close()
        self._bin_tmp.unlink(missing_ok=True)
        self._idx_tmp.unlink(missing_ok=True)

    def __enter__(self) -> "IndexedWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.abort()


def merge_datasets(prefixes: Sequence[str | os.PathLike], output_prefix: str | os.PathLike) -> IndexedDataset:
    """Concatenate several datasets (same dtype) into ``output_prefix``, streaming."""
    if not prefixes:
        raise DataError("merge: no input datasets given; pass at least one prefix")
    dtype = IndexedDataset(prefixes[0]).dtype
    with IndexedWriter(output_prefix, dtype) as w:
        for p in prefixes:
            w.add_dataset(p)
    return IndexedDataset(output_prefix)
