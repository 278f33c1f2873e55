"""Tokenized corpus as one flat token array, and the GPT samples cut from it.

On-disk layout (one directory per prepared dataset, below ``<storage.root>/datasets/``)::

    <name>/tokens.bin   raw little-endian uint16 token ids, documents concatenated, each followed by <eod>
    <name>/meta.json    {"format": "clustertrain-packed", "version": 1, "tokenizer": ..., "vocab_size": ...,
                         "n_tokens": ..., "n_documents": ..., "source_key": ...}

``meta.json`` is written last (after ``tokens.bin`` is complete and renamed), so a directory
without it is incomplete and is rebuilt. ``source_key`` hashes the inputs and tokenizer: an
unchanged input is prepared once.

Samples: the token stream is cut into windows of ``seq_len + 1`` tokens that overlap by one
token (input = window[:-1], target = window[1:]), packing across document boundaries. Window
order is a seeded permutation, drawn anew for each epoch, so global sample ``g`` is a pure
function of (seed, seq_len, g): every rank can compute its own samples, and a resumed run
continues from the exact sample where it stopped.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator

import numpy as np

from clustertrain.data.tokenizers import Tokenizer, load_tokenizer
from clustertrain.errors import DataError

FORMAT = "clustertrain-packed"
VERSION = 1
BUILTIN = {"builtin:shakespeare": "shakespeare.jsonl.gz"}


def _builtin_path(source: str) -> Path:
    if source not in BUILTIN:
        raise DataError(f"data.source: unknown built-in corpus {source!r}; valid: {', '.join(BUILTIN)}")
    return Path(str(resources.files("clustertrain.data") / "corpus" / BUILTIN[source]))


def resolve_inputs(source: str) -> list[Path]:
    if source.startswith("builtin:"):
        return [_builtin_path(source)]
    files = sorted(Path(p) for p in glob.glob(source, recursive=True) if Path(p).is_file())
    if not files:
        raise DataError(f"data.source: {source!r} matches no files; give a path or glob of .txt/.jsonl files")
    return files


def iter_documents(path: Path, json_key: str) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    name = path.name.removesuffix(".gz")
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            if name.endswith(".jsonl"):
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        doc = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}); fix or remove the line") from None
                    if not isinstance(doc, dict) or json_key not in doc:
                        raise DataError(f"{path}:{lineno}: no key {json_key!r}; set data.json_key to the key holding the text")
                    yield str(doc[json_key])
            else:
                yield f.read()
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text at byte {e.start}; convert the file to UTF-8") from None


def _source_key(files: list[Path], tokenizer: Tokenizer, json_key: str) -> str:
    h = hashlib.sha256(f"{FORMAT}/{VERSION}/{tokenizer.identity}/{json_key}".encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class PackedDataset:
    """A prepared dataset directory."""

    path: Path
    meta: dict

    @property
    def n_tokens(self) -> int:
        return int(self.meta["n_tokens"])

    def tokens(self) -> np.ndarray:
        return np.memmap(self.path / "tokens.bin", dtype=np.uint16, mode="r")


def prepare_packed(source: str, tokenizer_spec: str, json_key: str, datasets_root: Path) -> PackedDataset:
    """Tokenize ``source`` once into ``datasets_root/<name>``; reuse it while the inputs are unchanged."""
    tokenizer = load_tokenizer(tokenizer_spec)
    files = resolve_inputs(source)
    key = _source_key(files, tokenizer, json_key)
    stem = source.removeprefix("builtin:") if source.startswith("builtin:") else Path(files[0]).stem
    out = Path(datasets_root) / f"{stem}-{tokenizer.identity}-{key}"
    existing = open_packed(out)
    if existing is not None:
        return existing
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        n_tokens = n_docs = 0
        with open(tmp / "tokens.bin", "wb") as fbin:
            for f in files:
                for text in iter_documents(f, json_key):
                    ids = np.asarray(tokenizer.encode(text), dtype=np.uint16)
                    fbin.write(ids.tobytes())
                    fbin.write(np.asarray([tokenizer.eod], dtype=np.uint16).tobytes())
                    n_tokens += len(ids) + 1
                    n_docs += 1
            fbin.flush()
            os.fsync(fbin.fileno())
        if n_docs == 0:
            raise DataError(f"data.source: {source!r} holds no documents; give non-empty input files")
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": tokenizer.identity,
            "vocab_size": tokenizer.vocab_size,
            "n_tokens": n_tokens,
            "n_documents": n_docs,
            "source": source,
            "source_key": key,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished first
            if open_packed(out) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = open_packed(out)
    assert result is not None
    return result


def open_packed(path: Path) -> PackedDataset | None:
    meta_path = Path(path) / "meta.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
        raise DataError(f"{meta_path}: not a {FORMAT} dataset; remove the directory or point data.source elsewhere")
    return PackedDataset(Path(path), meta)


class SampleIndex:
    """Deterministic, seeded sample order over a packed token array (see module docstring)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int):
        self.tokens = tokens
        self.seq_len = seq_len
        self.seed = seed
        self.n_samples = (len(tokens) - 1) // seq_len
        if self.n_samples < 1:
            raise DataError(
                f"model.seq_len={seq_len} needs at least {seq_len + 1} tokens but the data has {len(tokens)}; "
                "lower seq_len or add data"
            )
        self._perm_epoch = -1
        self._perm: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n_samples

    def _window(self, global_index: int) -> int:
        epoch, pos = divmod(global_index, self.n_samples)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_samples)
            self._perm_epoch = epoch
        return int(self._perm[pos])

    def sample(self, global_index: int) -> np.ndarray:
        start = self._window(global_index) * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]

    def batch(self, start: int, count: int) -> np.ndarray:
        """``count`` consecutive global samples from ``start`` as an int64 array [count, seq_len + 1]."""
        return np.stack([self.sample(start + i) for i in range(count)]).astype(np.int64)
