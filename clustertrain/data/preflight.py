"""The data section of ``clustertrain check``: :func:`data_findings` (offline, read-only, fast).

Per model:

``data.tokenizer``   loadable (``byte`` always is); a path that is missing here is an error — unless,
                     in a project with an ``aws:`` section, it lies on one of its shared file systems,
                     which this machine may not mount: then a warning saying the vocabulary was not
                     verified (run the check on the head node, where it is).
``model.vocab``      agrees with the tokenizer (:mod:`clustertrain.data.vocab`): an error otherwise.
``data.source``      ``builtin:`` — present; a prepared prefix — header, sizes and manifest agree and
                     the manifest names this tokenizer (no hashing: that is ``data validate``'s job);
                     raw files/globs — they match files; ``s3://`` — never fetched here: a warning that
                     says what was not verified, unless a staged copy already lies in
                     ``<datasets>/remote-<hash>/`` (the head node after a first ``submit``), whose
                     manifest is then checked like a prepared prefix.
``data.blend``       (either framework) each ``data.blend[k].source`` is checked as ``data.source`` is,
                     with the same tokenizer, under its own field; ``data.source`` is then not read.
size                 when the token count is known: ``seq_len + 1`` tokens for one sample (error), and a
                     warning when ``max_steps x global_batch x seq_len`` (times a blend source's share of
                     the weights) is more than :data:`MAX_EPOCHS` passes over the data.
cluster paths        with an ``aws:`` section the data stage reads ``data.source`` where ``submit`` runs
                     (the head node) and the ranks read the prepared copy from ``<datasets>``: a local
                     source outside the shared file systems is an error (publish it to the data bucket,
                     or put it on a mount); an existing tokenizer outside them is a warning (it must be
                     at the same path where ``submit`` runs); an ``s3://`` source outside the buckets
                     the cluster's IAM policy reads (``aws.buckets``) is a warning.

Identical findings of several models (seven models sharing one source) are reported once, naming the
first model and the count.
"""

from __future__ import annotations

import re

import gzip
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.core.errors import ClusterTrainError
from clustertrain.core.findings import Finding

if TYPE_CHECKING:
    from clustertrain.project import ModelEntry, Project

MAX_EPOCHS = 4
"""Passes over the data beyond which a warning is given: Muennighoff et al. 2023, "Scaling
Data-Constrained Language Models" — up to ~4 epochs are worth about as much as fresh tokens, beyond
that returns fall off fast."""


def data_findings(project: "Project") -> list[Finding]:
    """Findings about every model's data (see the module docstring). Never raises for a user mistake."""
    from clustertrain.core.storage_layout import storage_layout

    layout = storage_layout(project)
    found: list[tuple[str, Finding]] = []
    for entry in project.models:
        found += [(entry.name, f) for f in _model_findings(project, entry, layout.datasets, layout.mounts)]
    return _merge(found)


_URL_RE = re.compile(r"s3://\S+?(?=[`;,)\s]|$)")


def _merge(found: list[tuple[str, Finding]]) -> list[Finding]:
    """One finding per distinct (level, message with the model name and its s3:// URLs taken out): models with the
    same problem are one line naming the first model and how many more; where their URLs differ (each model's own
    unverified dataset), the others' URLs are listed after the first's message."""
    groups: dict[tuple, list[tuple[str, Finding]]] = {}
    for model, f in found:
        key = (f.level, f.path.replace(f"models.{model}.", "models.*."), _URL_RE.sub("*", f.message),
               _URL_RE.sub("*", f.fix.replace(model, "*")))
        groups.setdefault(key, []).append((model, f))
    out = []
    for items in groups.values():
        model, first = items[0]
        if len(items) > 1:
            urls = [u for _, f in items[1:] for u in _URL_RE.findall(f.message) if u not in first.message]
            message = first.message + (f" (the same for {', '.join(dict.fromkeys(urls))})" if urls else "")
            first = Finding(first.level, f"{first.path} (and {len(items) - 1} more model{'s' if len(items) > 2 else ''})",
                            message, first.fix, first.source)
        out.append(first)
    return out


