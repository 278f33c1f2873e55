"""GPTSamples against megatron-core's GPTDataset / BlendedDataset on the same files and seed."""

from __future__ import annotations

import numpy as np
import pytest

from clustertrain.data.preprocess import prepare_dataset
from clustertrain.data.sample_index import GPTSamples, parse_split
from clustertrain.core.errors import DataError


class _Tok:
    """The duck-typed tokenizer GPTDatasetConfig needs (ids only; the byte tokenizer's numbers)."""

    unique_identifiers = {"class": "byte-v1"}
    vocab_size, eod, pad = 258, 256, 257


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, shakespeare_lines):
    root = tmp_path_factory.mktemp("corpora")
    (root / "a.jsonl").write_text("\n".join(shakespeare_lines) + "\n")
    (root / "b.jsonl").write_text("\n".join(shakespeare_lines[:60]) + "\n")
    prepare_dataset(root / "a.jsonl", root / "a", "byte")
    prepare_dataset(root / "b.jsonl", root / "b", "byte")
    return root


def _megatron(megatron, prefixes, weights, split, sizes, seed, seq_len):
    cfg = megatron.GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_len, blend=(prefixes, weights), split=split, tokenizer=_Tok(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False, path_to_cache=None)
    return megatron.Builder(megatron.GPTDataset, sizes, lambda: True, cfg).build()


def _text(mds, i):
    if hasattr(mds, "dataset_index"):  # BlendedDataset
        mds, i = mds.datasets[mds.dataset_index[i]], mds.dataset_sample_index[i]
    return mds._query_document_sample_shuffle_indices(i)[0]


@pytest.mark.parametrize("split,sizes,part,seq_len,seed", [
    ("98,1,1", [None, None, None], "train", 128, 7),  # one epoch
    ("90,5,5", [30000, 300, 300], "train", 100, 3),  # several epochs, separate final epoch
    ("90,5,5", [30000, 300, 300], "valid", 100, 3),
    ("90,5,5", [7000, 300, 300], "test", 33, 11),
])
def test_same_samples_as_megatron_gptdataset(corpora, megatron, tmp_path, split, sizes, part, seq_len, seed):
    k = ("train", "valid", "test").index(part)
    theirs = _megatron(megatron, [str(corpora / "a")], None, split, sizes, seed, seq_len)[k]
    ours = GPTSamples(corpora / "a", seq_len, seed, split, part, num_samples=sizes[k], cache_dir=tmp_path)
    assert len(ours) == len(theirs)
    for i in sorted({0, 1, len(ours) - 1, *range(0, len(ours), max(1, len(ours) // 300))}):
        assert np.array_equal(ours.sample(i), _text(theirs, i)), i


def test_same_blend_as_megatron(corpora, megatron, tmp_path):
    prefixes = [str(corpora / "a"), str(corpora / "b")]
    theirs = _megatron(megatron, prefixes, [0.3, 0.7], "100,0,0", [5000, 0, 0], 5, 64)[0]
    ours = GPTSamples(prefixes, 64, 5, "100,0,0", weights=[0.3, 0.7], num_samples=5000, cache_dir=tmp_path)
    assert len(ours) == len(theirs)
    for i in range(0, len(ours), 7):
        assert np.array_equal(ours.sample(i), _text(theirs, i)), i


def test_any_index_wraps_deterministically_and_cache_is_reused(corpora, tmp_path):
    s = GPTSamples(corpora / "b", 50, seed=1, cache_dir=tmp_path / "c")
    n = len(s)
    files = sorted(p.name for p in (tmp_path / "c").iterdir())
    assert len(files) == 3 and all(f.endswith(".npy") for f in files)  # cycle 0: document, sample, shuffle index
    batch = s.batch(n - 2, 4)
    assert len(list((tmp_path / "c").iterdir())) == 6  # reaching past len built (and cached) cycle 1
    assert batch.dtype == np.int64 and batch.shape == (4, 51)
    assert np.array_equal(batch[0], s.sample(n - 2)) and np.array_equal(batch[3], s.sample(n + 1))
    again = GPTSamples(corpora / "b", 50, seed=1, cache_dir=tmp_path / "c")
    assert np.array_equal(again.batch(n - 2, 4), batch)
    assert not np.array_equal(s.batch(0, 8), s.batch(n, 8)), "the next cycle is a fresh shuffle"
    other = GPTSamples(corpora / "b", 50, seed=2, cache=False)
    assert not np.array_equal(other.batch(0, 8), s.batch(0, 8))
    # every cycle is one epoch of the same tokens, packed differently: the inputs' token multisets
    # differ only by the dropped partial sample at the end (< seq_len tokens)
    first = np.bincount(np.concatenate([s.sample(i)[:-1] for i in range(n)]), minlength=258)
    second = np.bincount(np.concatenate([s.sample(n + i)[:-1] for i in range(n)]), minlength=258)
    assert first.sum() == second.sum() == n * 50 and np.abs(first - second).sum() < 2 * 50


def test_samples_pack_consecutive_tokens(corpora):
    from clustertrain.data.indexed import IndexedDataset

    s = GPTSamples(corpora / "b", 40, seed=3, cache=False)
    stream = np.concatenate([IndexedDataset(corpora / "b")[i] for i in range(60)])
    tokens = sum(len(s.sample(i)) - 1 for i in range(len(s)))
    assert tokens == (len(stream) - 1) // 40 * 40  # drop only the last partial sample
    assert all(len(s.sample(i)) == 41 for i in (0, len(s) - 1))


def test_errors(corpora):
    with pytest.raises(DataError, match="the valid split holds 0 tokens"):
        GPTSamples(corpora / "b", 64, split="1000,1", part="valid")
    with pytest.raises(DataError, match="gives the test part no data"):
        GPTSamples(corpora / "b", 64, split="98,2", part="test")
    with pytest.raises(DataError, match="one positive weight per dataset"):
        GPTSamples([corpora / "a", corpora / "b"], 64, weights=[1.0])
    with pytest.raises(DataError, match="fewer than seq_len"):
        GPTSamples(corpora / "b", 10**7)
    assert parse_split("98,1,1")[1] == pytest.approx((0.98, 0.99))
