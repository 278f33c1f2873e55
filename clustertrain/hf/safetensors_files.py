"""Safetensors files written tensor by tensor, and Hugging Face's rule for splitting a state dict into them.

The file format (huggingface/safetensors ``README.md`` "Format"; the reader's checks: ``safetensors/src/tensor.rs``
``SafeTensors::read_metadata`` / ``Metadata::validate``)::

    8 bytes      N, little-endian u64: the header's length
    N bytes      a JSON object {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
                 "__metadata__": {"format": "pt"}}, padded with blanks to a multiple of 8 bytes (as safetensors'
                 own ``prepare`` pads it)
    the rest     every tensor's bytes (C order, little-endian), back to back: the offsets, relative to the end of
                 the header, must cover this buffer without a gap and end at the end of the file

Because the header only needs every tensor's dtype and shape, :class:`SafetensorsWriter` writes it first and then
takes the tensors one at a time: a file is written without ever holding more than one of its tensors (the
``safetensors`` library's ``save_file`` takes the whole dict). ``"format": "pt"`` is the metadata transformers'
``save_pretrained`` writes (``modeling_utils.py``, transformers 5.23).

Sharding (:func:`split_shards`): huggingface_hub ``serialization/_base.py`` ``split_state_dict_into_shards_factory``
(what transformers' ``save_pretrained`` calls): tensors in state-dict order fill the current shard until the next one
would pass ``max_shard_size``; a tensor larger than the limit gets a shard of its own, numbered before the shard
being filled (so a shard's tensors are in state-dict order, the shards not always); one shard is
``model.safetensors``, several are ``model-0000K-of-0000N.safetensors`` with ``model.safetensors.index.json``
(``{"metadata": {"total_size": bytes}, "weight_map": {name: file}}``). Sizes such as ``"5GB"`` are decimal
(``parse_size_to_int``: KB = 10**3 ... TB = 10**12). transformers 5.23's ``save_pretrained`` default
``max_shard_size`` is ``"50GB"`` (:data:`HF_MAX_SHARD_SIZE`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import torch

#: transformers 5.23 ``PreTrainedModel.save_pretrained(max_shard_size="50GB")`` (modeling_utils.py)
HF_MAX_SHARD_SIZE = "50GB"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
#: torch dtype name -> safetensors dtype tag (safetensors ``Dtype``)
DTYPE_TAGS = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64", "int64": "I64",
              "int32": "I32", "uint8": "U8"}


def parse_size(size: int | str) -> int:
    """Bytes of ``size``: an int, or digits and a decimal unit (``"50GB"``, ``"200KB"``); ValueError otherwise."""
    if isinstance(size, int):
        if size < 1:
            raise ValueError(f"max shard size {size} must be at least 1 byte")
        return size
    text = size.strip()
    unit = text[-2:].upper()
    try:
        value = float(text[:-2].strip()) if unit in _UNITS else float("nan")
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"max shard size {size!r}: give a positive number with KB, MB, GB or TB (decimal units, as "
                         "transformers' save_pretrained reads them), e.g. 5GB")
    return int(value * _UNITS[unit])


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a safetensors file before its data exists."""

    name: str
    dtype: str  # a torch dtype name: float32, bfloat16 ...
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * _itemsize(self.dtype)


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int64": 8, "int32": 4, "uint8": 1}[dtype]


def split_shards(specs: list[TensorSpec], max_shard_size: int | str) -> list[list[TensorSpec]]:
    """The shards ``save_pretrained`` would make of ``specs`` (in order) with ``max_shard_size`` (module docstring)."""
    limit = parse_size(max_shard_size)
    shards: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if spec.nbytes > limit:
            shards.append([spec])
            continue
        if size + spec.nbytes > limit:
            shards.append(current)
            current, size = [], 0
        current.append(spec)
        size += spec.nbytes
    if current:
        shards.append(current)
    return shards


def shard_names(count: int) -> list[str]:
    """File names of ``count`` shards."""
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{k:05d}-of-{count:05d}.safetensors" for k in range(1, count + 1)]


def index_json(shards: list[list[TensorSpec]]) -> dict | None:
    """``model.safetensors.index.json`` of ``shards`` (None for one shard: ``save_pretrained`` writes no index)."""
    if len(shards) == 1:
        return None
    names = shard_names(len(shards))
    return {"metadata": {"total_size": sum(s.nbytes for shard in shards for s in shard)},
            "weight_map": {s.name: names[k] for k, shard in enumerate(shards) for s in shard}}


class SafetensorsWriter:
    """Writes one safetensors file: the header from ``specs`` at once, then :meth:`write` each tensor in that order."""

    def __init__(self, path: Path, specs: list[TensorSpec], metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.specs = specs
        self._next = 0
        header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
        offset = 0
        for s in specs:
            header[s.name] = {"dtype": DTYPE_TAGS[s.dtype], "shape": list(s.shape),
                              "data_offsets": [offset, offset + s.nbytes]}
            offset += s.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)
        self._file: BinaryIO = open(self.path, "wb")
        self._file.write(struct.pack("<Q", len(raw)) + raw)

    @property
    def done(self) -> bool:
        return self._next == len(self.specs)

    def write(self, name: str, tensor: "torch.Tensor") -> None:
        """Append the next tensor; its name, dtype and shape must be the next spec's (our invariant: an assert)."""
        spec = self.specs[self._next]
        assert (name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)) == \
            (spec.name, spec.dtype, spec.shape), (name, tensor.dtype, tensor.shape, spec)
        import torch

        flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        self._file.write(memoryview(flat.numpy()))
        self._next += 1
        if self.done:
            self.close()

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            import os

            os.fsync(self._file.fileno())
            self._file.close()
