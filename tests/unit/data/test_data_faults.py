"""A dataset damaged under a reader (fault drill 4 of issue 18): a ``.bin`` truncated after it was opened, one
shorter than its index, token ids outside the vocabulary — each one DataError line naming the file, never a
SIGBUS or an index past the embedding. (A real training run whose .bin is truncated mid-run:
tests/integration/train/test_fault_drills_storage.py.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

from clustertrain.data.indexed import IndexedDataset
from clustertrain.data.preprocess import prepare_dataset
from clustertrain.data.sample_index import GPTSamples
from clustertrain.core.errors import DataError


@pytest.fixture
def datasets(tmp_path, shakespeare_lines, write_jsonl):
    """Two small byte-tokenized datasets, ``a`` and ``b``."""
    for name, lines in (("a", shakespeare_lines[:80]), ("b", shakespeare_lines[80:160])):
        prepare_dataset(write_jsonl(tmp_path / f"{name}.jsonl", lines), tmp_path / name, "byte")
    return tmp_path / "a", tmp_path / "b"


def test_bin_truncated_after_open_is_one_line_not_sigbus(datasets):
    a, _ = datasets
    samples = GPTSamples(a, 64, seed=1, cache=False)
    before = samples.batch(0, 16)
    size = os.path.getsize(f"{a}.bin")
    os.truncate(f"{a}.bin", 4096)  # the memory map would now SIGBUS on any page past 4 KiB
    with pytest.raises(DataError) as err:
        for start in range(0, len(samples), 16):  # some sample lies past the new end
            samples.batch(start, 16)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{a}.bin: 4096 bytes now, {size} when training opened it")
    assert "truncated or overwritten under the running job" in text and "resume from the last checkpoint" in text
    assert before.shape == (16, 65)


def test_bin_shorter_than_its_index_is_refused_at_open(datasets):
    a, _ = datasets
    size = os.path.getsize(f"{a}.bin")
    os.truncate(f"{a}.bin", size - 2)
    with pytest.raises(DataError, match=rf"^{a}\.bin: {size - 2} bytes but {a}\.idx points at {size}; the data file "
                       "is truncated, re-create the dataset$"):
        IndexedDataset(a)


def test_token_ids_outside_the_vocabulary_name_the_file_and_sample(datasets):
    a, b = datasets
    tokens = np.memmap(f"{b}.bin", dtype="<u2", mode="r+")
    tokens[:] = 300  # every id past the byte tokenizer's 258 (garbage of the right size)
    tokens.flush()
    del tokens
    blend = GPTSamples([a, b], 32, seed=3, weights=[0.5, 0.5], num_samples=200, cache=False, vocab_size=258)
    first_b = next(i for i in range(200) if blend._locate(i)[0].ds.prefix == str(b))
    assert blend.batch(0, first_b).shape == (first_b, 33)  # samples of `a` alone pass the check
    with pytest.raises(DataError) as err:
        blend.batch(0, first_b + 1)
    assert str(err.value) == (
        f"{b}.bin: sample {first_b} holds token id 300, outside the tokenizer's vocabulary [0, 258): the file is "
        f"corrupt or was prepared with another tokenizer; find it with `clustertrain data validate {b} --full`, "
        "prepare it again, then run the same command to resume from the last checkpoint")
    unchecked = GPTSamples([a, b], 32, seed=3, weights=[0.5, 0.5], num_samples=200, cache=False)
    assert unchecked.batch(first_b, 1).max() == 300  # without a vocabulary nothing is checked
