"""Check an indexed dataset ``P.idx`` + ``P.bin`` (+ ``P.manifest.json``) byte by byte.

:func:`validate_dataset` returns a :class:`DatasetReport`; each problem is one line that names the
check and the byte offset or entry, e.g. ``idx.pointers: entry 17 is 4096, expected 4090 (byte 1234)``.
Checks, in order (later checks are skipped when the index cannot be read at all):

``idx.size``      the file holds at least the 34-byte header
``idx.magic``     bytes 0-8 are ``MMIDIDX\\0\\0``
``idx.version``   u64 at byte 9 is 1
``idx.dtype``     u8 at byte 17 is a known code (1-8)
``idx.counts``    the file size equals 34 + 12*S + 8*D (+S multimodal) for the header's S, D
``idx.lengths``   no sequence length is negative
``idx.pointers``  pointer[0] = 0 and pointer[i+1] = pointer[i] + length[i]*itemsize
``idx.documents`` document indices start at 0, never decrease and end at S
``bin.size``      ``P.bin`` holds exactly the bytes the index points at
``bin.tokens``    every token id is in [0, vocab_size) — a sample of blocks for files over
                  64 MiB unless ``full``; vocab_size from the argument or the manifest
``manifest.*``    counts, dtype and sha256 of ``.bin``/``.idx`` match the manifest (the ``.bin``
                  hash only with ``full`` or files up to 1 GiB), and its tokenizer is the expected one
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clustertrain.data.indexed import DTYPE_CODES, HEADER_SIZE, MAGIC, VERSION, bin_path, idx_path
from clustertrain.data.preprocess import read_manifest, sha256_file
from clustertrain.core.errors import DataError

SAMPLE_LIMIT = 64 << 20
HASH_LIMIT = 1 << 30
_BLOCK = 1 << 20


@dataclass
class DatasetReport:
    """Outcome of :func:`validate_dataset`: ``problems`` (one line each) and what was checked."""

    prefix: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sequences: int = 0
    documents: int = 0
    tokens: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_for_problems(self) -> None:
        if self.problems:
            more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            raise DataError(f"{self.prefix}: {self.problems[0]}{more}")


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def validate_dataset(prefix: str | os.PathLike, vocab_size: int | None = None, full: bool = False,
                     tokenizer: str | None = None) -> DatasetReport:
    """Check ``prefix``.idx/.bin/.manifest.json; ``tokenizer`` = expected tokenizer identity, if any."""
    report = DatasetReport(os.fspath(prefix))
    p = report.problems
    ipath, bpath = idx_path(prefix), bin_path(prefix)
    for path in (ipath, bpath):
        if not path.is_file():
            p.append(f"{path.suffix[1:]}.exists: {path} is missing")
    if p:
        return report
    size = ipath.stat().st_size
    if size < HEADER_SIZE:
        p.append(f"idx.size: {size} bytes, shorter than the {HEADER_SIZE}-byte header")
        return report
    raw = np.memmap(ipath, dtype=np.uint8, mode="r")
    head = bytes(raw[:HEADER_SIZE])
    if head[:9] != MAGIC:
        p.append(f"idx.magic: bytes 0-8 are {head[:9]!r}, expected {MAGIC!r} (not a Megatron .idx)")
    version = int.from_bytes(head[9:17], "little")
    if version != VERSION:
        p.append(f"idx.version: byte 9 holds version {version}, expected {VERSION}")
    code = head[17]
    if code not in DTYPE_CODES:
        p.append(f"idx.dtype: byte 17 holds dtype code {code}, expected one of 1-8")
    s, d = int.from_bytes(head[18:26], "little"), int.from_bytes(head[26:34], "little")
    want = HEADER_SIZE + 12 * s + 8 * d
    if size not in (want, want + s):
        p.append(f"idx.counts: header says S={s} sequences, D={d} document indices (bytes 18-33), so the file "
                 f"should be {want} bytes, but it is {size}")
    if p:
        return report
    dtype = np.dtype(DTYPE_CODES[code])
    item = dtype.itemsize
    buf = memoryview(raw)
    lengths = np.frombuffer(buf, "<i4", s, HEADER_SIZE)
    pointers = np.frombuffer(buf, "<i8", s, HEADER_SIZE + 4 * s)
    docs = np.frombuffer(buf, "<i8", d, HEADER_SIZE + 12 * s)
    report.sequences, report.documents = s, max(d - 1, 0)
    report.tokens = int(lengths.sum(dtype=np.int64))
    if (i := _first(lengths < 0)) is not None:
        p.append(f"idx.lengths: entry {i} is {lengths[i]} (negative) at byte {HEADER_SIZE + 4 * i}")
    if s:
        expect = np.empty(s, np.int64)
        expect[0] = 0
        np.cumsum(lengths[:-1].astype(np.int64) * item, out=expect[1:])
        if (i := _first(pointers != expect)) is not None:
            p.append(f"idx.pointers: entry {i} is {pointers[i]}, expected {expect[i]} "
                     f"(byte {HEADER_SIZE + 4 * s + 8 * i}); pointers must follow the lengths")
    if d == 0 or docs[0] != 0:
        p.append(f"idx.documents: entry 0 is {docs[0] if d else 'missing'}, expected 0 (byte {HEADER_SIZE + 12 * s})")
    elif (i := _first(np.diff(docs) < 0)) is not None:
        p.append(f"idx.documents: entry {i + 1} is {docs[i + 1]}, smaller than entry {i} ({docs[i]}) "
                 f"(byte {HEADER_SIZE + 12 * s + 8 * (i + 1)})")
    elif docs[-1] != s:
        p.append(f"idx.documents: last entry {d - 1} is {docs[-1]}, expected S={s} (byte {HEADER_SIZE + 12 * s + 8 * (d - 1)})")
    bin_size = bpath.stat().st_size
    need = report.tokens * item
    if bin_size != need:
        p.append(f"bin.size: {bpath} is {bin_size} bytes but the index points at {need} "
                 f"({'truncated' if bin_size < need else 'trailing bytes'}); re-create the dataset")
    manifest = None
    try:
        manifest = read_manifest(prefix)
    except DataError as e:
        p.append(f"manifest.read: {e}")
    if vocab_size is None and manifest is not None:
        vocab_size = manifest.get("vocab_size")
    if vocab_size is not None and bin_size >= item and dtype.kind in "iu":
        _check_tokens(bpath, dtype, int(vocab_size), full or bin_size <= SAMPLE_LIMIT, report)
    elif vocab_size is None:
        report.notes.append("bin.tokens: skipped (no vocab size given and no manifest)")
    if manifest is not None:
        _check_manifest(manifest, prefix, report, dtype, full or bin_size <= HASH_LIMIT, tokenizer)
    elif tokenizer is not None:
        p.append(f"manifest.exists: {prefix}.manifest.json is missing, cannot confirm tokenizer {tokenizer}")
    return report


def _check_tokens(path: Path, dtype: np.dtype, vocab: int, everything: bool, report: DatasetReport) -> None:
    tokens = np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r")
    n = len(tokens)
    step = _BLOCK
    if everything:
        starts = range(0, n, step)
    else:
        rng = np.random.default_rng(0)
        picks = rng.integers(0, max(n - step, 1), size=64)
        starts = sorted({0, max(n - step, 0), *map(int, picks)})
        report.notes.append(f"bin.tokens: sampled {len(starts)} blocks of {step} tokens (use --full for all)")
    for a in starts:
        block = tokens[a : a + step]
        if (i := _first((block >= vocab) | (block < 0))) is not None:
            j = a + i
            report.problems.append(f"bin.tokens: token {j} (byte {j * dtype.itemsize}) is {block[i]}, "
                                   f"outside the vocabulary [0, {vocab})")
            return


def _check_manifest(m: dict, prefix, report: DatasetReport, dtype: np.dtype, hash_bin: bool, tokenizer: str | None) -> None:
    p = report.problems
    name = f"{os.fspath(prefix)}.manifest.json"
    if tokenizer is not None and m.get("tokenizer") != tokenizer:
        p.append(f"manifest.tokenizer: {name} was made with tokenizer {m.get('tokenizer')!r}, expected "
                 f"{tokenizer!r}; re-run prepare with this tokenizer")
    if m.get("dtype") != dtype.name:
        p.append(f"manifest.dtype: {name} says {m.get('dtype')}, the index says {dtype.name}")
    for key, have in (("sequences", report.sequences), ("documents", report.documents), ("tokens", report.tokens)):
        if m.get(key) != have:
            p.append(f"manifest.{key}: {name} says {m.get(key)}, the index says {have}")
    for kind, path in (("idx", idx_path(prefix)), ("bin", bin_path(prefix))):
        rec = m.get(kind) or {}
        if rec.get("bytes") != path.stat().st_size:
            p.append(f"manifest.{kind}: {path} is {path.stat().st_size} bytes, the manifest says {rec.get('bytes')}")
            continue
        if kind == "bin" and not hash_bin:
            report.notes.append("manifest.bin: sha256 not checked (over 1 GiB; use --full)")
            continue
        if sha256_file(path) != rec.get("sha256"):
            p.append(f"manifest.{kind}: sha256 of {path} differs from the manifest; the file changed after prepare")
