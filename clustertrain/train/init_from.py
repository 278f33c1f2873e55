"""``models[].training.init_from``: continue training a Hugging Face model directory (continued pretraining).

Where the directory comes from
    A local path or one on a shared mount (relative paths are relative to the project file), read in place by every
    rank; or an ``s3://`` URL published by ``clustertrain export --to`` (a directory with a storage checksum
    manifest), fetched once by the launcher (``run``/``submit``, before any rank starts; every file hash-checked on
    arrival: :func:`clustertrain.storage.restore_directory`) to ``<datasets>/hf-<hash of the URL>/`` (:func:`local_dir`),
    which the ranks then read — the way a published dataset is staged (:mod:`clustertrain.data.staging`).

What is checked before any rank starts: :mod:`clustertrain.train.init_from_check` (``clustertrain check``'s
``init_from`` section, and run preparation, which refuses with the first problem in one line).

Loading (:func:`load_init_from`, called by :class:`clustertrain.train.trainer.Trainer` when the run has no checkpoint
of its own; a resume always takes the run's checkpoint)
    After the model is built, sharded and materialised in any layout (DDP, FSDP2, tensor parallel, pipeline stages:
    a stage holds only its blocks, under the whole model's names), every rank fills each of its parameters from the
    safetensors files. A tensor copied as it is (every Llama tensor) is read as the rank's own slice only:
    ``safetensors.safe_open(...).get_slice(name)[rows, cols]`` with the local shape and global offset of the DTensor
    shard from torch's ``torch.distributed.tensor._utils.compute_local_shape_and_global_offset`` (pytorch
    ``torch/distributed/tensor/_utils.py``; DCP's ``checkpoint/planner_helpers.py`` uses it for the same purpose), so
    a 640-rank job does not read the whole model 640 times. Tensors that must be transposed or split (GPT-2's ``Conv1D`` weights and fused
    ``c_attn``, :func:`clustertrain.core.hf_format.from_hf`), and shards that are not one contiguous block (FSDP2's
    ``_StridedShard`` over a tensor-parallel dimension), are read whole and distributed as
    :meth:`clustertrain.train.model.GPT.init_weights` does. Values are converted to the parameter's dtype.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain.core.errors import ConfigError
from clustertrain.core.hf_format import hf_class

if TYPE_CHECKING:
    from clustertrain.project import ModelEntry, Project
    from clustertrain.train.config import ArchConfig

FIELD = "training.init_from"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
AGAIN = "download or export the directory again"
#: how a fetched copy's directory starts (``<datasets>/hf-<hash>/``)
COPY_PREFIX = "hf-"



class InitFromError(ConfigError):
    """A problem with ``init_from`` at the field it names (``training.init_from``, ``model.hidden``...): ``problem``
    and ``fix``; ``message`` is both, as the one line says them."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field, self.problem, self.fix = field, problem, fix
        self.message = f"{problem}; {fix}"
        super().__init__(f"{field}: {self.message}")


# -- where the directory is ---------------------------------------------------------------------------


def copy_dir(url: str, datasets_root: Path) -> Path:
    """Where the fetched copy of the published directory ``url`` lives: ``<datasets>/hf-<sha256(url)[:12]>/``."""
    return Path(datasets_root) / f"{COPY_PREFIX}{hashlib.sha256(url.rstrip('/').encode()).hexdigest()[:12]}"


def local_dir(project: "Project", entry: "ModelEntry") -> Path | None:
    """The directory the ranks read for ``entry`` (None without ``init_from``)."""
    src = entry.training.init_from
    if src is None:
        return None
    if src.startswith("s3://"):
        from clustertrain.core.storage_layout import storage_layout

        return copy_dir(src, storage_layout(project).datasets)
    return Path(src)


def fetch(url: str, datasets_root: Path, store_options=None) -> Path:
    """Fetch the published directory ``url`` once (a re-run transfers nothing when the copy is complete); every file
    is checked against the storage manifest's checksum on arrival."""
    from clustertrain.core.errors import ClusterTrainError
    from clustertrain.storage import restore_directory

    local = copy_dir(url, datasets_root)
    try:
        restore_directory(url, local, options=store_options)
    except ClusterTrainError as e:
        raise InitFromError(FIELD, f"{url}: {e}", "a directory is published there with `clustertrain export RUN_DIR "
                                   f"-o DIR --to {url}`") from None
    return local


# -- what the directory holds --------------------------------------------------------------------------


@dataclass(frozen=True)
class HFSource:
    """A Hugging Face model directory as far as the checks need it: its ``config.json`` and, per tensor name, the
    safetensors file that holds it and its shape (from the file headers)."""

    path: Path
    shown: str                      # the directory as the user named it (the URL of a fetched copy)
    config: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)
    shapes: dict[str, list[int]] = field(default_factory=dict)

    @property
    def config_path(self) -> str:
        return f"{self.shown.rstrip('/')}/{CONFIG}"


