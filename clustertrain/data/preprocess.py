"""Tokenize text/JSONL corpora into a Megatron indexed dataset ``P.bin`` + ``P.idx`` + ``P.manifest.json``.

Inputs (files or globs, read by :mod:`clustertrain.data.inputs`; ``.gz`` is gunzipped, ``.zst`` needs the
``zstandard`` module):

* ``*.jsonl`` / ``*.json`` (optionally ``.gz``/``.zst``): one document per line, the text under
  ``json_key``. Blank lines are ignored.
* anything else (``*.txt``, ...): **one document per file** — the whole file is one document, so a
  book or a source file stays contiguous (split it yourself if you want paragraphs); an empty file holds none.

Each document becomes one sequence; with ``append_eod`` the tokenizer's end-of-document token
closes it. As in Megatron's ``tools/preprocess_data.py``, a document that tokenizes to nothing
gets no sequence and no eod (the document index still counts it).

Encoders: a byte-level BPE ``tokenizer.json`` is encoded by gigatoken where it gives exactly the tokens Hugging
Face ``tokenizers`` gives, checked at start on a verification sample (:mod:`clustertrain.data.fastbpe`), else by
``tokenizers``; ``encoder="reference"`` always uses ``tokenizers``. The output is the same either way.

Workers: the main process cuts each file into blocks of whole lines (~256 KiB, 1 MiB for the fast encoder) and
hands them to a ``multiprocessing`` pool (a bounded window of blocks in flight, results taken in order, so the
output is identical for any worker count). Blocks of an uncompressed file travel by reference (offset, length):
the main process finds the cuts by reading a few bytes after every block boundary, and each worker reads its own
blocks with ``os.pread`` (:func:`clustertrain.data.inputs.blocks`). Workers parse, encode, insert the eods, and
write each block's tokens to a part file (page cache: through the result pipe, unpickling and 64 KiB reads cost the
main process ~2 s of CPU per GB of tokens); they return only the sequence lengths. The main process hashes each part
from a memory map and has the kernel append it to ``P.bin`` (``os.copy_file_range``:
:meth:`~clustertrain.data.indexed.IndexedWriter.add_items_from`), in order, then deletes it, so at most a window of
parts exists at a time (in ``P.parts-<pid>/``, removed at the end, failure included).

Bad input — a line that is not JSON, lacks the key, is not a string, holds a lone surrogate escape
(``\\ud800``, not Unicode text), bytes that are not UTF-8,
no documents at all — raises a one-line :class:`DataError` naming the file and line (or byte
offset), and leaves nothing behind: directories it created are removed, and an existing dataset at the prefix
(manifest included) stays as it was. With ``skip_bad_lines`` bad lines (or undecodable text files) are skipped
and counted.

``P.manifest.json`` (written last; the dataset counts as complete only when it exists)::

    {"format": "clustertrain-indexed", "version": 1,
     "tokenizer": "<identity>", "vocab_size": int, "eod": int, "dtype": "uint16"|"int32",
     "json_key": str, "append_eod": bool, "encoder": "gigatoken 0.10.0"|"tokenizers 0.23.3"|"byte-v1" (which
     one ran; informational, the output does not depend on it),
     "documents": int, "sequences": int, "tokens": int, "skipped_lines": int,
     "bin": {"bytes": int, "sha256": hex}, "idx": {"bytes": int, "sha256": hex},
     "sources": [{"path": absolute path, "bytes": int, "mtime_ns": int}, ...]}

Re-running with the same sources (path, size, mtime), tokenizer and options while ``.bin`` and
``.idx`` still have the recorded sizes does nothing.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import multiprocessing as mp
import os
import shutil
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np

from clustertrain.data.indexed import IndexedWriter, bin_path, idx_path, token_dtype
from clustertrain.data.fastbpe import EncoderChoice, choose_encoder
from clustertrain.data.inputs import BLOCK, BadLine, Block, LineCounter, blocks, head_texts, parse_block, resolve_inputs
from clustertrain.data.tokenizers import Tokenizer, encode_flat, load_tokenizer
from clustertrain.core.errors import DataError
from clustertrain.core.run_paths import write_atomic

FORMAT = "clustertrain-indexed"
ENCODERS = ("auto", "reference")
#: block size for the fast encoder: fewer, larger batches (each costs gigatoken ~0.7 ms of Python-side array
#: building); worker processes, not gigatoken's own threads, use the cores: see docs/data.md, "Encoders"
FAST_BLOCK = 1 << 20
VERSION = 1
__all__ = ["PreparedDataset", "manifest_path", "prepare_dataset", "read_manifest", "resolve_inputs", "sha256_file"]


def manifest_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}.manifest.json")


def read_manifest(prefix: str | os.PathLike) -> dict | None:
    path = manifest_path(prefix)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not valid JSON ({e}); delete it and re-run prepare") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path}: not a {FORMAT} manifest; delete it and re-run prepare")
    return data


# ---- worker side -------------------------------------------------------------------------------
_W: dict = {}


class Encoded(NamedTuple):
    """One block's result: its tokens (eods included) in ``tokens``, or in the part file ``part`` (a pool worker's),
    the length of each sequence, the number of documents, the indices (in the block) of documents that got no
    sequence (they encode to nothing), and the block's first bad lines and bad-line count."""

    tokens: np.ndarray | None
    part: str | None
    lengths: np.ndarray
    documents: int
    empty: np.ndarray
    bad: list[BadLine]
    nbad: int


