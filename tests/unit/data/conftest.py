"""Fixtures for the data-stage unit tests: small real corpora and the real megatron-core (a test dependency)."""

from __future__ import annotations

import gzip
import json
import warnings
from importlib import resources
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def megatron():
    """megatron-core's dataset modules (imported once; its import takes seconds and warns about Apex/TE)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    return type("Megatron", (), {"indexed": indexed_dataset, "Builder": BlendedMegatronDatasetBuilder,
                                 "GPTDataset": GPTDataset, "GPTDatasetConfig": GPTDatasetConfig})


@pytest.fixture(scope="session")
def shakespeare_lines() -> list[str]:
    path = Path(str(resources.files("clustertrain.data") / "corpus" / "shakespeare.jsonl.gz"))
    return gzip.open(path, "rt", encoding="utf-8").read().splitlines()


@pytest.fixture
def write_jsonl():
    """write_jsonl(path, texts, key="text") -> path: one JSON object per line."""

    def write(path: Path, texts: list[str], key: str = "text") -> Path:
        path.write_text("".join(json.dumps({key: t}) + "\n" for t in texts), encoding="utf-8")
        return path

    return write
