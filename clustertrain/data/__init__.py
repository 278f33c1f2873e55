"""Data stage: tokenizers, prepared datasets and the GPT sample index."""

from clustertrain.data.packed import PackedDataset, SampleIndex, open_packed, prepare_packed
from clustertrain.data.tokenizers import ByteTokenizer, Tokenizer, load_tokenizer

__all__ = ["ByteTokenizer", "PackedDataset", "SampleIndex", "Tokenizer", "load_tokenizer", "open_packed", "prepare_packed"]
