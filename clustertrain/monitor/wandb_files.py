"""Reading back what W&B wrote offline: the records of ``<dir>/wandb/offline-run-<time>-<id>[-N]/run-<id>.wandb``
(one directory per ``wandb.init``), so that :mod:`clustertrain.monitor.trackers` knows which rows a W&B run really
holds — wandb-core counts a row as logged once ``run.log`` returns, and writes the file later (every
``x_transaction_log_flush_interval``): a wandb-core killed before then (a Slurm requeue's SIGTERM reaches every
process of the job) leaves a file of its 7-byte header only.

wandb 0.31 has no Python reader (``wandb/sdk/internal/datastore.py`` went with the Go core), so this reads the
file's framing itself and parses each record with W&B's own protobuf, ``wandb.proto.wandb_internal_pb2.Record``.
The framing (wandb-core's ``store.go``: a 7-byte header ``:W&B`` + uint16 0xBEE1 + version byte, then LevelDB's log
format, https://github.com/google/leveldb/blob/main/doc/log_format.md): 32 KiB blocks of records, each a 7-byte
header (CRC32 uint32, length uint16 little-endian, type: 1 full, 2 first, 3 middle, 4 last) and its data; a block's
tail shorter than a header is padding. A file cut short (its writer killed mid-record) yields the records before the
cut; the CRC is not checked (a damaged record fails to parse, and reading stops there).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterator

BLOCK = 32768
HEADER = 7
MAGIC = b":W&B"


def payloads(data: bytes) -> Iterator[bytes]:
    """The records' bytes in a ``.wandb`` file's content (nothing when it is not one)."""
    if data[:4] != MAGIC:
        return
    pos, buf = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:  # zero padding to the block's end
            pos += left
            continue
        if pos + HEADER + length > len(data) or kind not in (1, 2, 3, 4):  # cut short, or not a record
            return
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        else:
            yield buf + chunk


def records(path: Path):
    """The ``wandb_internal_pb2.Record`` messages of one ``.wandb`` file, up to the first that does not parse."""
    from google.protobuf.message import DecodeError
    from wandb.proto.wandb_internal_pb2 import Record

    try:
        data = Path(path).read_bytes()
    except OSError:
        return
    for payload in payloads(data):
        record = Record()
        try:
            record.ParseFromString(payload)
        except DecodeError:
            return
        yield record


def offline_runs(wandb_dir: Path, run_id: str) -> list[Path]:
    """The run's ``.wandb`` files under ``wandb_dir`` (W&B's ``dir``), one per start, oldest first."""
    files = list(Path(wandb_dir).glob(f"wandb/offline-run-*-{run_id}*/run-{run_id}.wandb"))
    return sorted(files, key=lambda p: p.stat().st_mtime)


def history(path: Path) -> list[dict]:
    """The history rows of one ``.wandb`` file: key -> JSON-decoded value."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def held_steps(files: list[Path], key: str = "step") -> set[int]:
    """The values of ``key`` (our x-axis) in the history rows the files hold."""
    steps: set[int] = set()
    for f in files:
        for row in history(f):
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                steps.add(int(value))
    return steps


def run_record(path: Path):
    """The file's ``run`` record (id, project, group, name, config, tags); None when it holds none."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            return record.run
    return None
