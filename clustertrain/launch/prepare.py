"""Prepare a run: resolve its directory, prepare its data, check what can be checked before any
process starts, and write ``run.json`` + ``config.yaml`` (see :mod:`clustertrain.core.run_paths`; ``run.json``'s
format is :class:`clustertrain.core.run_records.RunInfo`, which records the clustertrain version ranks check).

Every check runs before the run directory is touched, so a mistake leaves nothing half-written.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from clustertrain.data import load_tokenizer
from clustertrain.data.vocab import check_vocab
from clustertrain.data.staging import dataset_tokens, is_prepared_prefix, stage_sources, training_samples
from clustertrain.core.errors import ClusterTrainError, ConfigError, DataError
from clustertrain.core.schema import yaml_line
from clustertrain.data.inputs import resolve_inputs
from clustertrain.core.storage_layout import storage_layout
from clustertrain.project import ModelEntry, Project, architecture_fingerprint, dump_project
from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.core.run_records import BlendPrefix, RunInfo, mark_started, read_run_info, write_record
from clustertrain.core.checkpoint_format import check_ownership
from clustertrain.core.run_lease import SlurmState, Taken, probe, squeue_state, take

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
    #: this process's lease on the run directory (:mod:`clustertrain.core.run_lease`): release it when the ranks are
    #: done, or hand it to the Slurm job that carries the run
    lease: Taken | None = None

    @property
    def data(self) -> tuple[tuple[float, Path], ...]:
        return self.sources or ((1.0, self.dataset),)


def default_run_dir(project: Project, entry: ModelEntry) -> Path:
    return storage_layout(project).run_dir(entry.name)


def run_dir_for(project: Project, entry: ModelEntry, run_dir: Path | None, several: bool) -> Path:
    if run_dir is None:
        return default_run_dir(project, entry)
    return Path(run_dir).resolve() / entry.name if several else Path(run_dir).resolve()


def prepare_run(project: Project, entry: ModelEntry, run_dir: Path, resume: bool = True, console=None,
                command: str = "run", slurm_state: SlurmState = squeue_state) -> RunSpec:
    """Check and prepare one model's run; the run directory's lease is taken (:func:`clustertrain.core.run_lease.take`)
    after every check and before anything is written in it: a live writer is one :class:`LeaseHeld` line."""
    paths = RunPaths(Path(run_dir))
    probe(paths, slurm_state)  # a live writer: one line before the checks and the data staging, nothing written
    fingerprint = architecture_fingerprint(project, entry)
    try:
        tokenizer = load_tokenizer(entry.data.tokenizer)
    except ClusterTrainError as e:  # "data.tokenizer: ..." names neither the project file nor the model
        raise type(e)(f"{project_field(project, entry, 'data.tokenizer')}: {str(e).removeprefix('data.tokenizer: ')}") from None
    problem = check_vocab(entry, tokenizer.vocab_size)
    if problem is not None:
        raise ConfigError(problem)
    previous = read_run_info(paths)
    if resume:
        check_ownership(paths.checkpoints, fingerprint, project.name, entry.name)
    check_source_files(project, entry)
    try:  # a Hugging Face directory to continue from: fetched (s3://) and checked before anything is written
        from clustertrain.train.init_from_check import InitFromError, stage_init_from

        stage_init_from(project, entry, tokenizer.vocab_size, store_options(project))
    except InitFromError as e:
        raise ConfigError(f"{project_field(project, entry, e.field)}: {e.message}") from None
    try:
        sources = stage_sources(entry.data, storage_layout(project).datasets, console=console,
                                store_options=store_options(project))
    except DataError as e:  # "data.blend[k].source: ..." names neither the project file nor the model
        field = re.match(r"data\.blend\[\d+\]\.source(?=: )", str(e))
        if field is None:
            raise
        raise DataError(f"{project_field(project, entry, field[0])}{str(e)[field.end():]}") from None
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
        training_samples(sources, entry.data, entry.model.seq_len, entry.training.seed)  # build the cached indices once
    lease = take(paths, command, slurm_state)
    if lease.note and console is not None:
        console.print(lease.note)
    if not resume:
        archive_previous(paths)
    paths.logs.mkdir(exist_ok=True)
    write_atomic(paths.config, dump_project(project))
    created = previous.created if resume and previous is not None else time.time()
    write_record(paths.run_json, RunInfo(project=project.name, model=entry.name, fingerprint=fingerprint,
                                         dataset=str(dataset), created=created,
                                         blend=[BlendPrefix(weight=w, prefix=str(p)) for w, p in sources]
                                         if entry.data.blend else []))
    paths.status.unlink(missing_ok=True)  # the run to come writes its own (and COMPLETED when it gets there)
    mark_started(paths)
    return RunSpec(project, entry, paths, dataset, resume, tuple(sources), lease)


SOURCE_FIX = ("give a prepared prefix (P with P.bin and P.idx), .txt/.jsonl[.gz] files or globs, an s3:// URL from "
              "`data prepare --publish`, or builtin:shakespeare")


def source_fields(entry: ModelEntry) -> list[tuple[str, str]]:
    """(field, source) of ``data.source``, or of each ``data.blend[k].source`` (as ``clustertrain check`` names them)."""
    if entry.data.blend:
        return [(f"data.blend[{k}].source", b.source) for k, b in enumerate(entry.data.blend)]
    return [("data.source", entry.data.source)]


def check_source_files(project: Project, entry: ModelEntry) -> None:
    """A raw source (files or globs) that names no file is a DataError naming the project field, as ``check`` does
    (``p.yaml:7: models.tiny.data.source: corpus.jsonl: no such file ...``), not ``data prepare``'s ``--input``."""
    for field, src in source_fields(entry):
        if src.startswith(("builtin:", "s3://")) or is_prepared_prefix(src):
            continue
        try:
            resolve_inputs(src)
        except DataError as e:
            problem = str(e).removeprefix("--input ").split("; give ")[0]
            raise DataError(f"{project_field(project, entry, field)}: {problem}; {SOURCE_FIX}") from None


def project_field(project: Project, entry: ModelEntry, field: str) -> str:
    """``p.yaml:7: models.tiny.data.source``: the project file, the line of the field (when the file holds it and no
    ``--set`` changed the model's ``data``) and the field (as ``clustertrain check`` names it)."""
    where = f"{project.source}: models.{entry.name}.{field}"
    if project.file is None:
        return where
    index = next(i for i, m in enumerate(project.models) if m.name == entry.name)
    section = field.split(".")[0]
    overridden = any(o.split("=")[0].strip().startswith((f"models.{entry.name}.{section}", f"models.{index}.{section}"))
                     for o in project.overrides)
    loc = ("models", index, *(int(p) if p.isdigit() else p for p in re.findall(r"[A-Za-z_]\w*|\d+", field)))
    line = None if overridden else yaml_line(project.file, loc)
    return f"{project.source}:{line}: models.{entry.name}.{field}" if line else where


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
