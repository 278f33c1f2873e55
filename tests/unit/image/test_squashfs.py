"""The .sqsh superblock reader and verifier, on images written by the REAL mksquashfs (squashfs-tools)."""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from clustertrain.core.errors import ImageError
from clustertrain.image.squashfs import listed_paths, parse_superblock, read_superblock, verify_sqsh
from tests.support.fake_tools import INTERPRETER, make_tree, mksquashfs, need_mksquashfs


@pytest.fixture()
def image(tmp_path: Path) -> Path:
    return mksquashfs(make_tree(tmp_path / "tree", (INTERPRETER, "/usr/bin/python3")), tmp_path / "img.sqsh")


def one_line_error(excinfo: pytest.ExceptionInfo[ImageError]) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_a_hand_packed_superblock_reads_each_field_at_its_offset():
    # little-endian, offsets as in squashfs_fs.h: magic 0, inodes 4, mkfs_time 8, block_size 12, fragments 16,
    # compression 20, block_log 22, flags 24, no_ids 26, s_major 28, s_minor 30, root_inode 32, bytes_used 40
    data = bytearray(96)
    data[0:4] = b"hsqs"
    struct.pack_into("<I", data, 4, 7)
    struct.pack_into("<I", data, 8, 1_700_000_000)
    struct.pack_into("<I", data, 12, 1 << 18)
    struct.pack_into("<H", data, 20, 6)
    struct.pack_into("<H", data, 22, 18)
    struct.pack_into("<H", data, 24, 0x00C0)
    struct.pack_into("<HH", data, 28, 4, 0)
    struct.pack_into("<Q", data, 40, 123_456)
    sb = parse_superblock(bytes(data))
    assert sb is not None
    assert (sb.inodes, sb.mkfs_time, sb.block_size, sb.compression, sb.block_log, sb.flags, sb.version, sb.bytes_used) == \
        (7, 1_700_000_000, 1 << 18, "zstd", 18, 0x00C0, (4, 0), 123_456)
    assert parse_superblock(b"hsqs" + bytes(10)) is None and parse_superblock(b"sqsh" + bytes(92)) is None


def test_a_real_mksquashfs_image_has_the_superblock_it_was_made_with(tmp_path: Path):
    mk = need_mksquashfs()
    tree = make_tree(tmp_path / "tree", (INTERPRETER, "/usr/bin/python3"))
    out = tmp_path / "img.sqsh"
    subprocess.run([mk, str(tree), str(out), "-comp", "gzip", "-b", "65536", "-mkfs-time", "1234567890", "-noappend",
                    "-no-progress", "-quiet"], check=True, capture_output=True)
    sb = read_superblock(out)
    # inodes: the root, opt, opt/clustertrain, .../venv, .../bin, python, usr, usr/bin, python3
    assert (sb.compression, sb.block_size, sb.block_log, sb.version, sb.mkfs_time, sb.inodes) == \
        ("gzip", 65536, 16, (4, 0), 1234567890, 9)
    assert 96 < sb.bytes_used <= out.stat().st_size
    assert verify_sqsh(out, must_contain=[INTERPRETER, "/usr/bin/python3"]) == sb


@pytest.mark.parametrize("comp", ["gzip", "lzo", "zstd", "xz"])
def test_the_compressor_is_named(tmp_path: Path, comp: str):
    mk = need_mksquashfs()
    out = tmp_path / "img.sqsh"
    res = subprocess.run([mk, str(make_tree(tmp_path / "tree")), str(out), "-comp", comp, "-noappend", "-no-progress",
                          "-quiet"], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"this mksquashfs has no {comp} compressor: {res.stderr.strip()[:120]}")
    assert read_superblock(out).compression == comp


def test_a_good_image_verifies_with_its_interpreter(image: Path):
    sb = verify_sqsh(image, must_contain=[INTERPRETER])
    assert sb.compression == "lzo" and sb.version == (4, 0)


def test_a_truncated_copy_is_refused(image: Path, tmp_path: Path):
    sb = read_superblock(image)
    cut = tmp_path / "cut.sqsh"
    cut.write_bytes(image.read_bytes()[: sb.bytes_used // 2])
    with pytest.raises(ImageError) as e:
        verify_sqsh(cut)
    msg = one_line_error(e)
    assert str(cut) in msg and f"truncated: its superblock says {sb.bytes_used} bytes, the file has {sb.bytes_used // 2}" in msg


def test_random_bytes_are_not_a_squashfs(tmp_path: Path):
    junk = tmp_path / "junk.sqsh"
    junk.write_bytes(random.Random(15).randbytes(4096))
    with pytest.raises(ImageError) as e:
        verify_sqsh(junk)
    assert "is not a squashfs file system" in one_line_error(e) and str(junk) in str(e.value)


def test_a_missing_file_is_named(tmp_path: Path):
    with pytest.raises(ImageError) as e:
        verify_sqsh(tmp_path / "nope.sqsh")
    assert one_line_error(e) == f"{tmp_path / 'nope.sqsh'}: no such file (the Enroot image was not written)"


def test_another_squashfs_version_is_refused(image: Path, tmp_path: Path):
    old = tmp_path / "old.sqsh"
    data = bytearray(image.read_bytes())
    struct.pack_into("<HH", data, 28, 3, 1)
    old.write_bytes(bytes(data))
    with pytest.raises(ImageError) as e:
        verify_sqsh(old)
    assert "squashfs version 3.1, not 4.0" in one_line_error(e)


def test_an_image_without_the_interpreter_names_the_missing_path(tmp_path: Path):
    img = mksquashfs(make_tree(tmp_path / "tree", ("/usr/bin/python3",)), tmp_path / "img.sqsh")
    if shutil.which("unsquashfs") is None:
        pytest.skip("unsquashfs (squashfs-tools) is not installed")
    with pytest.raises(ImageError) as e:
        verify_sqsh(img, must_contain=[INTERPRETER, "/usr/bin/python3"])
    msg = one_line_error(e)
    assert f"does not contain {INTERPRETER} (unsquashfs -l)" in msg and "/usr/bin/python3" not in msg


def test_without_unsquashfs_on_path_only_the_superblock_is_checked(tmp_path: Path, monkeypatch):
    img = mksquashfs(make_tree(tmp_path / "tree", ("/usr/bin/python3",)), tmp_path / "img.sqsh")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert verify_sqsh(img, must_contain=[INTERPRETER]).version == (4, 0)


def test_listed_paths_strips_unsquashfs_root():
    out = "squashfs-root\nsquashfs-root/opt\nsquashfs-root/opt/a b\nParallel unsquashfs: Using 16 processors\n"
    assert listed_paths(out) == {"/opt", "/opt/a b"}


def test_a_directory_is_not_an_image(tmp_path: Path):
    with pytest.raises(ImageError) as e:
        read_superblock(tmp_path)
    assert one_line_error(e) == f"{tmp_path} is a directory, not an Enroot image (.sqsh file)"