def _init_worker(encoder, eod: int, dtype, json_key: str, append_eod: bool, skip: bool, in_pool: bool = False,
                 parts: str | None = None) -> None:
    if in_pool:  # one process per core already: Hugging Face tokenizers' own thread pool would oversubscribe
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _W.update(encoder=encoder, eod=eod, json_key=json_key, append_eod=append_eod, skip=skip, dtype=np.dtype(dtype),
              parts=parts, written=0)


def _encode_block(block: Block) -> Encoded:
    block = block.loaded()
    texts, bad, nbad = parse_block(block, _W["json_key"], not _W["skip"])
    dtype = _W["dtype"]
    if not texts:
        return Encoded(np.zeros(0, dtype), None, np.zeros(0, np.int32), 0, np.zeros(0, np.int64), bad, nbad)
    tokens, lengths = encode_flat(_W["encoder"], texts)
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        lengths = lengths[lengths > 0]
    tokens = tokens.astype(dtype, copy=False)
    if _W["append_eod"] and lengths.size:
        tokens = np.insert(tokens, np.cumsum(lengths), np.asarray(_W["eod"], dtype))
        lengths = lengths + 1
    return Encoded(np.ascontiguousarray(tokens), None, lengths.astype(np.int32), len(texts), empty, bad, nbad)


def _encode_block_to_part(block: Block) -> Encoded:
    """:func:`_encode_block` in a pool worker: the tokens go to a part file, not through the result pipe."""
    out = _encode_block(block)
    if not out.tokens.size:
        return out
    _W["written"] += 1
    part = os.path.join(_W["parts"], f"{os.getpid()}-{_W['written']}")
    with open(part, "wb") as f:
        f.write(memoryview(out.tokens))
    return out._replace(tokens=None, part=part)


# ---- main side ---------------------------------------------------------------------------------
def _in_order(parts: Iterable[Block], submit, window: int, consume) -> None:
    """Submit each block (``submit(block)`` returns a getter), at most ``window`` in flight, consumed in order."""
    pending: deque = deque()
    for b in parts:
        pending.append(submit(b))
        if len(pending) >= window:
            consume(pending.popleft()())
    while pending:
        consume(pending.popleft()())


