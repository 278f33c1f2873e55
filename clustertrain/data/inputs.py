"""Reading corpus files: which files an ``--input`` names, and their documents in blocks of whole lines.

Formats (``.gz`` is gunzipped, ``.zst`` needs the ``zstandard`` module):

* ``*.jsonl`` / ``*.json`` (optionally compressed): one document per line, the text under ``json_key``.
  Blank lines are ignored.
* anything else (``*.txt``, ...): **one document per file** — the whole file is one document (an empty file, none).

:func:`blocks` cuts a file into blocks of whole lines (~256 KiB by default) (a text file is one block);
:func:`parse_block` turns a block into texts and :class:`BadLine` entries for bad lines (each renders as a one-line
message naming file and line, or byte offset). Both preprocessing (:mod:`clustertrain.data.preprocess`) and
tokenizer training (:mod:`clustertrain.data.tokenizers`) read their input through this module.

Blocks by reference. For an uncompressed JSONL file, ``blocks(..., by_reference=True)`` does not read the file: it
seeks to every ``size``-th byte and reads forward only to the next newline, and each block carries (offset, length).
The process that parses a block reads its bytes itself (:meth:`Block.loaded`, ``os.pread``), so the file is read
once, in parallel, by the workers, and the main process never holds it. Such a block does not know its first line
number (``first_line`` 0); a bad line's message gets it from :class:`LineCounter`, which counts newlines only when
a message is printed.

Parsing. Each line is parsed with `orjson <https://pypi.org/project/orjson/>`_ when it is installed (the JSONL
reader of Hugging Face's datatrove uses it: ``src/datatrove/pipeline/readers/jsonl.py``), else with ``json``.
orjson is used only for the lines it accepts whose key holds a string: there it returns the text ``json`` returns
(it accepts no invalid UTF-8, no lone surrogate escape, no NaN). Every other line goes through ``json`` and the
checks below, so what counts as a bad line, and its message, does not depend on orjson
(tests/unit/data/test_data_inputs.py compares both on hostile lines).
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Iterable, Iterator

from clustertrain.core.errors import DataError

try:
    from orjson import loads as _fast_loads
except ImportError:  # optional: the json module gives the same texts, ~1.7x slower
    _fast_loads = None

BLOCK = 1 << 18  # small enough to balance slow (BPE) tokenizers across workers
JSON_SUFFIXES = (".jsonl", ".json")


def resolve_inputs(inputs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Expand files and globs, in the order given (each glob sorted); DataError when one matches nothing."""
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    files: list[Path] = []
    for item in items:
        s = os.fspath(item)
        matches = sorted(glob.glob(s, recursive=True)) if glob.has_magic(s) else [s]
        found = [Path(m) for m in matches if Path(m).is_file()]
        if not found:
            raise DataError(f"--input {s}: no such file (or the glob matches no files); give .txt/.jsonl[.gz] files")
        files.extend(found)
    if not files:
        raise DataError("--input: no input files given")
    return files


def is_jsonl(path: Path) -> bool:
    name = path.name
    for comp in (".gz", ".zst"):
        name = name.removesuffix(comp)
    return name.endswith(JSON_SUFFIXES)


def _open_raw(path: Path) -> tuple[IO[bytes], IO[bytes]]:
    """(compressed file object for progress, decompressed byte stream)."""
    raw = open(path, "rb")
    if path.suffix == ".gz":
        return raw, gzip.GzipFile(fileobj=raw)
    if path.suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            raw.close()
            raise DataError(f"{path}: reading .zst needs the zstandard module; pip install zstandard or decompress the file") from None
        return raw, zstandard.ZstdDecompressor().stream_reader(raw)
    return raw, raw


