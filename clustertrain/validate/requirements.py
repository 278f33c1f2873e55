"""The requirements table (``requirements.yaml``): its format, the per-instance minimum versions, and
what a node of an instance type must show.

``requirements.yaml`` is DATA (model :class:`RequirementsConfig`, version 2), read by the environment
scans (:mod:`clustertrain.validate.scan`) and the suite's transport and GPU/EFA checks. It holds policy only:

* ``minimums`` / ``sources`` — the minimum version of each component on every instance type, and
  where each figure comes from;
* ``families`` — per instance family (``p5e``) or exact type (``p5e.48xlarge``): ``minimums`` /
  ``sources`` that *raise* a base minimum for that hardware (an entry never lowers one: the effective
  minimum is the higher of the two);
* ``unknown_type`` — the GPU and EFA counts a compute node must show when its instance type is not in
  the instance catalog;
* ``roles`` — per node role, which checks apply and at which level; ``shared_mounts`` /
  ``scratch_mounts`` — where the scans look for mounts.

The GPU and EFA counts of a known instance type are instance facts: they come from the instance
catalog (``clustertrain/plan/instances.yaml``, :mod:`clustertrain.plan.catalog`), not from this table.
:func:`family_entry` gives what a node must show; :func:`minimums_for` gives the effective minimum and
its source per component. A version-1 table (``gpus`` / ``efa_devices`` / ``gpu_name`` under
``families``) is refused with what to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from clustertrain.plan.catalog import read_catalog
from clustertrain.core.schema import StrictModel, load_yaml_model
from clustertrain.validate.probes import parse_version
from clustertrain.validate.results import ValidateError

Role = Literal["head", "compute", "container"]
Level = Literal["required", "recommended", "absent"]
DEFAULT_REQUIREMENTS = Path(__file__).with_name("requirements.yaml")
COMPONENTS = ("cuda_driver", "efa_installer", "cuda", "nccl", "aws_ofi_nccl", "torch")


class MinimumsConfig(StrictModel):
    cuda_driver: str = Field(description="Minimum NVIDIA driver version.")
    efa_installer: str = Field(description="Minimum EFA installer version.")
    cuda: str = Field(description="Minimum CUDA toolkit version in the container.")
    nccl: str = Field(description="Minimum NCCL version in the container.")
    aws_ofi_nccl: str = Field(description="Minimum aws-ofi-nccl plugin version.")
    torch: str = Field(description="Minimum PyTorch version.")


class RaisedMinimumsConfig(StrictModel):
    """Minimums an instance family or type raises (each optional)."""

    cuda_driver: str | None = Field(default=None, description="Minimum NVIDIA driver version for this hardware.")
    efa_installer: str | None = Field(default=None, description="Minimum EFA installer version for this hardware.")
    cuda: str | None = Field(default=None, description="Minimum CUDA toolkit version for this hardware.")
    nccl: str | None = Field(default=None, description="Minimum NCCL version for this hardware.")
    aws_ofi_nccl: str | None = Field(default=None, description="Minimum aws-ofi-nccl version for this hardware.")
    torch: str | None = Field(default=None, description="Minimum PyTorch version for this hardware.")


class FamilyConfig(StrictModel):
    """Minimums an instance family or exact type raises, with their sources."""

    minimums: RaisedMinimumsConfig = Field(default_factory=RaisedMinimumsConfig,
                                           description="Minimum versions this hardware raises above the base.")
    sources: dict[str, str] = Field(default_factory=dict, description="Component -> where its raised minimum comes from.")


class UnknownTypeConfig(StrictModel):
    min_gpus: int = Field(1, ge=0, description="GPUs a compute node of a type not in the instance catalog must have.")
    min_efa_devices: int = Field(1, ge=0, description="EFA devices a compute node of a type not in the instance catalog must have.")


class RequirementsConfig(StrictModel):
    """The requirements table (``requirements.yaml``)."""

    version: int = Field(description="Table format version (2: instance facts live in the instance catalog).")
    minimums: MinimumsConfig = Field(description="Minimum versions on every instance type.")
    sources: dict[str, str] = Field(default_factory=dict, description="Component -> where its base minimum comes from.")
    families: dict[str, FamilyConfig] = Field(default_factory=dict,
                                              description="Per instance family (p5e) or type (p5e.48xlarge): raised minimums.")
    unknown_type: UnknownTypeConfig = Field(default_factory=UnknownTypeConfig,
                                            description="What a compute node must show when its type is not in the instance catalog.")
    shared_mounts: list[str] = Field(description="Shared file system mount points (glob patterns).")
    scratch_mounts: list[str] = Field(description="Node-local scratch mount points (glob patterns).")
    roles: dict[Role, dict[str, Level]] = Field(description="Per role: check name -> level.")

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != 2:
            raise ValueError(f"this clustertrain reads version 2, not {v}; for a version-1 table remove gpus, efa_devices "
                             "and gpu_name from families (the instance catalog holds them) and set version: 2")
        return v


@dataclass(frozen=True)
class NodeExpectation:
    """What a node of an instance type must show: GPU and EFA counts (and the GPU name, warn if different)."""

    gpus: int
    efa_devices: int
    gpu_name: str | None = None


@dataclass(frozen=True)
class Minimum:
    version: str
    source: str


def load_requirements(path: str | Path | None = None) -> RequirementsConfig:
    """The bundled table, or the one at ``path``; a mistake in it is one ValidateError line naming file:line."""
    return load_yaml_model(Path(path) if path else DEFAULT_REQUIREMENTS, RequirementsConfig, error=ValidateError)


def family_entry(req: RequirementsConfig, instance_type: str | None) -> tuple[str, NodeExpectation]:
    """``(key, expectation)``: for a type in the instance catalog its name and the catalog's GPU count, EFA
    interfaces and GPU name; else ``unknown type`` and the table's ``unknown_type`` counts."""
    catalog = read_catalog()
    if not instance_type or instance_type not in catalog.instances:
        return "unknown type", NodeExpectation(req.unknown_type.min_gpus, req.unknown_type.min_efa_devices)
    inst, gpu = catalog.instances[instance_type], catalog.gpu_of(instance_type)
    return instance_type, NodeExpectation(inst.gpus, inst.network.efa_interfaces, gpu.names[0] if gpu else None)


def minimums_for(req: RequirementsConfig, instance_type: str | None) -> dict[str, Minimum]:
    """Per component, the effective minimum on ``instance_type``: the higher of the base and what the type's
    entry (and, for an exact type, its family's) raises it to, with the source of the figure used."""
    keys = [k for k in dict.fromkeys(((instance_type or "").split(".")[0], instance_type)) if k and k in req.families]
    out: dict[str, Minimum] = {}
    for name in COMPONENTS:
        best = Minimum(getattr(req.minimums, name), req.sources.get(name, "requirements.yaml minimums"))
        for key in keys:
            raised = getattr(req.families[key].minimums, name)
            if raised and (parse_version(raised) or ()) > (parse_version(best.version) or ()):
                best = Minimum(raised, req.families[key].sources.get(name, f"requirements.yaml families.{key}"))
        out[name] = best
    return out