def _close(pool, parts: Path | None) -> None:
    """Stop the workers and remove the part files (both may run twice: on failure, then in ``finally``)."""
    if pool is not None:
        pool.terminate()
        pool.join()
    if parts is not None:
        shutil.rmtree(parts, ignore_errors=True)


@dataclass(frozen=True)
class PreparedDataset:
    """Result of :func:`prepare_dataset`: the prefix, its manifest, and whether it was reused as-is."""

    prefix: Path
    manifest: dict
    reused: bool
    #: which encoder ran and why (None when the dataset was reused)
    encoder: EncoderChoice | None = None

    @property
    def skipped_lines(self) -> int:
        return int(self.manifest.get("skipped_lines", 0))


def _sources(files: list[Path]) -> list[dict]:
    return [{"path": str(f.resolve()), "bytes": f.stat().st_size, "mtime_ns": f.stat().st_mtime_ns} for f in files]


def _settings(tokenizer: Tokenizer, json_key: str, append_eod: bool, sources: list[dict]) -> dict:
    return {"format": FORMAT, "version": VERSION, "tokenizer": tokenizer.identity, "vocab_size": tokenizer.vocab_size,
            "eod": tokenizer.eod, "dtype": np.dtype(token_dtype(tokenizer.vocab_size)).name,
            "json_key": json_key, "append_eod": append_eod, "sources": sources}