def _model_findings(project: "Project", entry: "ModelEntry", datasets: Path, mounts: tuple[str, ...]) -> list[Finding]:
    from clustertrain.data.vocab import vocab_disagreement

    out: list[Finding] = []
    base = f"models.{entry.name}"
    on_cluster = project.aws is not None
    tok_spec = entry.data.tokenizer
    tokenizer = None  # (identity, vocab_size) when loaded
    tok_path = tok_spec.removeprefix("hf:")
    if tok_spec == "byte" or Path(tok_path).is_file():
        try:
            tokenizer = _tokenizer(tok_spec, *_stamp(tok_path))
        except ClusterTrainError as e:
            out.append(Finding("error", f"{base}.data.tokenizer", str(e).removeprefix("data.tokenizer: "),
                               "give the path of a valid tokenizer.json, or `byte`"))
        if tokenizer and on_cluster and tok_spec != "byte" and _mount(tok_path, mounts) is None:
            out.append(Finding("warning", f"{base}.data.tokenizer",
                               f"{tok_path} is not on a shared file system of the aws: section ({', '.join(mounts) or 'none'}); "
                               "run preparation reads it where `submit` runs (the head node)",
                               "make sure the same file is there at that path, or put it on a shared file system"))
    elif on_cluster and _mount(tok_path, mounts) is not None:
        out.append(Finding("warning", f"{base}.data.tokenizer",
                           f"{tok_path} is not on this machine (it is on the cluster's {_mount(tok_path, mounts)}); "
                           f"model.vocab was not verified against it",
                           "run `clustertrain check` on the head node, where it is verified (submit verifies it too)"))
    else:
        out.append(Finding("error", f"{base}.data.tokenizer", f"{tok_path} does not exist",
                           "give the path of a tokenizer.json (train one with `clustertrain data train-tokenizer`), or `byte`"))
    if tokenizer is not None and (problem := vocab_disagreement(entry, tokenizer[1])) is not None:
        out.append(Finding("error", *problem))
    for field, src, share in _sources(entry):
        tokens, source_findings = _source(project, entry, src, field, tokenizer, datasets, mounts)
        out += source_findings
        if tokens is not None:
            out += _size(entry, src, field, tokens, share)
    return out


def _sources(entry: "ModelEntry") -> list[tuple[str, str, float]]:
    """(field, source, share of the training samples) of ``data.source``, or of each source of ``data.blend``."""
    blend = entry.data.blend
    if not blend:
        return [("data.source", entry.data.source, 1.0)]
    total = sum(b.weight for b in blend)
    return [(f"data.blend[{k}].source", b.source, b.weight / total) for k, b in enumerate(blend)]


def _source(project: "Project", entry: "ModelEntry", src: str, field: str, tokenizer: tuple[str, int] | None,
            datasets: Path, mounts: tuple[str, ...]) -> tuple[int | None, list[Finding]]:
    """(token count when known, findings) for the source ``src`` at ``models.<name>.<field>``."""
    from clustertrain.data.staging import BUILTIN, published_copy_dir

    where = f"models.{entry.name}.{field}"
    on_cluster = project.aws is not None
    if src.startswith("builtin:"):
        if src not in BUILTIN:
            return None, [Finding("error", where, f"unknown built-in corpus {src!r}", f"use one of: {', '.join(BUILTIN)}")]
        return (_builtin_tokens(src) if tokenizer and tokenizer[0] == "byte-v1" else None), []
    if src.startswith("s3://"):
        out = _bucket_findings(project, src, where)
        copy = published_copy_dir(src, datasets)
        idx = sorted(copy.glob("*.idx")) if copy.is_dir() else []
        if len(idx) == 1 and Path(f"{idx[0].with_suffix('')}.manifest.json").is_file():
            tokens, found = _prefix(idx[0].with_suffix(""), tokenizer, where, f"the staged copy of {src}")
            return tokens, out + found
        out.append(Finding("warning", where, f"{src} was not verified: the check makes no network call, so whether it "
                           "exists, which tokenizer made it and how many tokens it holds are checked only when `submit`/`run` "
                           "stages it", "publish it first with `clustertrain data prepare ... --publish "
                           f"{src}`; the first submit fetches and verifies it"))
        return None, out
    local = Path(src)
    if on_cluster and _mount(src, mounts) is None:
        data_bucket = project.storage.data_bucket or (
            f"s3://{project.aws.buckets.data}/datasets" if project.aws.buckets.data else "s3://<aws.buckets.data>/datasets")
        return None, [Finding("error", where, f"{src} is not on a shared file system of the aws: section "
                              f"({', '.join(mounts) or 'none'}); run preparation reads {field} where `submit` runs "
                              "(the head node), and this machine's files are not there",
                              f"publish it: `clustertrain data prepare --input {src} --output-prefix DIR/NAME --tokenizer "
                              f"{entry.data.tokenizer} --publish {data_bucket.rstrip('/')}/NAME/`, then set {field} to "
                              "that URL; or put it on a shared file system")]
    if Path(f"{src}.idx").is_file() or Path(f"{src}.bin").is_file():
        return _prefix(local, tokenizer, where, src)
    from clustertrain.data.inputs import resolve_inputs

    try:
        resolve_inputs(src)
    except ClusterTrainError as e:
        if on_cluster:
            return None, [Finding("warning", where, f"{src} is not on this machine (it is on the cluster's {_mount(src, mounts)}); "
                                  "not verified", "run `clustertrain check` on the head node, where it is verified")]
        return None, [Finding("error", where, str(e).removeprefix("--input "),
                              "give a prepared prefix (P with P.bin and P.idx), .txt/.jsonl[.gz] files or globs, "
                              "an s3:// URL from `data prepare --publish`, or builtin:shakespeare")]
    return None, []  # raw files: the token count is known once they are tokenized


