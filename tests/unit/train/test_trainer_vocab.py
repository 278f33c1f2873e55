"""The ranks take the tokenizer's size from the prepared dataset's manifest (no tokenizer file needed on
the nodes) and refuse a model.vocab that disagrees with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clustertrain.data.preprocess import prepare_dataset
from clustertrain.data.vocab import check_vocab
from clustertrain.project import validate_project
from clustertrain.train.feed import dataset_vocab


def entry(tokenizer: str, vocab: int | None):
    arch = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8, **({"vocab": vocab} if vocab else {})}
    return validate_project({"name": "p", "models": [{"name": "m", "model": arch, "data": {"tokenizer": tokenizer},
                                                      "training": {"max_steps": 1, "micro_batch": 1, "global_batch": 2}}]}).models[0]


def test_vocab_from_manifest_without_the_tokenizer_file(tmp_path: Path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "hello"}) + "\n")
    prefix = tmp_path / "ds" / "c"
    prepare_dataset([corpus], prefix, "byte")
    gone = str(tmp_path / "absent" / "tokenizer.json")  # a path only the submit host had
    assert dataset_vocab(str(prefix), entry(gone, 320)) == 258
    assert check_vocab(entry(gone, 32000), 258).startswith("models.m.model.vocab disagrees")
    Path(f"{prefix}.manifest.json").unlink()  # e.g. made by Megatron's preprocess_data.py: load the tokenizer
    assert dataset_vocab(str(prefix), entry("byte", None)) == 258
    with pytest.raises(Exception, match="does not exist"):
        dataset_vocab(str(prefix), entry(gone, 320))