def _up_to_date(prefix: Path, settings: dict) -> dict | None:
    try:
        old = read_manifest(prefix)
    except DataError:
        return None
    if old is None or any(old.get(k) != v for k, v in settings.items()):
        return None
    for path, key in ((bin_path(prefix), "bin"), (idx_path(prefix), "idx")):
        if not path.is_file() or path.stat().st_size != old.get(key, {}).get("bytes"):
            return None
    return old


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _progress(console):
    if console is None:
        return None
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

    return Progress(TextColumn("[bold]tokenizing"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                    TextColumn("{task.fields[docs]:,} documents"), TransferSpeedColumn(), TimeElapsedColumn(),
                    console=console, transient=False)


def prepare_dataset(inputs: str | os.PathLike | Iterable[str | os.PathLike], output_prefix: str | os.PathLike,
                    tokenizer: str | Tokenizer = "byte", json_key: str = "text", workers: int = 1,
                    append_eod: bool = True, skip_bad_lines: bool = False, console=None,
                    encoder: str = "auto") -> PreparedDataset:
    """Tokenize ``inputs`` into ``output_prefix``.bin/.idx/.manifest.json (see module docstring).

    ``console``: a ``rich.console.Console`` to draw a progress bar (documents, MB/s) on, or None.
    ``encoder``: ``auto`` (the fast encoder where it is exact, :mod:`clustertrain.data.fastbpe`) or ``reference``
    (the tokenizer's own: Hugging Face ``tokenizers`` for a ``tokenizer.json``); the output is the same.
    """
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    if workers < 1:
        raise DataError(f"--workers {workers}: must be at least 1")
    if encoder not in ENCODERS:
        raise DataError(f"--encoder {encoder}: unknown; valid: {', '.join(ENCODERS)}")
    files = resolve_inputs(inputs)
    prefix = Path(output_prefix)
    settings = _settings(tok, json_key, append_eod, _sources(files))
    old = _up_to_date(prefix, settings)
    if old is not None:
        return PreparedDataset(prefix, old, reused=True)
    choice = choose_encoder(tok, lambda: head_texts(files[0], json_key), allow_fast=encoder == "auto")
    if console is not None:
        console.print(f"encoder: {choice.name} ({choice.reason})", highlight=False, markup=False, soft_wrap=True)
    created = [d for d in (prefix.parent, *prefix.parent.parents) if not d.exists()]  # removed again on failure
    prefix.parent.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tok.vocab_size)
    writer = IndexedWriter(prefix, dtype)
    bar = _progress(console)
    total = sum(s["bytes"] for s in settings["sources"])
    counts = {"documents": 0, "skipped_lines": 0}
    first_bad: list[str] = []
    lines = LineCounter()  # line numbers for the messages of blocks by reference
    bin_hash = hashlib.sha256()
    init = (choice.encoder, tok.eod, dtype, json_key, append_eod, skip_bad_lines)
    parts = Path(f"{prefix}.parts-{os.getpid()}") if workers > 1 else None
    pool = None
    if parts is not None:
        shutil.rmtree(parts, ignore_errors=True)
        parts.mkdir()
        pool = mp.get_context("fork" if os.name == "posix" else "spawn").Pool(
            workers, _init_worker, (*init, True, str(parts)))
    else:
        _init_worker(*init)
    try:
        task = bar.add_task("prepare", total=total, docs=0) if bar else None
        if bar:
            bar.start()
        done_bytes = [0]

        def advance(pos_in_file: int) -> None:
            if bar:
                bar.update(task, completed=done_bytes[0] + pos_in_file, docs=counts["documents"])

        def consume(result: Encoded) -> None:
            if result.nbad:
                if not skip_bad_lines:
                    raise DataError(result.bad[0].message(lines))
                counts["skipped_lines"] += result.nbad
                first_bad.extend(b.message(lines) for b in result.bad[: 5 - len(first_bad)])
            base = writer.n_sequences
            if result.part is None:
                bin_hash.update(result.tokens)
                writer.add_items(result.tokens, result.lengths)
            else:  # hashed from a mapping and copied by the kernel: the tokens never pass through this process
                fd = os.open(result.part, os.O_RDONLY)
                try:
                    size = os.fstat(fd).st_size
                    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as view:
                        bin_hash.update(view)
                    writer.add_items_from(fd, size, result.lengths)
                finally:
                    os.close(fd)
                os.unlink(result.part)
            per_doc = np.ones(result.documents, np.int64)
            per_doc[result.empty] = 0
            writer.end_documents(base + np.cumsum(per_doc))
            counts["documents"] += result.documents

        for path, src in zip(files, settings["sources"]):
            todo = blocks(path, advance, FAST_BLOCK if choice.fast else BLOCK, by_reference=pool is not None)
            if pool is not None:
                _in_order(todo, lambda b: pool.apply_async(_encode_block_to_part, (b,)).get, 3 * workers, consume)
            else:
                for b in todo:
                    consume(_encode_block(b))
            done_bytes[0] += src["bytes"]
            advance(0)
        if counts["documents"] == 0:
            names = ", ".join(str(f) for f in files[:3]) + (" ..." if len(files) > 3 else "")
            why = f" ({counts['skipped_lines']} bad lines skipped)" if counts["skipped_lines"] else ""
            raise DataError(f"{names}: no documents found{why}; give non-empty input files")
        # the old manifest goes only now: up to here a failure leaves an existing dataset as it was
        manifest_path(prefix).unlink(missing_ok=True)
        writer.finalize()
    except BaseException:
        writer.abort()
        _close(pool, parts)
        for d in created:  # deepest first; stops at the first that is not empty
            try:
                d.rmdir()
            except OSError:
                break
        raise
    finally:
        _close(pool, parts)
        if bar:
            bar.stop()
    manifest = dict(settings)
    manifest.update(encoder=choice.name, documents=counts["documents"], sequences=writer.n_sequences, tokens=writer.n_tokens,
                    skipped_lines=counts["skipped_lines"], first_skipped=first_bad,
                    bin={"bytes": bin_path(prefix).stat().st_size, "sha256": bin_hash.hexdigest()},
                    idx={"bytes": idx_path(prefix).stat().st_size, "sha256": sha256_file(idx_path(prefix))})
    write_atomic(manifest_path(prefix), json.dumps(manifest, indent=1))
    return PreparedDataset(prefix, manifest, reused=False, encoder=choice)
