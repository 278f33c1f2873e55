"""Data stage: tokenizers, Megatron indexed datasets (read/write/merge), preprocessing with
manifests, the GPT sample index, validation, and staging a project's data for a run.

Import heavy pieces from their modules; the names below are the public API."""

from clustertrain.data.indexed import IndexedDataset, IndexedWriter, merge_datasets, token_dtype
from clustertrain.data.preprocess import PreparedDataset, prepare_dataset, read_manifest
from clustertrain.data.sample_index import GPTSamples
from clustertrain.data.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer, train_tokenizer
from clustertrain.data.validate import DatasetReport, validate_dataset

__all__ = [
    "ByteTokenizer", "DatasetReport", "GPTSamples", "HFTokenizer", "IndexedDataset", "IndexedWriter", "PreparedDataset",
    "Tokenizer", "load_tokenizer", "merge_datasets", "prepare_dataset", "read_manifest", "token_dtype", "train_tokenizer",
    "validate_dataset",
]
