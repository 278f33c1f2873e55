"""Reading back what W&B wrote offline: the records of ``<dir>/wandb/offline-run-<time>-<id>[-N]/run-<id>.wandb``.

wandb 0.31 has no Python reader any more (``wandb/sdk/internal/datastore.py`` went with the Go core), so this reads
the file's framing itself and parses each record with W&B's own protobuf, ``wandb.proto.wandb_internal_pb2.Record``.
The framing (wandb-core's ``store.go``: a 7-byte header ``:W&B`` + uint16 0xBEE1 + version, then LevelDB's log
format, https://github.com/google/leveldb/blob/main/doc/log_format.md): 32 KiB blocks of records, each a 7-byte
header (CRC32 uint32, length uint16 little-endian, type: 1 full, 2 first, 3 middle, 4 last) and its data; a block's
tail shorter than a header is padding.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7


def _payloads(data: bytes):
    assert data[:4] == b":W&B", data[:7]
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
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            yield buf + chunk


def records(path: Path):
    from wandb.proto.wandb_internal_pb2 import Record

    for payload in _payloads(Path(path).read_bytes()):
        record = Record()
        record.ParseFromString(payload)
        yield record


def offline_runs(wandb_dir: Path, run_id: str) -> list[Path]:
    """The run's ``.wandb`` files, one per start, oldest first."""
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


def run_record(path: Path):
    """The file's ``run`` record (id, project, group, name, config, tags)."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            return record.run
    return None
