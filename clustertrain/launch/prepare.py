"""Prepare a run: resolve its directory, prepare its data, check what can be checked before any
process starts, and write ``run.json`` + ``config.yaml`` (see :mod:`clustertrain.core.run_paths`; ``run.json``'s
format is :class:`clustertrain.core.run_records.RunInfo`, which records the clustertrain version ranks check).

Every check runs before the run directory is touched, so a mistake leaves nothing half-written.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from clustertrain.data import load_tokenizer
from clustertrain.data.sample_index import GPTSamples
from clustertrain.data.vocab import check_vocab
from clustertrain.data.staging import dataset_tokens, stage_sources
from clustertrain.core.errors import ConfigError, DataError
from clustertrain.core.storage_layout import storage_layout
from clustertrain.project import ModelEntry, Project, architecture_fingerprint, dump_project
from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.core.run_records import RunInfo, mark_started, read_run_info, write_record
from clustertrain.core.checkpoint_format import check_ownership

ARCHIVED = ("checkpoints", "metrics.jsonl", "tensorboard", "status.json", "events.jsonl", "timing", "usage.json", "monitor")


@dataclass(frozen=True)
class RunSpec:
    """Everything a backend needs to start the ranks of one model's run."""

    project: Project
    entry: ModelEntry
    paths: RunPaths
    dataset: Path
    resume: bool
    #: (weight, prefix) of every source: ``data.blend``'s, or ``((1.0, dataset),)``
    sources: tuple[tuple[float, Path], ...] = ()

    @property
    def data(self) -> tuple[tuple[float, Path], ...]:
        return self.sources or ((1.0, self.dataset),)


def default_run_dir(project: Project, entry: ModelEntry) -> Path:
    return storage_layout(project).run_dir(entry.name)


def run_dir_for(project: Project, entry: ModelEntry, run_dir: Path | None, several: bool) -> Path:
    if run_dir is None:
        return default_run_dir(project, entry)
    return Path(run_dir).resolve() / entry.name if several else Path(run_dir).resolve()


def prepare_run(project: Project, entry: ModelEntry, run_dir: Path, resume: bool = True, console=None) -> RunSpec:
    paths = RunPaths(Path(run_dir))
    fingerprint = architecture_fingerprint(project, entry)
    tokenizer = load_tokenizer(entry.data.tokenizer)
    problem = check_vocab(entry, tokenizer.vocab_size)
    if problem is not None:
        raise ConfigError(problem)
    previous = read_run_info(paths)
    if resume:
        check_ownership(paths.checkpoints, fingerprint, project.name, entry.name)
    sources = stage_sources(entry.data, storage_layout(project).datasets, console=console, store_options=store_options(project))
    need = entry.model.seq_len + 1
    for (_, dataset), (_, one) in zip(sources, entry.data.sources()):
        have = dataset_tokens(dataset)
        if have < need:
            raise DataError(
                f"models.{entry.name}.model.seq_len={entry.model.seq_len} needs {need} tokens per sample but "
                f"{one.source} gives only {have}; lower seq_len or add data"
            )
    dataset = sources[0][1]
    if entry.framework == "clustertrain":  # Megatron-LM builds its own sample index (rank 0, first start)
        GPTSamples(dataset, entry.model.seq_len, entry.training.seed, split=entry.data.split)  # build the cached index once
    paths.root.mkdir(parents=True, exist_ok=True)
    if not resume:
        archive_previous(paths)
    paths.logs.mkdir(exist_ok=True)
    write_atomic(paths.config, dump_project(project))
    created = previous.created if resume and previous is not None else time.time()
    write_record(paths.run_json, RunInfo(project=project.name, model=entry.name, fingerprint=fingerprint,
                                         dataset=str(dataset), created=created))
    paths.status.unlink(missing_ok=True)  # the run to come writes its own (and COMPLETED when it gets there)
    mark_started(paths)
    return RunSpec(project, entry, paths, dataset, resume, tuple(sources))


def store_options(project: Project):
    from clustertrain.storage import StoreConfig

    return StoreConfig(endpoint_url=project.storage.endpoint_url, region=project.storage.region)


def archive_previous(paths: RunPaths) -> Path | None:
    """--no-resume: move earlier checkpoints and metrics to ``previous/<time>/`` (renames; nothing deleted)."""
    present = [name for name in ARCHIVED if (paths.root / name).exists()]
    if not present:
        return None
    dest = paths.root / "previous" / time.strftime("%Y%m%d-%H%M%S")
    dest.mkdir(parents=True, exist_ok=True)
    for name in present:
        os.replace(paths.root / name, dest / name)
    return dest
