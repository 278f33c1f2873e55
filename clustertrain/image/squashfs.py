"""The ``.sqsh`` file ``enroot import`` writes: a squashfs 4.0 file system. Read its superblock, verify it.

``image build`` checks the file Enroot wrote before renaming it into the shared images directory, so that a
truncated or foreign file never takes the name every job's ``--container-image`` points at.

On-disk format (the superblock, the first 96 bytes; little-endian in squashfs 4.0). Verified against
``struct squashfs_super_block`` in plougher/squashfs-tools@08c47befa23c ``squashfs-tools/squashfs_fs.h``
(the compressor ids 5 = lz4 and 6 = zstd from that header's later versions), and by reading images that
``mksquashfs`` 4.5.1 writes (tests/unit/image/test_squashfs.py):

======  ====  ==================  ====================================================================
offset  type  field               meaning
======  ====  ==================  ====================================================================
0       4 B   s_magic             ``hsqs`` (0x73717368 little-endian)
4       u32   inodes              number of inodes
8       u32   mkfs_time           creation time, seconds since the epoch
12      u32   block_size          data block size: a power of two, 4 KiB to 1 MiB
16      u32   fragments           number of fragment entries
20      u16   compression         1 gzip, 2 lzma, 3 lzo, 4 xz, 5 lz4, 6 zstd
22      u16   block_log           log2(block_size)
24      u16   flags               SQUASHFS_NOI, NOD, ... (bits, squashfs_fs.h)
26      u16   no_ids              number of uids/gids in the id table
28      u16   s_major             4
30      u16   s_minor             0
32      u64   root_inode          reference of the root directory's inode
40      u64   bytes_used          bytes of the file system; the file is this long or longer (mksquashfs
                                  pads to 4 KiB), shorter means truncated
48      u64   id_table_start ...  then xattr_id_table, inode_table, directory_table, fragment_table,
                                  lookup_table starts (u64 each, to byte 96)
======  ====  ==================  ====================================================================

The listing check runs ``unsquashfs -l -no-progress FILE PATH...`` (squashfs-tools), which lists the named
paths and their parent directories under ``squashfs-root``; a missing path is simply not listed.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from clustertrain.core.errors import ImageError

MAGIC = b"hsqs"
SUPERBLOCK_SIZE = 96
#: offsets 0..48 of the superblock (the table starts after bytes_used are not read)
_LAYOUT = struct.Struct("<4sIIIIHHHHHHQQ")
COMPRESSORS = {1: "gzip", 2: "lzma", 3: "lzo", 4: "xz", 5: "lz4", 6: "zstd"}
LIST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Superblock:
    """What a squashfs superblock says about its file system."""

    compression: str  # gzip, lzma, lzo, xz, lz4, zstd, or "unknown(<id>)"
    block_size: int
    block_log: int
    inodes: int
    bytes_used: int
    version: tuple[int, int]  # (s_major, s_minor)
    mkfs_time: int
    flags: int


def parse_superblock(data: bytes) -> Superblock | None:
    """The superblock in ``data`` (the first bytes of a file); None when they do not start with ``hsqs``
    or are shorter than a superblock."""
    if len(data) < _LAYOUT.size or data[:4] != MAGIC:
        return None
    (_, inodes, mkfs_time, block_size, _fragments, comp, block_log, flags, _no_ids, major, minor,
     _root, bytes_used) = _LAYOUT.unpack_from(data)
    return Superblock(compression=COMPRESSORS.get(comp, f"unknown({comp})"), block_size=block_size,
                      block_log=block_log, inodes=inodes, bytes_used=bytes_used, version=(major, minor),
                      mkfs_time=mkfs_time, flags=flags)


def read_superblock(path: Path) -> Superblock:
    """The superblock of ``path``; ImageError when the file is missing or is not a squashfs file system."""
    try:
        with open(path, "rb") as f:
            data = f.read(SUPERBLOCK_SIZE)
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file (the Enroot image was not written)") from None
    except IsADirectoryError:
        raise ImageError(f"{path} is a directory, not an Enroot image (.sqsh file)") from None
    except OSError as e:
        raise ImageError(f"{path}: cannot read it ({e.strerror})") from None
    sb = parse_superblock(data)
    if sb is None:
        raise ImageError(f"{path} is not a squashfs file system (no 'hsqs' superblock in its first {SUPERBLOCK_SIZE} "
                         f"bytes; {len(data)} read): not an Enroot image")
    return sb


def superblock_problem(sb: Superblock, size: int) -> str | None:
    """Why a file of ``size`` bytes with superblock ``sb`` is not a complete squashfs 4.0 image; None when it is."""
    if sb.version != (4, 0):
        return (f"squashfs version {sb.version[0]}.{sb.version[1]}, not 4.0 (the only one Enroot and the kernel mount)")
    if not (4096 <= sb.block_size <= 1 << 20) or sb.block_size != 1 << sb.block_log:
        return f"a damaged superblock (block_size {sb.block_size}, block_log {sb.block_log})"
    if sb.bytes_used > size:
        return f"truncated: its superblock says {sb.bytes_used} bytes, the file has {size}"
    return None


def listed_paths(listing: str) -> set[str]:
    """The absolute paths in ``unsquashfs -l`` output (lines ``squashfs-root/<path>``)."""
    out = set()
    for line in listing.splitlines():
        if line.startswith("squashfs-root/"):
            out.add(line[len("squashfs-root"):])
    return out


REBUILD = "rebuild it with `clustertrain image build --force`"


def verify_sqsh(path: Path, must_contain: Iterable[str] = (), *, fix: str = REBUILD) -> Superblock:
    """Check that ``path`` is a complete squashfs 4.0 image holding each of ``must_contain`` (absolute
    paths inside the image, checked with ``unsquashfs`` when it is on PATH). ImageError, one line ending in
    ``fix``, otherwise."""
    path = Path(path)
    sb = read_superblock(path)
    problem = superblock_problem(sb, path.stat().st_size)
    if problem:
        raise ImageError(f"{path} is not a usable Enroot image: {problem}; {fix}")
    wanted = ["/" + p.strip("/") for p in must_contain]
    unsquashfs = shutil.which("unsquashfs")
    if wanted and unsquashfs:
        try:
            res = subprocess.run([unsquashfs, "-l", "-no-progress", str(path), *wanted], capture_output=True,
                                 text=True, timeout=LIST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ImageError(f"unsquashfs -l {path} did not finish in {LIST_TIMEOUT_S:.0f} s") from None
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["no message"])[-1]
            raise ImageError(f"unsquashfs cannot list {path} (exit {res.returncode}: {last}); {fix}")
        missing = [p for p in wanted if p not in listed_paths(res.stdout)]
        if missing:
            raise ImageError(f"{path} does not contain {', '.join(missing)} (unsquashfs -l): jobs need it; check the "
                             "Dockerfile against versions.yaml `interpreter`, then rebuild")
    return sb