@dataclass(frozen=True)
class Block:
    path: str
    jsonl: bool
    first_line: int  # 1-based line number of the first line (jsonl); 0: not known (a block by reference)
    offset: int  # byte offset of the block in the (decompressed) file
    data: bytes
    length: int = 0  # a block by reference (empty data): its bytes are these many at ``offset`` of ``path``

    def loaded(self) -> Block:
        """This block with its bytes. A block by reference reads them (``os.pread``) in the process that parses it,
        so a worker process never receives the input through a pipe."""
        if self.data or not self.length:
            return self
        with open(self.path, "rb") as f:
            data = os.pread(f.fileno(), self.length, self.offset)
        if len(data) != self.length:
            raise DataError(f"{self.path}: the file shrank while being read (to {self.offset + len(data)} bytes); "
                            "prepare a file that nothing is writing to")
        return replace(self, data=data, length=0)


def blocks(path: Path, progress, size: int = BLOCK, by_reference: bool = False) -> Iterator[Block]:
    """The blocks of whole lines of ``path`` (one block for a non-JSONL file). ``by_reference``: blocks of an
    uncompressed file carry offset and length instead of bytes (:meth:`Block.loaded` reads them)."""
    jsonl = is_jsonl(path)
    raw, stream = _open_raw(path)
    try:
        with raw:
            if not jsonl:
                data = _read_all(stream, path)
                progress(raw.tell())
                yield Block(str(path), False, 1, 0, data)
                return
            if by_reference and stream is raw:
                yield from _ranges(raw, path, size, progress)
                return
            line, offset, rest = 1, 0, b""
            while True:
                chunk = _read(stream, path, size)
                progress(raw.tell())
                if not chunk:
                    if rest:
                        yield Block(str(path), True, line, offset, rest)
                    return
                data = rest + chunk
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    rest = data
                    continue
                block, rest = data[:cut], data[cut:]
                yield Block(str(path), True, line, offset, block)
                line += block.count(b"\n")
                offset += len(block)
    finally:
        if stream is not raw:
            stream.close()


def _ranges(raw: IO[bytes], path: Path, size: int, progress) -> Iterator[Block]:
    """Blocks by reference of an uncompressed JSONL file, each ending at the first newline at or after a multiple of
    ``size`` (or at the end of the file), found by reading forward from there: the file itself is not read."""
    fd, end, offset = raw.fileno(), os.fstat(raw.fileno()).st_size, 0
    while offset < end:
        cut = pos = offset + size
        while cut < end:
            window = os.pread(fd, 1 << 16, pos)
            if not window:
                cut = end
            elif (i := window.find(b"\n")) >= 0:
                cut = pos + i + 1
                break
            else:
                pos += len(window)
                cut = pos
        cut = min(cut, end)
        yield Block(str(path), True, 0, offset, b"", cut - offset)
        progress(cut)
        offset = cut


class LineCounter:
    """Line numbers of byte offsets, for the messages of blocks by reference: counts the newlines before an offset,
    going on from the previous question about the same file (blocks are answered in order: one pass at most)."""

    def __init__(self) -> None:
        self._at: dict[str, tuple[int, int]] = {}  # path -> (offset, newlines before it)

    def line_at(self, path: str, offset: int) -> int:
        pos, count = self._at.get(path, (0, 0))
        if offset < pos:
            pos, count = 0, 0
        with open(path, "rb") as f:
            while pos < offset:
                data = os.pread(f.fileno(), min(1 << 22, offset - pos), pos)
                if not data:
                    break
                count += data.count(b"\n")
                pos += len(data)
        self._at[path] = (pos, count)
        return count + 1


@dataclass(frozen=True)
class BadLine:
    """A bad line of a block (``index``: its place in the block; None: a whole text file) and what is wrong with it.
    :meth:`message` is the one-line error naming the file and line."""

    path: str
    block_offset: int
    first_line: int  # the block's first line, 0 when not known (see LineCounter)
    index: int | None
    problem: str

    def message(self, lines: LineCounter | None = None) -> str:
        if self.index is None:
            return f"{self.path}: {self.problem}"
        first = self.first_line or (lines or LineCounter()).line_at(self.path, self.block_offset)
        return f"{self.path}:{first + self.index}: {self.problem}"


def _read(stream: IO[bytes], path: Path, n: int) -> bytes:
    try:
        return stream.read(n)
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot decompress ({e}); the file is damaged or not {path.suffix}") from None


