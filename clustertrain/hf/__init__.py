"""Hugging Face model directories out of (and, through :mod:`clustertrain.core.hf_format`, into) clustertrain runs.

Public API (imported lazily: torch and tokenizers load only when a name below is first used):
``export_checkpoint``, ``ExportResult``, ``publish_export`` (:mod:`clustertrain.hf.export`: ``clustertrain export``).
Modules: ``export`` (a run's DCP checkpoint -> the directory), ``safetensors_files`` (safetensors written tensor by
tensor, Hugging Face's shard rule), ``tokenizer_files`` (the tokenizer files from ``data.tokenizer``).
"""

from clustertrain.core.lazy import lazy_exports

_PUBLIC = {
    "ExportResult": "clustertrain.hf.export",
    "export_checkpoint": "clustertrain.hf.export",
    "publish_export": "clustertrain.hf.export",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _PUBLIC)
