"""The image's pins and the compatibility table they are checked against — two data files, one model each.

``versions.yaml`` (:class:`VersionsFile`, ``version: 1``): every version the training image pins, each with
the source it was read from and that source's date.

* ``base``: the NGC PyTorch image (``image``, ``tag``) and what that release ships (``provides``: CUDA,
  PyTorch, NCCL, Python, Ubuntu... each a :class:`Pin`, read from its release notes).
* ``pins``: what the recipe adds, each a :class:`Pin`. ``provided_by`` names the pin that installs it
  (libfabric and aws-ofi-nccl come with the EFA installer); ``nccl`` here replaces the base's NCCL
  (built from source) — leave it out to keep the base's.
* ``python``: the Python packages clustertrain needs beyond the base (installed into the image's
  clustertrain environment, exact versions).
* ``interpreter``: the image's clustertrain interpreter — the jobs' ``python``.
* ``footprint``: the disk a build takes (:class:`FootprintSizes`: the base compressed and unpacked, the build
  stage, what the image adds; each a :class:`Size` with its source), summed per place by
  :mod:`clustertrain.image.footprint`.

``compat.yaml`` (:class:`CompatTable`, ``version: 1``): what works with what, each entry with its source —
the minimum driver per CUDA major (minor-version compatibility), the host driver of the ParallelCluster
AMI, the CUDA builds of each PyTorch release, the NCCL range each aws-ofi-nccl release was tested with and
the libfabric it needs, what each EFA installer ships, and clustertrain's own minimum PyTorch.

:func:`compat_problems` checks a pin set against the table: one ``(field, message)`` per problem, the field
named as in ``versions.yaml`` (``pins.aws_ofi_nccl``); an unknown version is a problem too (add its row,
with a source, to ``compat.yaml``). :func:`resolved` is the pin set as ``image render`` writes it to
``versions.json``.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from clustertrain.core.errors import ImageError
from clustertrain.core.schema import StrictModel, read_yaml, validate_model

HERE = Path(__file__).parent
DEFAULT_VERSIONS = HERE / "versions.yaml"
DEFAULT_COMPAT = HERE / "compat.yaml"
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _dated(v: str) -> str:
    if not _DATE_RE.match(v):
        raise ValueError(f"date {v!r} must be YYYY-MM-DD")
    return v


#: a source's date, YYYY-MM-DD
SourceDate = Annotated[str, AfterValidator(_dated)]
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


class Pin(StrictModel):
    version: str = Field(description="The version (as its project writes it: 2.32.3-1, v2.5.1, core_v0.16.1...).")
    source: str = Field(min_length=8, description="Where it was read: a URL, or repository@commit:path.")
    date: SourceDate = Field(description="Date of the source (YYYY-MM-DD).")
    provided_by: str | None = Field(None, description="The pin that installs it (e.g. efa_installer); None: installed on its own.")
    note: str = Field("", description="Why this version, in a few words.")

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if not _VERSION_RE.match(v):
            raise ValueError(f"version {v!r} must be letters, digits, '.', '_', '+' or '-' (it goes into shell and URLs)")
        return v



class BaseImage(StrictModel):
    image: str = Field(description="Base image repository, e.g. nvcr.io/nvidia/pytorch.")
    tag: str = Field(description="Base image tag, e.g. 26.02-py3.")
    source: str = Field(min_length=8, description="Release notes of that tag.")
    date: str = Field(description="Date of the release notes (YYYY-MM-DD).")
    provides: dict[str, Pin] = Field(description="What the base ships: cuda, torch, nccl, python, ubuntu, ... (its release notes).")


class Size(StrictModel):
    gb: float = Field(gt=0, description="Size in GB (10^9 bytes), as docker and the NGC catalog report sizes.")
    source: str = Field(min_length=8, description="Where it was read, or how it was estimated.")
    date: SourceDate = Field(description="Date of the source (YYYY-MM-DD).")


class FootprintSizes(StrictModel):
    """What a build of these pins puts on disk (:mod:`clustertrain.image.footprint` adds them up by place)."""

    base_compressed: Size = Field(description="The NGC base as pulled (its compressed layers).")
    base_unpacked: Size = Field(description="The NGC base unpacked (what `docker images` shows).")
    build_stage: Size = Field(description="The build stage beyond the base: compilers, GDRCopy, nccl-tests, NCCL, Megatron-LM.")
    added: Size = Field(description="What the final image adds to the base: EFA userspace, the copied builds, the venv.")


class VersionsFile(StrictModel):
    version: Literal[1] = Field(description="Format version.")
    base: BaseImage
    pins: dict[str, Pin] = Field(description="What the recipe adds: efa_installer, libfabric, aws_ofi_nccl, gdrcopy, nccl_tests, "
                                             "megatron_lm, and optionally nccl (replaces the base's).")
    python: dict[str, Pin] = Field(default_factory=dict, description="Python packages clustertrain needs beyond the base.")
    tracking: dict[str, Pin] = Field(default_factory=dict, description="The experiment trackers' clients (the "
                                     "`clustertrain[tracking]` extra: mlflow-skinny, wandb), installed beside `python:` so "
                                     "that `monitor.trackers` works in the image.")
    interpreter: str = Field("/opt/clustertrain/venv/bin/python", description="The image's clustertrain interpreter (the jobs' python).")
    footprint: FootprintSizes | None = Field(None, description="Disk sizes of a build of these pins (GB). None: the sizes "
                                             "in the versions.yaml shipped with clustertrain.")

    def component(self, name: str) -> Pin | None:
        """The pin of ``name`` in the image: the recipe's own, else the base's."""
        return self.pins.get(name) or self.base.provides.get(name)


class DriverRow(StrictModel):
    driver: str = Field(description="Minimum Linux driver.")
    source: str = Field(min_length=8)


class TorchRow(StrictModel):
    cuda: list[str] = Field(description="CUDA versions (major.minor) of its official builds.")
    source: str = Field(min_length=8)


class PluginRow(StrictModel):
    nccl_min: str = Field(description="Oldest NCCL the release supports.")
    nccl_max: str = Field(description="Newest NCCL the release was tested with (major.minor).")
    libfabric_min: str = Field(description="Oldest libfabric it needs.")
    source: str = Field(min_length=8)


class InstallerRow(StrictModel):
    libfabric: str
    aws_ofi_nccl: str
    source: str = Field(min_length=8)


class CompatTable(StrictModel):
    version: Literal[1]
    cuda_min_driver: dict[str, DriverRow] = Field(description="CUDA major -> minimum driver (minor-version compatibility).")
    cuda_full_driver: dict[str, DriverRow] = Field(default_factory=dict, description="CUDA major.minor -> driver for full use.")
    host_driver: Pin = Field(description="Driver of the ParallelCluster AMI the image runs on.")
    torch: dict[str, TorchRow] = Field(description="PyTorch major.minor -> CUDA versions of its builds.")
    aws_ofi_nccl: dict[str, PluginRow] = Field(description="aws-ofi-nccl version -> NCCL and libfabric it works with.")
    efa_installer: dict[str, InstallerRow] = Field(description="EFA installer version -> what it ships.")
    clustertrain_torch_min: Pin = Field(description="Oldest PyTorch clustertrain's trainer runs on (pyproject.toml).")


@lru_cache(maxsize=8)
def _load(path: Path, mtime: float, kind: str) -> StrictModel:
    raw = read_yaml(path, error=ImageError)
    model = VersionsFile if kind == "versions" else CompatTable
    return validate_model(raw, model, str(path), path=path, error=ImageError)


def load_versions(path: Path | None = None) -> VersionsFile:
    """Read a pins file (default: the one shipped with clustertrain); a mistake is one line naming file:line."""
    path = Path(path or DEFAULT_VERSIONS)
    if not path.is_file():
        raise ImageError(f"{path}: pins file not found (image.versions); copy clustertrain/image/versions.yaml and edit it")
    return _load(path.resolve(), path.stat().st_mtime, "versions")  # type: ignore[return-value]


def load_compat(path: Path | None = None) -> CompatTable:
    path = Path(path or DEFAULT_COMPAT)
    return _load(path.resolve(), path.stat().st_mtime, "compat")  # type: ignore[return-value]


def digest(path: Path | None, megatron: bool) -> str:
    """Eight hex digits of the pins file's bytes and the Megatron choice: the default image tag's suffix."""
    data = Path(path or DEFAULT_VERSIONS).read_bytes() + (b"\0megatron" if megatron else b"")
    return hashlib.sha256(data).hexdigest()[:8]


def vtuple(text: str) -> tuple[int, ...]:
    """The leading dotted number of ``text``: ``v2.32.3-1`` -> (2, 32, 3); ``core_v0.16.1`` -> (0, 16, 1)."""
    m = re.search(r"(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def _cmp(a: str, b: str, n: int | None = None) -> int:
    x, y = vtuple(a)[:n] if n else vtuple(a), vtuple(b)[:n] if n else vtuple(b)
    k = max(len(x), len(y))
    x, y = x + (0,) * (k - len(x)), y + (0,) * (k - len(y))
    return (x > y) - (x < y)


def _where(v: VersionsFile, name: str) -> str:
    return f"pins.{name}" if name in v.pins else f"base.provides.{name}"


def compat_problems(v: VersionsFile, table: CompatTable, megatron: bool = False) -> list[tuple[str, str]]:
    """``(field, message)`` for each pin the table says does not work with the others (module docstring)."""
    out: list[tuple[str, str]] = []
    need = ["cuda", "torch", "nccl", "python", "efa_installer", "libfabric", "aws_ofi_nccl", "gdrcopy", "nccl_tests"]
    if megatron:
        need.append("megatron_lm")
    for name in need:
        if v.component(name) is None:
            where = "base.provides" if name in ("cuda", "torch", "nccl", "python") else "pins"
            out.append((f"{where}.{name}", f"no pin for {name}: every component of the image is pinned, with a source"))
    if out:
        return out
    cuda, torch, nccl = v.component("cuda"), v.component("torch"), v.component("nccl")
    ofi, lf, efa = v.component("aws_ofi_nccl"), v.component("libfabric"), v.component("efa_installer")
    assert cuda and torch and nccl and ofi and lf and efa
    major = str(vtuple(cuda.version)[0]) if vtuple(cuda.version) else "?"
    row = table.cuda_min_driver.get(major)
    if row is None:
        out.append((_where(v, "cuda"), f"CUDA {cuda.version} is not in the compatibility table (compat.yaml cuda_min_driver "
                                        f"knows {', '.join(sorted(table.cuda_min_driver))}): add its minimum driver with a source"))
    elif _cmp(table.host_driver.version, row.driver) < 0:
        out.append((_where(v, "cuda"), f"CUDA {cuda.version} needs driver >= {row.driver}, but the cluster's AMI has "
                                        f"{table.host_driver.version} ({table.host_driver.source}): use an older base"))
    tmm = ".".join(map(str, vtuple(torch.version)[:2]))
    trow = table.torch.get(tmm)
    if "torch" not in v.pins:
        pass  # the base's own build, made for its CUDA
    elif trow is None:
        out.append((_where(v, "torch"), f"PyTorch {torch.version} is not in the compatibility table (compat.yaml torch knows "
                                         f"{', '.join(sorted(table.torch, key=vtuple))}): add the CUDA versions of its builds with a source"))
    elif not any(_cmp(c, cuda.version, 2) == 0 for c in trow.cuda) and not any(
            vtuple(c)[:1] == vtuple(cuda.version)[:1] and _cmp(c, cuda.version, 2) <= 0 for c in trow.cuda):
        out.append((_where(v, "torch"), f"PyTorch {tmm} is built for CUDA {', '.join(trow.cuda)}, none of which runs on the "
                                         f"base's CUDA {cuda.version}: pick a base with CUDA {trow.cuda[0]} or newer"))
    if _cmp(torch.version, table.clustertrain_torch_min.version) < 0:
        out.append((_where(v, "torch"), f"PyTorch {torch.version} is older than clustertrain's trainer needs "
                                         f"(>= {table.clustertrain_torch_min.version}): use a newer base"))
    irow = table.efa_installer.get(efa.version)
    if irow is None:
        out.append(("pins.efa_installer", f"EFA installer {efa.version} is not in the compatibility table (compat.yaml "
                                          f"efa_installer knows {', '.join(sorted(table.efa_installer, key=vtuple))}): "
                                          "add what it ships with a source"))
    else:
        for name, shipped in (("aws_ofi_nccl", irow.aws_ofi_nccl), ("libfabric", irow.libfabric)):
            pin = v.component(name)
            if pin and pin.provided_by == "efa_installer" and _cmp(pin.version, shipped, 3) != 0:
                out.append((f"pins.{name}", f"{name} {pin.version} is pinned as coming from the EFA installer, but "
                                            f"installer {efa.version} ships {shipped} ({irow.source})"))
    prow = table.aws_ofi_nccl.get(".".join(map(str, vtuple(ofi.version)[:3])))
    if prow is None:
        out.append(("pins.aws_ofi_nccl", f"aws-ofi-nccl {ofi.version} is not in the compatibility table (compat.yaml "
                                         f"aws_ofi_nccl knows {', '.join(sorted(table.aws_ofi_nccl, key=vtuple))}): "
                                         "add the NCCL range it was tested with, with a source"))
    else:
        if _cmp(nccl.version, prow.nccl_min) < 0 or _cmp(nccl.version, prow.nccl_max, 2) > 0:
            out.append((_where(v, "nccl"), f"NCCL {nccl.version} is outside what aws-ofi-nccl {ofi.version} was tested with "
                                            f"({prow.nccl_min} to {prow.nccl_max}.x; {prow.source}): pin an NCCL in that range "
                                            "(pins.nccl) or another plugin"))
        if _cmp(lf.version, prow.libfabric_min) < 0:
            out.append((_where(v, "libfabric"), f"libfabric {lf.version} is older than aws-ofi-nccl {ofi.version} needs "
                                                 f"(>= {prow.libfabric_min})"))
    return out


def compat_notes(v: VersionsFile, table: CompatTable) -> list[str]:
    """What works, but not fully: a CUDA newer than the host driver's own (minor-version compatibility)."""
    cuda = v.component("cuda")
    if cuda is None:
        return []
    row = table.cuda_full_driver.get(".".join(map(str, vtuple(cuda.version)[:2])))
    if row is not None and _cmp(table.host_driver.version, row.driver) < 0:
        return [f"CUDA {cuda.version} needs driver {row.driver} for full use; on the AMI's {table.host_driver.version} it runs "
                "through minor-version compatibility (and the image's forward-compatibility package on H100/H200)"]
    return []


def check_versions(v: VersionsFile, table: CompatTable, megatron: bool = False, source: str = "versions.yaml") -> None:
    """Raise :class:`ImageError` with the first problem of :func:`compat_problems` (one line)."""
    problems = compat_problems(v, table, megatron)
    if problems:
        field, message = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ImageError(f"{source}: {field}: {message}{more}")


def resolved(v: VersionsFile, megatron: bool) -> dict[str, dict[str, str | None]]:
    """component -> {version, source, date, provided_by, from}: what the image holds, as ``versions.json`` lists it."""
    out: dict[str, dict[str, str | None]] = {}
    for name, pin in v.base.provides.items():
        if name not in v.pins:
            out[name] = {"version": pin.version, "source": pin.source, "date": pin.date, "from": f"base {v.base.image}:{v.base.tag}"}
    for name, pin in v.pins.items():
        if name == "megatron_lm" and not megatron:
            continue
        out[name] = {"version": pin.version, "source": pin.source, "date": pin.date,
                     "from": pin.provided_by or "recipe"}
    for name, pin in {**v.python, **v.tracking}.items():
        out[f"python:{name}"] = {"version": pin.version, "source": pin.source, "date": pin.date, "from": "recipe (pip)"}
    return out
