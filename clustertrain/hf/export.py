"""``clustertrain export``: a run's checkpoint as a Hugging Face model directory (docs/models.md, "Export to Hugging
Face").

What is written into ``-o DIR``::

    config.json                  hf_config of the run's models[].model (clustertrain.core.hf_format): LlamaForCausalLM
                                 or GPT2LMHeadModel, vocab_size = the checkpoint's embedding rows
    model.safetensors            the weights (--dtype float32, the fp32 master weights, or bfloat16), or, past
      | model-0000K-of-0000N.safetensors + model.safetensors.index.json    --max-shard-size (default: transformers'
                                 save_pretrained default, 50GB; clustertrain.hf.safetensors_files)
    tokenizer.json, tokenizer_config.json, special_tokens_map.json       from data.tokenizer (clustertrain.hf.tokenizer_files)
    generation_config.json       bos/eos (and pad) ids of the tokenizer

Where it comes from: the run directory's ``run.json`` (which model) and ``config.yaml`` (the resolved project the run
trained with: the architecture and the tokenizer), and one complete checkpoint (``--step N``, default the one
``checkpoints/latest`` names; :mod:`clustertrain.core.checkpoint_format`).

Reading the checkpoint: with torch's own DCP reader, a few tensors at a time. The DCP keys of the parameters are
``model_optim.model.<fqn>`` (:mod:`clustertrain.train.checkpoint_state`); each read is a
``torch.distributed.checkpoint.load`` (torch 2.13 ``state_dict_loader.py``, ``no_dist=True``: one process, no process
group) of a dict holding only the wanted tensors, allocated full size: DCP reads just the chunks those keys name and
assembles them whatever layout wrote them (DDP's one copy, FSDP2's and tensor parallelism's shards, every pipeline
stage's own blocks: ``FileSystemReader.read_data``, ``filesystem.py``). The optimizer states, the step and the RNG
streams are never read. A group holds at most ``read_bytes`` of tensors (1 GiB; a larger tensor alone) and each
safetensors file is written tensor by tensor (its header first), so memory stays near one group plus one converted
tensor, whatever the model's size.

Atomic: everything goes to a temporary directory beside ``DIR`` renamed to ``DIR`` at the end; nothing is written
when an input is wrong (one :class:`ClusterTrainError` line). ``--to URL`` then publishes ``DIR`` through the storage
stage (:func:`clustertrain.storage.backup_directory`: sync, checksum manifest ``.clustertrain-manifest.json`` written
last, verify); :func:`clustertrain.storage.restore_directory` fetches it back hash-checked.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.core.checkpoint_format import (check_format, complete_checkpoints, damage, find_latest, read_meta,
                                                 step_dir_name)
from clustertrain.core.errors import ConfigError, RunDirError, StorageError
from clustertrain.core.hf_format import HFTensor, hf_class, hf_config, hf_problems, hf_tensors, to_hf
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import read_resolved_config, read_run_info
from clustertrain.hf.safetensors_files import (HF_MAX_SHARD_SIZE, INDEX_FILE, SafetensorsWriter, TensorSpec,
                                               index_json, parse_size, shard_names, split_shards)
from clustertrain.hf.tokenizer_files import write_tokenizer_files

if TYPE_CHECKING:
    from clustertrain.project import ModelEntry, Project
    from clustertrain.storage import StoreConfig

DTYPES = ("float32", "bfloat16")
#: the DCP key prefix of the model's parameters (clustertrain.train.checkpoint_state: "model_optim" -> "model")
MODEL_KEY = "model_optim.model."
READ_BYTES = 1 << 30


@dataclass
class ExportResult:
    """What :func:`export_checkpoint` wrote."""

    out: Path
    run_dir: Path
    model: str
    step: int
    checkpoint: Path
    hf_class: str
    dtype: str
    files: list[str] = field(default_factory=list)
    shards: int = 1
    total_bytes: int = 0
    url: str | None = None
    notes: list[str] = field(default_factory=list)


def export_checkpoint(target: str | Path, out: str | Path, *, model: str | None = None, step: int | None = None,
                      dtype: str = "float32", max_shard_size: int | str = HF_MAX_SHARD_SIZE, to: str | None = None,
                      store_options: "StoreConfig | None" = None, overrides: list[str] | None = None,
                      read_bytes: int = READ_BYTES) -> ExportResult:
    """Write the Hugging Face directory ``out`` from ``target`` — a run directory, or a project file (``model``: which
    of its models; ``overrides``: its ``--set`` items) — at checkpoint ``step`` (default: the latest complete one);
    then publish it to ``to`` (module docstring). A user mistake is one ClusterTrainError line, nothing written."""
    out = Path(out)
    _check_output(out)
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
    try:
        parse_size(max_shard_size)
    except ValueError as e:
        raise ConfigError(f"--max-shard-size: {e}") from None
    paths = RunPaths(resolve_run_dir(target, model, overrides))
    project, entry, notes = _run_project(paths)
    if to is not None:
        from clustertrain.storage import StoreConfig, open_store

        if store_options is None:
            store_options = StoreConfig(endpoint_url=project.storage.endpoint_url, region=project.storage.region)
        open_store(to, store_options)  # a malformed URL is one line before anything is written
    arch = entry.model
    for field_, problem in hf_problems(arch)[:1]:
        raise ConfigError(f"{paths.config}: models.{entry.name}.{field_}: {problem}")
    checkpoint = pick_checkpoint(paths, step)
    meta = read_meta(checkpoint)
    sources, vocab = _checkpoint_tensors(checkpoint, arch, entry)
    entries = hf_tensors(arch)
    specs = _specs(entries, sources, dtype)
    shards = split_shards(specs, max_shard_size)

    result = ExportResult(out=out, run_dir=paths.root, model=entry.name, step=meta.step, checkpoint=checkpoint,
                          hf_class=hf_class(arch), dtype=dtype, shards=len(shards),
                          total_bytes=sum(s.nbytes for s in specs), notes=notes)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; DIR gets a plain directory's mode
        ids = write_tokenizer_files(entry.data.tokenizer, tmp)
        _write_json(tmp / "config.json", hf_config(arch, vocab, dtype=dtype, bos_token_id=ids.bos, eos_token_id=ids.eos))
        generation = {"bos_token_id": ids.bos, "eos_token_id": ids.eos}
        if ids.pad is not None:
            generation["pad_token_id"] = ids.pad
        _write_json(tmp / "generation_config.json", generation)
        _write_weights(checkpoint, tmp, entries, sources, shards, dtype, read_bytes)
        _check_output(out)  # still empty: another export may have filled it meanwhile
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.files = sorted(p.name for p in out.iterdir())
    if to is not None:
        result.url = publish_export(out, to, store_options)
    return result


# -- inputs ---------------------------------------------------------------------------------------


def _check_output(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"-o {out}: exists and is not an empty directory; export never overwrites: give a new or "
                          "empty directory (or remove it)")


def resolve_run_dir(target: str | Path, model: str | None, overrides: list[str] | None = None) -> Path:
    """The run directory of ``target``: itself when it holds ``run.json`` (``model``, if given, must be its model), or
    the run directory of ``model`` (may be left out when the project has one model) of the project file ``target``,
    from the project's storage layout (as ``clustertrain status``/``report`` find it)."""
    from clustertrain.core.storage_layout import storage_layout
    from clustertrain.project import read_project

    path = Path(target)
    if path.is_dir() and RunPaths(path).run_json.is_file():
        if overrides:
            raise ConfigError(f"--set applies to a project file; {path} is a run directory (its config.yaml is what "
                              "the run used): pass the project file instead")
        info = read_run_info(RunPaths(path))
        if model is not None and info is not None and model != info.model:
            raise ConfigError(f"--model {model}: {path} is the run directory of model {info.model!r}; drop --model or "
                              "pass that model's run directory")
        return path
    if not path.is_file():
        raise RunDirError(f"{path}: neither a run directory (no run.json) nor a project file; pass a run directory "
                          "written by `clustertrain run`/`submit` or the project's YAML file")
    project = read_project(path, overrides or [])
    if model is None:
        if len(project.models) > 1:
            raise ConfigError(f"{path}: the project has {len(project.models)} models; choose one with --model "
                              f"({', '.join(m.name for m in project.models)})")
        model = project.models[0].name
    entry = project.model(model)
    run_dir = storage_layout(project).run_dir(entry.name)
    if not RunPaths(run_dir).run_json.is_file():
        raise RunDirError(f"{run_dir}: no run of model {entry.name!r} here (no run.json); train it first "
                          f"(`clustertrain run {path}`), or pass the run directory it used (--run-dir)")
    return run_dir


