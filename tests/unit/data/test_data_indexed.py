"""The .idx/.bin reader and writer against megatron-core's IndexedDatasetBuilder / IndexedDataset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clustertrain.data.indexed import IndexedDataset, IndexedWriter, merge_datasets, token_dtype
from clustertrain.core.errors import DataError


def _documents(seed: int, n_docs: int, vocab: int) -> list[list[np.ndarray]]:
    """Documents of 0-3 sequences of 0-6 tokens: empty documents, empty and single-token sequences."""
    rng = np.random.default_rng(seed)
    docs = [[rng.integers(0, vocab, rng.integers(0, 7)) for _ in range(rng.integers(0, 4))] for _ in range(n_docs)]
    docs[0] = []  # an empty document
    docs[1] = [np.array([vocab - 1])]  # a single-token document
    return docs


def _write_both(tmp_path, megatron, docs, dtype):
    theirs, ours = str(tmp_path / f"m-{np.dtype(dtype).name}"), str(tmp_path / f"c-{np.dtype(dtype).name}")
    builder = megatron.indexed.IndexedDatasetBuilder(theirs + ".bin", dtype=dtype)
    with IndexedWriter(ours, dtype) as writer:
        for doc in docs:
            for seq in doc:
                builder.add_item(torch.from_numpy(np.asarray(seq, dtype=np.int64)))
                writer.add_item(seq)
            builder.end_document()
            writer.end_document()
    builder.finalize(theirs + ".idx")
    return theirs, ours


@pytest.mark.parametrize("dtype,vocab", [(np.uint16, 65499), (np.int32, 200_000), (np.int64, 1 << 40), (np.uint8, 256), (np.int16, 3000)])
def test_files_equal_megatron_and_read_both_ways(tmp_path, megatron, dtype, vocab):
    docs = _documents(1, 300, vocab)
    theirs, ours = _write_both(tmp_path, megatron, docs, dtype)
    for ext in (".bin", ".idx"):
        assert (tmp_path / (ours.rsplit("/", 1)[1] + ext)).read_bytes() == (tmp_path / (theirs.rsplit("/", 1)[1] + ext)).read_bytes()
    we_read_theirs = IndexedDataset(theirs)
    they_read_ours = megatron.indexed.IndexedDataset(ours)
    seqs = [s for d in docs for s in d]
    assert len(we_read_theirs) == len(they_read_ours) == len(seqs)
    assert we_read_theirs.n_documents == len(docs)
    assert we_read_theirs.dtype == np.dtype(dtype)
    for i, seq in enumerate(seqs):
        assert np.array_equal(we_read_theirs[i], seq)
        assert np.array_equal(they_read_ours[i], seq)
    for j, doc in enumerate(docs):
        want = np.concatenate(doc) if doc else np.zeros(0)
        assert np.array_equal(we_read_theirs.document(j), want)


def test_many_documents_stream_in_chunks(tmp_path, megatron, monkeypatch):
    import clustertrain.data.indexed as indexed

    monkeypatch.setattr(indexed, "_CHUNK", 1000)  # force many spill chunks
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 4, 25_000)
    tokens = rng.integers(0, 1000, int(lengths.sum()))
    builder = megatron.indexed.IndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=np.uint16)
    builder.add_document(torch.from_numpy(tokens), lengths.tolist())
    builder.finalize(str(tmp_path / "m.idx"))
    with IndexedWriter(tmp_path / "c", np.uint16) as w:
        w.add_items(tokens, lengths)
        w.end_document()
    assert (tmp_path / "c.idx").read_bytes() == (tmp_path / "m.idx").read_bytes()
    assert (tmp_path / "c.bin").read_bytes() == (tmp_path / "m.bin").read_bytes()


def test_merge_equals_megatron_add_index(tmp_path, megatron):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a_m, a_c = _write_both(tmp_path / "a", megatron, _documents(3, 40, 500), np.uint16)
    b_m, b_c = _write_both(tmp_path / "b", megatron, _documents(4, 70, 500), np.uint16)
    builder = megatron.indexed.IndexedDatasetBuilder(str(tmp_path / "merged-m.bin"), dtype=np.uint16)
    builder.add_index(a_m)
    builder.add_index(b_m)
    builder.finalize(str(tmp_path / "merged-m.idx"))
    merged = merge_datasets([a_c, b_c], tmp_path / "merged-c")
    assert merged.n_documents == 110
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"merged-c{ext}").read_bytes() == (tmp_path / f"merged-m{ext}").read_bytes()


def test_empty_dataset_and_dtype_choice(tmp_path, megatron):
    with IndexedWriter(tmp_path / "e", np.uint16):
        pass
    builder = megatron.indexed.IndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=np.uint16)
    builder.finalize(str(tmp_path / "m.idx"))
    assert (tmp_path / "e.idx").read_bytes() == (tmp_path / "m.idx").read_bytes()
    assert len(IndexedDataset(tmp_path / "e")) == 0
    assert token_dtype(65499) is np.uint16 and token_dtype(65500) is np.int32 and token_dtype(None) is np.int32
    assert megatron.indexed.DType.optimal_dtype(65499) is token_dtype(65499)


def test_abort_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with IndexedWriter(tmp_path / "x", np.uint16) as w:
            w.add_document([1, 2, 3])
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_reader_errors_are_one_line(tmp_path):
    (tmp_path / "bad.idx").write_bytes(b"NOTMAGIC!" + bytes(40))
    (tmp_path / "bad.bin").write_bytes(b"")
    with pytest.raises(DataError, match=r"bad\.idx: bad magic .* at byte 0"):
        IndexedDataset(tmp_path / "bad")
    with pytest.raises(DataError, match="no such index file"):
        IndexedDataset(tmp_path / "missing")
    with pytest.raises(DataError, match="merged dataset's"):
        with IndexedWriter(tmp_path / "a", np.uint16) as w:
            w.add_document([1])
        with IndexedWriter(tmp_path / "b", np.int32) as w:
            w.add_dataset(tmp_path / "a")
