"""Stage a model's training data for a run: turn the project's ``data`` section into a prepared
Megatron indexed dataset prefix (``P.bin`` + ``P.idx`` + ``P.manifest.json``).

``data.source`` is one of
* ``builtin:shakespeare`` — the bundled corpus, tokenized once below ``<storage.root>/datasets/``;
* raw inputs (paths or globs of .txt / .jsonl / .jsonl.gz) — tokenized once, re-used while unchanged;
* a prepared prefix (``/fsx/data/train_data`` with ``.bin``/``.idx`` beside it, e.g. from
  ``clustertrain data prepare`` or Megatron's ``preprocess_data.py``) — validated, used in place.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

from clustertrain.data.indexed import IndexedDataset
from clustertrain.data.preprocess import prepare_dataset, resolve_inputs
from clustertrain.data.tokenizers import load_tokenizer
from clustertrain.data.validate import validate_dataset
from clustertrain.errors import DataError
from clustertrain.project import DataConfig

BUILTIN = {"builtin:shakespeare": "shakespeare.jsonl.gz"}


def builtin_corpus(source: str) -> Path:
    if source not in BUILTIN:
        raise DataError(f"data.source: unknown built-in corpus {source!r}; valid: {', '.join(BUILTIN)}")
    return Path(str(resources.files("clustertrain.data") / "corpus" / BUILTIN[source]))


def is_prepared_prefix(source: str) -> bool:
    return Path(source + ".idx").is_file() and Path(source + ".bin").is_file()


def stage_dataset(cfg: DataConfig, datasets_root: Path, console=None) -> Path:
    """Return the prefix of a prepared dataset for ``cfg``, tokenizing raw inputs once."""
    tokenizer = load_tokenizer(cfg.tokenizer)
    if is_prepared_prefix(cfg.source):
        report = validate_dataset(cfg.source, vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.identity)
        report.raise_for_problems()
        return Path(cfg.source)
    if cfg.source.startswith("builtin:"):
        inputs = [builtin_corpus(cfg.source)]
        stem = cfg.source.removeprefix("builtin:")
    else:
        inputs = resolve_inputs(cfg.source)
        stem = Path(inputs[0]).name.split(".")[0] or "data"
    key = hashlib.sha256(json.dumps(
        {"inputs": [str(Path(p).resolve()) for p in inputs], "tokenizer": tokenizer.identity, "json_key": cfg.json_key},
        sort_keys=True).encode()).hexdigest()[:12]
    prefix = Path(datasets_root) / f"{stem}-{key}" / stem
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prepare_dataset(inputs, prefix, tokenizer, json_key=cfg.json_key, workers=cfg.workers, console=console)
    return prefix


def dataset_tokens(prefix: Path) -> int:
    return int(IndexedDataset(prefix).sequence_lengths.sum())