def _run_project(paths: RunPaths) -> tuple["Project", "ModelEntry", list[str]]:
    """The resolved project the run trained with (its ``config.yaml``) and the run's model entry."""
    from clustertrain.project import Project

    info = read_run_info(paths)
    if info is None:
        raise RunDirError(f"{paths.root}: no run.json; pass a run directory written by `clustertrain run`/`submit`")
    if not paths.config.is_file():
        raise RunDirError(f"{paths.config}: missing; the run directory is incomplete (it is written by `clustertrain "
                          "run`/`submit`)")
    project, note = read_resolved_config(paths.config, Project, info.clustertrain)
    names = [m.name for m in project.models]
    if info.model not in names:
        raise RunDirError(f"{paths.config}: has no model {info.model!r} (run.json's model; it has {', '.join(names)}); "
                          "the run directory is damaged")
    return project, project.model(info.model), [note] if note else []


def pick_checkpoint(paths: RunPaths, step: int | None) -> Path:
    """The complete checkpoint of ``step`` (default: the latest), checked undamaged and in a format this version
    reads; one RunDirError line otherwise."""
    root = paths.checkpoints
    complete = complete_checkpoints(root)
    if not complete:
        raise RunDirError(f"{paths.root}: has no complete checkpoint (checkpoints/step_*/ with meta.json and "
                          ".metadata); train it first (`clustertrain run`), or pass the run directory that holds them")
    if step is None:
        chosen = find_latest(root)
    else:
        chosen = root / step_dir_name(step)
        if chosen not in complete:
            steps = ", ".join(str(int(p.name.removeprefix("step_"))) for p in complete)
            raise RunDirError(f"--step {step}: {root} has no complete checkpoint of step {step}; it has steps {steps}")
    problem = damage(chosen)
    if problem:
        raise RunDirError(f"{chosen}: {problem}; export another --step (or the checkpoint's backup)")
    check_format(chosen, read_meta(chosen))
    return chosen