def _read_all(stream: IO[bytes], path: Path) -> bytes:
    out = io.BytesIO()
    while chunk := _read(stream, path, BLOCK * 16):
        out.write(chunk)
    return out.getvalue()


def parse_block(block: Block, json_key: str, stop_at_first: bool) -> tuple[list[str], list[BadLine], int]:
    """(texts, the first five bad lines, bad count) of one block (loaded: see :meth:`Block.loaded`)."""
    hint = "; fix or remove it, or pass --skip-bad-lines"
    if not block.jsonl:
        if not block.data:  # an empty file holds no document (as a blank JSONL line holds none)
            return [], [], 0
        try:
            return [block.data.decode("utf-8")], [], 0
        except UnicodeDecodeError as e:
            problem = f"not UTF-8 text at byte offset {e.start}; convert the file to UTF-8 or pass --skip-bad-lines"
            return [], [BadLine(block.path, block.offset, block.first_line, None, problem)], 1
    texts: list[str] = []
    bad: list[BadLine] = []
    nbad = 0
    pos = 0
    fast = _fast_loads
    lines = block.data.split(b"\n")
    if block.data.endswith(b"\n"):
        lines.pop()
    for index, line in enumerate(lines):
        start, pos = pos, pos + len(line) + 1
        if fast is not None:  # the fast path: only what json parses to the same text (module docstring)
            try:
                doc = fast(line)
            except ValueError:
                doc = None
            if type(doc) is dict and type(text := doc.get(json_key)) is str:
                texts.append(text)
                continue
        if not line.strip():
            continue
        msg = None
        try:
            doc = json.loads(line.decode("utf-8"))
            if not isinstance(doc, dict) or json_key not in doc:
                keys = ", ".join(list(doc)[:5]) if isinstance(doc, dict) else type(doc).__name__
                msg = f"no key {json_key!r} (found: {keys}); set --json-key to the key holding the text{hint}"
            elif not isinstance(doc[json_key], str):
                msg = f"{json_key!r} holds a {type(doc[json_key]).__name__}, not a string{hint}"
            elif (b"\\ud" in line or b"\\uD" in line) and (bad_at := _lone_surrogate(doc[json_key])) is not None:
                msg = (f"{json_key!r} holds a lone surrogate escape (\\u{bad_at:04x}) at character "
                       f"{doc[json_key].index(chr(bad_at))}, which is not Unicode text and cannot be tokenized{hint}")
            else:
                texts.append(doc[json_key])
        except UnicodeDecodeError as e:
            msg = f"not UTF-8 at byte offset {block.offset + start + e.start}{hint}"
        except ValueError as e:
            msg = f"not valid JSON ({getattr(e, 'msg', e)}){hint}"
        if msg is not None:
            nbad += 1
            if len(bad) < 5:
                bad.append(BadLine(block.path, block.offset, block.first_line, index, msg))
            if stop_at_first:
                break
    return texts, bad, nbad


def head_texts(path: Path, json_key: str = "text", limit: int = BLOCK) -> list[str]:
    """The documents in the first ``limit`` bytes of a file, bad lines skipped (a sample, never an error):
    whole lines of a JSONL file, the start of any other file."""
    raw, stream = _open_raw(Path(path))
    try:
        with raw:
            data = _read(stream, Path(path), limit)
    finally:
        if stream is not raw:
            stream.close()
    if not is_jsonl(Path(path)):
        return [data.decode("utf-8", errors="ignore")] if data else []
    data = data[: data.rfind(b"\n") + 1] or data
    return parse_block(Block(str(path), True, 1, 0, data), json_key, False)[0]


def _lone_surrogate(text: str) -> int | None:
    """The first lone surrogate code point in ``text`` (JSON's ``\\ud800`` escapes decode to one), else None."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return ord(text[e.start])


def iter_texts(path: Path, json_key: str = "text") -> Iterator[str]:
    """The documents of one input file, in order (DataError on the first bad line)."""
    for block in blocks(Path(path), lambda _pos: None):
        texts, bad, nbad = parse_block(block, json_key, True)
        if nbad:
            raise DataError(bad[0].message())
        yield from texts
