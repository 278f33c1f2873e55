"""Data stage: tokenizers, Megatron indexed datasets (read/write/merge), preprocessing with
manifests, the GPT sample index, validation, and staging a project's data for a run.

Public API (imported lazily: numpy and tokenizers load only when a name below is first used):
``ByteTokenizer``, ``HFTokenizer``, ``Tokenizer``, ``load_tokenizer``, ``train_tokenizer`` (tokenizers),
``IndexedDataset``, ``IndexedWriter``, ``merge_datasets``, ``token_dtype`` (indexed),
``PreparedDataset``, ``prepare_dataset``, ``read_manifest`` (preprocess), ``resolve_inputs``,
``iter_texts`` (inputs), ``GPTSamples`` (sample_index), ``DatasetReport``, ``validate_dataset`` (validate).
"""

from clustertrain.core.lazy import lazy_exports

_PUBLIC = {
    "IndexedDataset": "clustertrain.data.indexed",
    "IndexedWriter": "clustertrain.data.indexed",
    "merge_datasets": "clustertrain.data.indexed",
    "token_dtype": "clustertrain.data.indexed",
    "iter_texts": "clustertrain.data.inputs",
    "resolve_inputs": "clustertrain.data.inputs",
    "PreparedDataset": "clustertrain.data.preprocess",
    "prepare_dataset": "clustertrain.data.preprocess",
    "read_manifest": "clustertrain.data.preprocess",
    "GPTSamples": "clustertrain.data.sample_index",
    "ByteTokenizer": "clustertrain.data.tokenizers",
    "HFTokenizer": "clustertrain.data.tokenizers",
    "Tokenizer": "clustertrain.data.tokenizers",
    "load_tokenizer": "clustertrain.data.tokenizers",
    "train_tokenizer": "clustertrain.data.tokenizers",
    "DatasetReport": "clustertrain.data.validate",
    "validate_dataset": "clustertrain.data.validate",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _PUBLIC)