def read_source(path: Path, shown: str | None = None) -> HFSource:
    """Read ``path``'s ``config.json`` and its weights' headers (no tensor data); one :class:`InitFromError` line for
    a missing or damaged directory, config or weights file."""
    path, shown = Path(path), shown or str(path)
    fix = ("give a directory that transformers' save_pretrained (or `clustertrain export`) wrote; from the Hub: "
           "`huggingface-cli download NAME --local-dir DIR`")
    if not path.is_dir():
        raise InitFromError(FIELD, f"{shown}: no such directory", fix)
    try:
        config = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InitFromError(FIELD, f"{shown}: no {CONFIG}", fix) from None
    except (OSError, ValueError) as e:
        raise InitFromError(FIELD, f"{shown}/{CONFIG} is not valid JSON ({e})", fix) from None
    if not isinstance(config, dict):
        raise InitFromError(FIELD, f"{shown}/{CONFIG} is not a JSON object", fix)
    if (path / INDEX).is_file():
        try:
            weight_map = json.loads((path / INDEX).read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InitFromError(FIELD, f"{shown}/{INDEX} is not a safetensors index ({e})", fix) from None
        by_file = {name: path / file for name, file in weight_map.items()}
    elif (path / WEIGHTS).is_file():
        by_file = None
    else:
        other = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pth"))
        note = f" (it has {', '.join(other[:2])}: convert it to safetensors, e.g. save_pretrained(DIR))" if other else ""
        raise InitFromError(FIELD, f"{shown}: no {WEIGHTS} or {INDEX}{note}", fix)
    shapes: dict[str, list[int]] = {}
    files: dict[str, Path] = {}
    for file in sorted(set(by_file.values())) if by_file is not None else [path / WEIGHTS]:
        for name, shape in _header(file, shown).items():
            if by_file is None or by_file.get(name) == file:
                shapes[name], files[name] = shape, file
    return HFSource(path, shown, config, files, shapes)


def _header(file: Path, shown: str) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors file's header (``safe_open`` reads the header only)."""
    from safetensors import safe_open

    where = f"{shown.rstrip('/')}/{file.name}"
    if not file.is_file():
        raise InitFromError(FIELD, f"{where}: missing (the index names it)", AGAIN)
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # safetensors raises its own SafetensorError (an Exception) for a damaged file
        raise InitFromError(FIELD, f"{where} is not a safetensors file ({str(e).splitlines()[0]})", AGAIN) from None


# -- the ranks ----------------------------------------------------------------------------------------------


def load_init_from(model, project: "Project", entry: "ModelEntry", total_params: int) -> str:
    """Fill ``model``'s parameters (this rank's shards of them) from ``entry``'s ``init_from`` directory; returns
    the start line (``weights: init_from DIR (LlamaForCausalLM, 135M params)``)."""
    path = local_dir(project, entry)
    assert path is not None, "load_init_from without training.init_from"
    source = read_source(path, entry.training.init_from)
    copied = load_weights(model, entry.model, source)
    size = f"{total_params / 1e9:.2f}B" if total_params >= 1e9 else f"{total_params / 1e6:.0f}M" \
        if total_params >= 1e6 else f"{total_params:,}"
    copy = "" if str(path) == source.shown else f"; local copy {path}"
    return f"weights: init_from {source.shown} ({hf_class(entry.model)}, {size} params, {copied} tensors{copy})"


def load_weights(model, arch: "ArchConfig", source: HFSource) -> int:
    """Copy the HF tensors into every parameter of ``model`` (a GPT or a pipeline stage of one, plain or DTensor
    shards); returns how many parameters were filled."""
    from contextlib import ExitStack

    import torch
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from clustertrain.core.hf_format import from_hf, source_index
    from clustertrain.train.model import clean_fqn, copy_shard

    index = source_index(arch)
    with ExitStack() as stack, torch.no_grad():
        opened: dict[Path, Any] = {}

        def handle(hf_name: str):
            file = source.files.get(hf_name)
            if file is None:
                raise InitFromError(FIELD, f"{source.shown}: the weights have no tensor {hf_name}", AGAIN)
            if file not in opened:
                opened[file] = stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
            return opened[file]

        count = 0
        for name, p in model.named_parameters():
            name = clean_fqn(name)
            entry = index["tok_emb.weight" if name == "head.weight" and arch.tie_embeddings else name]
            local = p.to_local() if isinstance(p, DTensor) else p
            plain = not isinstance(p, DTensor) or all(type(x) in (Shard, Replicate) for x in p.placements)
            if entry.op == "copy" and plain:
                shape, offset = (compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
                                 if isinstance(p, DTensor) else (tuple(p.shape), (0,) * p.dim()))
                hf = handle(entry.name).get_slice(entry.name)
                _check_shape(name, list(hf.get_shape()), list(p.shape), source, rows_at_least=name == "pos_emb.weight")
                if tuple(local.shape) != tuple(shape):
                    raise AssertionError(f"{name}: local shard {tuple(local.shape)} but torch computes {shape}")
                if local.numel():
                    local.copy_(hf[tuple(slice(o, o + s) for o, s in zip(offset, shape))].to(local.dtype))
            else:
                full = from_hf(arch, name, lambda n: handle(n).get_tensor(n), index)
                _check_shape(name, list(full.shape), list(p.shape), source)
                copy_shard(p, full.to(device=local.device, dtype=local.dtype))
            count += 1
    return count


def _check_shape(name: str, hf: list[int], ours: list[int], source: HFSource, rows_at_least: bool = False) -> None:
    ok = hf[1:] == ours[1:] and hf[0] >= ours[0] if rows_at_least else hf == ours
    if not ok:
        raise InitFromError(FIELD, f"{source.shown}: {name} is {hf} there but {ours} in models[].model",
                            "run `clustertrain check` (config.json disagrees with the weights?)")

