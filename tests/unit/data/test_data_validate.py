"""validate_dataset: each kind of damage gives its own one-line message naming the check and the byte/entry."""

from __future__ import annotations

import struct

import pytest

from clustertrain.data.preprocess import prepare_dataset
from clustertrain.data.validate import validate_dataset
from clustertrain.core.errors import DataError


@pytest.fixture
def dataset(tmp_path, shakespeare_lines):
    src = tmp_path / "s.jsonl"
    src.write_text("\n".join(shakespeare_lines[:30]) + "\n")
    prepare_dataset(src, tmp_path / "d", "byte")
    return tmp_path / "d"


def _patch(path, offset, data: bytes):
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def _only(report, check):
    assert report.problems, "damage went unnoticed"
    assert report.problems[0].startswith(check + ":"), report.problems
    return report.problems[0]


def test_clean_dataset_passes(dataset):
    report = validate_dataset(dataset, full=True)
    assert report.ok, report.problems
    assert (report.documents, report.sequences) == (30, 30) and report.tokens > 1000


def test_wrong_magic(dataset):
    _patch(dataset.with_suffix(".idx"), 0, b"XX")
    assert "bytes 0-8 are b'XXIDIDX" in _only(validate_dataset(dataset), "idx.magic")


def test_wrong_version_and_dtype_code(dataset):
    idx = dataset.with_suffix(".idx")
    _patch(idx, 9, struct.pack("<Q", 2))
    assert "byte 9 holds version 2" in _only(validate_dataset(dataset), "idx.version")
    _patch(idx, 9, struct.pack("<Q", 1))
    _patch(idx, 17, bytes([9]))
    assert "byte 17 holds dtype code 9" in _only(validate_dataset(dataset), "idx.dtype")


@pytest.mark.parametrize("offset,value", [(18, 31), (26, 30)])
def test_corrupted_header_counts(dataset, offset, value):
    _patch(dataset.with_suffix(".idx"), offset, struct.pack("<Q", value))
    msg = _only(validate_dataset(dataset), "idx.counts")
    assert "bytes 18-33" in msg and "but it is" in msg


def test_flipped_byte_in_pointers(dataset):
    s = 30
    entry = 7
    offset = 34 + 4 * s + 8 * entry
    raw = dataset.with_suffix(".idx").read_bytes()
    _patch(dataset.with_suffix(".idx"), offset, bytes([raw[offset] ^ 0x10]))
    msg = _only(validate_dataset(dataset), "idx.pointers")
    assert f"entry {entry} " in msg and f"(byte {offset})" in msg


def test_flipped_byte_in_document_indices(dataset):
    s, entry = 30, 12
    offset = 34 + 12 * s + 8 * entry
    raw = dataset.with_suffix(".idx").read_bytes()
    _patch(dataset.with_suffix(".idx"), offset, bytes([raw[offset] ^ 0x40]))
    msg = _only(validate_dataset(dataset), "idx.documents")
    assert "entry 13" in msg  # the entry after the raised one is now smaller


def test_flipped_length_is_caught_by_pointers(dataset):
    _patch(dataset.with_suffix(".idx"), 34 + 4 * 3, b"\x01")
    assert "entry 4 " in _only(validate_dataset(dataset), "idx.pointers")


def test_truncated_bin(dataset):
    b = dataset.with_suffix(".bin")
    b.write_bytes(b.read_bytes()[:-10])
    msg = _only(validate_dataset(dataset), "bin.size")
    assert "truncated" in msg


def test_token_out_of_vocabulary(dataset):
    _patch(dataset.with_suffix(".bin"), 40, struct.pack("<H", 300))
    report = validate_dataset(dataset)
    assert "token 20 (byte 40) is 300, outside the vocabulary [0, 258)" in _only(report, "bin.tokens")
    assert any("manifest.bin: sha256" in p for p in report.problems)
    assert not any(p.startswith("bin.tokens") for p in validate_dataset(dataset, vocab_size=301).problems)


def test_changed_bin_fails_checksum(dataset):
    _patch(dataset.with_suffix(".bin"), 40, struct.pack("<H", 65))
    assert "differs from the manifest" in _only(validate_dataset(dataset), "manifest.bin")


def test_manifest_from_another_tokenizer(dataset):
    report = validate_dataset(dataset, tokenizer="hf-0123456789abcdef")
    assert "made with tokenizer 'byte-v1', expected 'hf-0123456789abcdef'" in _only(report, "manifest.tokenizer")
    with pytest.raises(DataError, match="manifest.tokenizer"):
        report.raise_for_problems()


def test_missing_files(tmp_path):
    assert "idx.exists" in validate_dataset(tmp_path / "none").problems[0]