def _checkpoint_tensors(checkpoint: Path, arch, entry: "ModelEntry") -> tuple[dict[str, "object"], int]:
    """Each model tensor's DCP metadata (by our name) and the vocabulary (the embedding's rows); the names and shapes
    must be those of ``arch`` (a meta-device model), else one RunDirError line."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    from clustertrain.data.tokenizers import model_vocab
    from clustertrain.train.model import GPT

    stored = FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    tensors = {k.removeprefix(MODEL_KEY): v for k, v in stored.items() if k.startswith(MODEL_KEY)}
    if "tok_emb.weight" not in tensors:
        raise RunDirError(f"{checkpoint}: holds no model parameters ({MODEL_KEY}tok_emb.weight missing); it is not a "
                          "checkpoint of the built-in trainer")
    vocab = int(tensors["tok_emb.weight"].size[0])
    try:
        expected = model_vocab(arch, entry.data.tokenizer)
    except ConfigError as e:
        raise ConfigError(f"models.{entry.name}.{e}") from None
    if vocab != expected:
        raise RunDirError(f"{checkpoint}: its embedding has {vocab} rows, but the run's model and tokenizer give "
                          f"{expected}; the checkpoint belongs to another configuration")
    with torch.device("meta"):
        model = GPT(arch, vocab)
    for name, p in model.state_dict().items():
        have = tensors.get(name)
        if have is None:
            raise RunDirError(f"{checkpoint}: has no tensor {name}, which models.{entry.name}.model has; the "
                              "checkpoint belongs to another architecture")
        if tuple(have.size) != tuple(p.shape):
            raise RunDirError(f"{checkpoint}: {name} is {list(have.size)}, models.{entry.name}.model makes it "
                              f"{list(p.shape)}; the checkpoint belongs to another architecture")
    return tensors, vocab


def _specs(entries: list[HFTensor], sources: dict, dtype: str) -> list[TensorSpec]:
    """Name, dtype and shape of every HF tensor (the conversion run on meta tensors)."""
    import torch

    out = []
    for e in entries:
        meta = {s: torch.empty(tuple(sources[s].size), device="meta") for s in e.sources}
        out.append(TensorSpec(e.name, dtype, tuple(to_hf(e, meta).shape)))
    return out


# -- writing --------------------------------------------------------------------------------------


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _groups(entries: list[HFTensor], sources: dict, read_bytes: int) -> list[list[HFTensor]]:
    """Consecutive HF tensors whose sources together hold at most ``read_bytes`` (a larger one alone)."""
    groups: list[list[HFTensor]] = []
    size = read_bytes + 1
    for e in entries:
        n = sum(sources[s].size.numel() * sources[s].properties.dtype.itemsize for s in e.sources)
        if size + n > read_bytes or not groups:
            groups.append([])
            size = 0
        groups[-1].append(e)
        size += n
    return groups


def read_tensors(checkpoint: Path, names: list[str], sources: dict) -> dict[str, "object"]:
    """The full tensors ``names`` (our parameter names) of the DCP checkpoint, read in one process (module docstring)."""
    import torch
    import torch.distributed.checkpoint as dcp

    state = {MODEL_KEY + n: torch.empty(tuple(sources[n].size), dtype=sources[n].properties.dtype) for n in names}
    with warnings.catch_warnings():  # "torch.distributed is disabled ... assuming ... a single process": we mean it
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(checkpoint)), no_dist=True)
    return {n: state[MODEL_KEY + n] for n in names}


def _write_weights(checkpoint: Path, out: Path, entries: list[HFTensor], sources: dict,
                   shards: list[list[TensorSpec]], dtype: str, read_bytes: int) -> None:
    import torch

    target = getattr(torch, dtype)
    files = shard_names(len(shards))
    # a tensor over the limit is a shard of its own, listed before the shard being filled (huggingface_hub's order),
    # so a shard's file is opened at its first tensor: at most that one and the one being filled are open at once
    shard_of = {spec.name: k for k, shard in enumerate(shards) for spec in shard}
    writers: dict[int, SafetensorsWriter] = {}
    for group in _groups(entries, sources, read_bytes):
        loaded = read_tensors(checkpoint, sorted({s for e in group for s in e.sources}), sources)
        for e in group:
            k = shard_of[e.name]
            if k not in writers:
                writers[k] = SafetensorsWriter(out / files[k], shards[k])
            writers[k].write(e.name, to_hf(e, loaded).to(target))
        del loaded
    assert len(writers) == len(shards) and all(w.done for w in writers.values())
    index = index_json(shards)
    if index is not None:
        _write_json(out / INDEX_FILE, index)


def publish_export(out: Path, url: str, store_options: "StoreConfig | None" = None) -> str:
    """Copy the exported directory ``out`` to ``url`` with a checksum manifest and verify it (the storage stage's
    :func:`backup_directory`, from hard links beside ``out`` so its hash cache stays out of ``out``)."""
    from clustertrain.storage import backup_directory

    with tempfile.TemporaryDirectory(prefix=f".{out.name}.publish-", dir=out.parent) as staging:
        for f in sorted(out.iterdir()):
            os.link(f, Path(staging) / f.name)
        result = backup_directory(staging, url, options=store_options)
    if not result.ok:
        raise StorageError(f"publishing {out} to {url} did not verify; run `clustertrain storage verify {url}`")
    return url