def _prefix(prefix: Path, tokenizer: tuple[str, int] | None, where: str, shown: str) -> tuple[int | None, list[Finding]]:
    """A prepared dataset, checked without reading its data: header, file sizes, manifest, tokenizer identity."""
    from clustertrain.data.indexed import HEADER_SIZE, MAGIC, bin_path, idx_path
    from clustertrain.data.preprocess import read_manifest

    fix = f"re-create it with `clustertrain data prepare`, or run `clustertrain data validate {prefix}` for details"
    ipath, bpath = idx_path(prefix), bin_path(prefix)
    for path in (ipath, bpath):
        if not path.is_file():
            return None, [Finding("error", where, f"{shown}: {path.name} is missing", fix)]
    with open(ipath, "rb") as f:
        head = f.read(HEADER_SIZE)
    if len(head) < HEADER_SIZE or head[:9] != MAGIC:
        return None, [Finding("error", where, f"{shown}: {ipath.name} is not a Megatron index (bad header)", fix)]
    try:
        manifest = read_manifest(prefix)
    except ClusterTrainError as e:
        return None, [Finding("error", where, str(e), fix)]
    if manifest is None:
        return None, [Finding("warning", where, f"{shown}: no {prefix.name}.manifest.json, so its tokenizer and token count "
                              "were not verified", "prepare it with `clustertrain data prepare`, which writes the manifest")]
    out: list[Finding] = []
    sequences = int.from_bytes(head[18:26], "little")
    if manifest.get("sequences") != sequences or (manifest.get("bin") or {}).get("bytes") != bpath.stat().st_size:
        out.append(Finding("error", where, f"{shown}: the files do not match their manifest (changed after prepare)", fix))
    if tokenizer is not None and manifest.get("tokenizer") != tokenizer[0]:
        out.append(Finding("error", where, f"{shown} was made with tokenizer {manifest.get('tokenizer')!r}, but data.tokenizer "
                           f"is {tokenizer[0]!r}", "set data.tokenizer to the tokenizer the dataset was prepared with, or "
                           "prepare it again with this one"))
    tokens = manifest.get("tokens")
    return (int(tokens) if isinstance(tokens, int) else None), out


def _size(entry: "ModelEntry", src: str, field: str, tokens: int, share: float = 1.0) -> list[Finding]:
    need = entry.model.seq_len + 1
    if tokens < need:
        return [Finding("error", f"models.{entry.name}.model.seq_len", f"{entry.model.seq_len} needs {need} tokens per sample "
                        f"but {src} holds {tokens:,}", "lower seq_len or add data")]
    t = entry.training
    trained = t.max_steps * t.global_batch * entry.model.seq_len
    epochs = trained * share / tokens
    if epochs > MAX_EPOCHS:
        reads = (f"training reads {trained:,} tokens (max_steps x global_batch x seq_len)" if share == 1.0 else
                 f"training reads ~{round(trained * share):,} tokens of it ({share:.0%} of the blend's weight x "
                 f"max_steps x global_batch x seq_len)")
        return [Finding("warning", f"models.{entry.name}.{field}", f"{reads}, {epochs:,.0f} passes over the {tokens:,} "
                        f"tokens of {src}; beyond ~{MAX_EPOCHS} passes repeated data is worth little (Muennighoff et al. 2023)",
                        "train on a larger dataset (publish it with `clustertrain data prepare --publish`), or fewer steps"
                        if share == 1.0 else "give it less weight or more data, or train fewer steps")]
    return []


def _bucket_findings(project: "Project", url: str, where: str) -> list[Finding]:
    if project.aws is None:
        return []
    readable = {b for b in (project.aws.buckets.data, project.aws.buckets.checkpoints) if b}
    for field in (project.storage.data_bucket, project.storage.checkpoint_bucket):
        if field and field.startswith("s3://"):
            readable.add(field[5:].split("/", 1)[0])
    bucket = url[5:].split("/", 1)[0]
    if bucket in readable:
        return []
    return [Finding("warning", where, f"bucket {bucket!r} is not one the cluster's IAM policy lets the nodes read "
                    f"({', '.join(sorted(readable)) or 'none: aws.buckets is empty'})",
                    "publish the dataset to the data bucket (aws.buckets.data), or grant read access to this bucket")]


def _mount(path: str, mounts: tuple[str, ...]) -> str | None:
    from clustertrain.core.storage_layout import mount_of

    return mount_of(path, mounts) if mounts else None


def _stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns
    except OSError:
        return 0, 0


@lru_cache(maxsize=32)
def _tokenizer(spec: str, size: int, mtime_ns: int) -> tuple[str, int]:
    """(identity, vocab size) of a tokenizer, loaded once per file version."""
    from clustertrain.data.tokenizers import load_tokenizer

    tok = load_tokenizer(spec)
    return tok.identity, tok.vocab_size


@lru_cache(maxsize=4)
def _builtin_tokens(source: str) -> int:
    """Tokens of a built-in corpus under the byte tokenizer: its UTF-8 bytes plus one eod per document."""
    from clustertrain.data.staging import builtin_corpus

    total = 0
    with gzip.open(builtin_corpus(source), "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                text = json.loads(line).get("text", "")
                n = len(text.encode("utf-8"))
                total += n + (1 if n else 0)
    return total
