"""Stage a model's training data for a run: turn the project's ``data`` section into a prepared
Megatron indexed dataset prefix (``P.bin`` + ``P.idx`` + ``P.manifest.json``).

``data.source`` is one of
* ``builtin:shakespeare`` — the bundled corpus, tokenized once below ``<storage.root>/datasets/``;
* raw inputs (paths or globs of .txt / .jsonl / .jsonl.gz) — tokenized once, re-used while unchanged;
* a prepared prefix (``/fsx/data/train_data`` with ``.bin``/``.idx`` beside it, e.g. from
  ``clustertrain data prepare`` or Megatron's ``preprocess_data.py``) — validated, used in place;
* ``s3://bucket/path/`` — a dataset published by ``clustertrain data prepare --publish`` (one
  prefix's ``.bin``/``.idx``/``.manifest.json`` with a storage manifest): fetched once, checksum-verified,
  to ``<storage.root>/datasets/remote-<hash>/``, then validated like a prepared prefix.

Publishing copies exactly one prefix's three files (hard links in a staging directory, then a
checksum-manifest sync), so a directory shared with other files is never uploaded by accident.
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
from clustertrain.core.errors import DataError
from clustertrain.data.config import DataConfig

BUILTIN = {"builtin:shakespeare": "shakespeare.jsonl.gz"}


def builtin_corpus(source: str) -> Path:
    if source not in BUILTIN:
        raise DataError(f"data.source: unknown built-in corpus {source!r}; valid: {', '.join(BUILTIN)}")
    return Path(str(resources.files("clustertrain.data") / "corpus" / BUILTIN[source]))


def is_prepared_prefix(source: str) -> bool:
    return Path(source + ".idx").is_file() and Path(source + ".bin").is_file()


def stage_dataset(cfg: DataConfig, datasets_root: Path, console=None, store_options=None) -> Path:
    """Return the prefix of a prepared dataset for ``cfg``, tokenizing raw inputs (or fetching a published one) once."""
    tokenizer = load_tokenizer(cfg.tokenizer)
    if cfg.source.startswith("s3://"):
        prefix = fetch_published(cfg.source, Path(datasets_root), store_options)
        validate_dataset(prefix, vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.identity).raise_for_problems()
        return prefix
    if is_prepared_prefix(cfg.source):
        report = validate_dataset(cfg.source, vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.identity)
        report.raise_for_problems()
        return Path(cfg.source)
    inputs, stem = _raw_inputs(cfg)
    prefix = Path(datasets_root) / f"{stem}-{_inputs_key(inputs, tokenizer, cfg)}" / stem
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prepare_dataset(inputs, prefix, tokenizer, json_key=cfg.json_key, workers=cfg.workers, console=console)
    return prefix


def stage_sources(cfg: DataConfig, datasets_root: Path, console=None, store_options=None) -> list[tuple[float, Path]]:
    """(weight, prefix) of every source of ``cfg`` (:meth:`DataConfig.sources`: a blend, or ``source`` alone), each
    staged by :func:`stage_dataset` with the one ``data.tokenizer``. A blend source that cannot be staged (e.g. a
    prepared prefix or published dataset made with another tokenizer) is one :class:`DataError` line starting
    ``data.blend[k].source: ``; prepared prefixes are validated before any other source is tokenized or fetched,
    so such a mistake writes nothing."""
    if not cfg.blend:
        return [(1.0, stage_dataset(cfg, datasets_root, console=console, store_options=store_options))]
    sources = cfg.sources()
    staged: dict[int, Path] = {}
    cheap_first = sorted(range(len(sources)), key=lambda k: not is_prepared_prefix(sources[k][1].source))
    for k in cheap_first:
        try:
            staged[k] = stage_dataset(sources[k][1], datasets_root, console=console, store_options=store_options)
        except DataError as e:
            raise DataError(f"data.blend[{k}].source: {str(e).removeprefix('data.source: ')}") from None
    return [(weight, staged[k]) for k, (weight, _) in enumerate(sources)]


def training_samples(sources, cfg: DataConfig, seq_len: int, seed: int, vocab_size: int | None = None):
    """The training samples of a run over its staged ``sources`` ((weight, prefix), :func:`stage_sources`):
    :class:`~clustertrain.data.sample_index.GPTSamples` of ``cfg.split``'s train part, the sources mixed by weight
    with Megatron's greedy rule. ``num_samples`` is left unset, so sample ``i`` depends on the files, weights, seed
    and ``seq_len`` but not on ``max_steps`` (a run resumed with more steps reads the same samples first); one source
    is read alone, its weight ignored. Run preparation (which builds the cached indices) and every rank call this."""
    from clustertrain.data.sample_index import GPTSamples

    sources = list(sources)
    weights = [float(w) for w, _ in sources] if len(sources) > 1 else None
    return GPTSamples([str(p) for _, p in sources], seq_len, seed, split=cfg.split, weights=weights,
                      vocab_size=vocab_size)


def expected_prefix(cfg: DataConfig, datasets_root: Path) -> Path:
    """Where :func:`stage_dataset` will put (or finds) the prefix of ``cfg``, without preparing or fetching
    anything (``submit --dry-run``). A published dataset's file name is known only once fetched: its directory
    name stands in for it (``s3://b/datasets/web-32k/`` -> ``.../remote-<hash>/web-32k``)."""
    if cfg.source.startswith("s3://"):
        local = published_copy_dir(cfg.source, Path(datasets_root))
        found = sorted(local.glob("*.idx"))
        if len(found) == 1:
            return found[0].with_suffix("")
        return local / (cfg.source.rstrip("/").rsplit("/", 1)[-1] or "data")
    if is_prepared_prefix(cfg.source):
        return Path(cfg.source)
    tokenizer = load_tokenizer(cfg.tokenizer)
    inputs, stem = _raw_inputs(cfg)
    return Path(datasets_root) / f"{stem}-{_inputs_key(inputs, tokenizer, cfg)}" / stem


def _raw_inputs(cfg: DataConfig) -> tuple[list, str]:
    """The files a raw (or built-in) source names, and the stem of its prefix."""
    if cfg.source.startswith("builtin:"):
        return [builtin_corpus(cfg.source)], cfg.source.removeprefix("builtin:")
    inputs = resolve_inputs(cfg.source)
    return inputs, Path(inputs[0]).name.split(".")[0] or "data"


def _inputs_key(inputs, tokenizer, cfg: DataConfig) -> str:
    return hashlib.sha256(json.dumps(
        {"inputs": [str(Path(p).resolve()) for p in inputs], "tokenizer": tokenizer.identity, "json_key": cfg.json_key},
        sort_keys=True).encode()).hexdigest()[:12]


def dataset_tokens(prefix: Path) -> int:
    return int(IndexedDataset(prefix).sequence_lengths.sum())


DATASET_FILES = (".bin", ".idx", ".manifest.json")


def publish_dataset(prefix: Path, url: str, store_options=None) -> str:
    """Copy one prepared prefix (``.bin``, ``.idx``, ``.manifest.json``) to ``url`` and verify it."""
    import os
    import tempfile

    from clustertrain.storage import backup_directory

    prefix = Path(prefix)
    files = [Path(f"{prefix}{ext}") for ext in DATASET_FILES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise DataError(f"{prefix}: not a prepared dataset ({', '.join(missing)} missing); run `clustertrain data prepare` first")
    with tempfile.TemporaryDirectory(prefix=".publish-", dir=prefix.parent) as staging:
        for f in files:
            os.link(f, Path(staging) / f.name)
        result = backup_directory(staging, url, options=store_options)
    if not result.ok:
        raise DataError(f"publishing {prefix} to {url} did not verify; run `clustertrain storage verify {url}`")
    return url


def published_copy_dir(url: str, datasets_root: Path) -> Path:
    """Where :func:`fetch_published` keeps the local copy of ``url``: ``<datasets>/remote-<hash of url>/``."""
    return Path(datasets_root) / f"remote-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


def fetch_published(url: str, datasets_root: Path, store_options=None) -> Path:
    """Fetch a published dataset once (a re-run transfers nothing when the copy is complete)."""
    from clustertrain.storage import restore_directory

    local = published_copy_dir(url, datasets_root)
    restore_directory(url, local, options=store_options)
    idx = sorted(local.glob("*.idx"))
    if len(idx) != 1:
        raise DataError(f"data.source {url}: expected one published dataset (one .idx), found {len(idx)}; "
                        "publish with `clustertrain data prepare --publish URL`")
    return idx[0].with_suffix("")
