"""The requirements table (``requirements.yaml``): its format, and the per-instance minimum versions.

``requirements.yaml`` is DATA (model :class:`RequirementsConfig`), read by the environment scans
(:mod:`clustertrain.validate.scan`) and the suite's transport check (:mod:`clustertrain.validate.transport`):

* ``minimums`` / ``sources`` — the minimum version of each component on every instance type, and
  where each figure comes from;
* ``families`` — per instance family (``p5e``) or exact type (``p5e.48xlarge``): GPU and EFA counts,
  the GPU name, and ``minimums`` / ``sources`` that *raise* a base minimum for that hardware (an entry
  never lowers one: the effective minimum is the higher of the two);
* ``roles`` — per node role, which checks apply and at which level; ``shared_mounts`` /
  ``scratch_mounts`` — where the scans look for mounts.

An instance type is looked up exact type first, then its family, then ``default``
(:func:`family_entry`); :func:`minimums_for` gives the effective minimum and its source per component.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clustertrain.validate.probes import parse_version
from clustertrain.validate.results import ValidateError

Role = Literal["head", "compute", "container"]
Level = Literal["required", "recommended", "absent"]
DEFAULT_REQUIREMENTS = Path(__file__).with_name("requirements.yaml")
COMPONENTS = ("cuda_driver", "efa_installer", "cuda", "nccl", "aws_ofi_nccl", "torch")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MinimumsConfig(_Strict):
    cuda_driver: str = Field(description="Minimum NVIDIA driver version.")
    efa_installer: str = Field(description="Minimum EFA installer version.")
    cuda: str = Field(description="Minimum CUDA toolkit version in the container.")
    nccl: str = Field(description="Minimum NCCL version in the container.")
    aws_ofi_nccl: str = Field(description="Minimum aws-ofi-nccl plugin version.")
    torch: str = Field(description="Minimum PyTorch version.")


class RaisedMinimumsConfig(_Strict):
    """Minimums an instance family or type raises (each optional)."""

    cuda_driver: str | None = Field(default=None, description="Minimum NVIDIA driver version for this hardware.")
    efa_installer: str | None = Field(default=None, description="Minimum EFA installer version for this hardware.")
    cuda: str | None = Field(default=None, description="Minimum CUDA toolkit version for this hardware.")
    nccl: str | None = Field(default=None, description="Minimum NCCL version for this hardware.")
    aws_ofi_nccl: str | None = Field(default=None, description="Minimum aws-ofi-nccl version for this hardware.")
    torch: str | None = Field(default=None, description="Minimum PyTorch version for this hardware.")


class FamilyConfig(_Strict):
    gpus: int = Field(ge=0, description="GPUs a node of this family must have.")
    efa_devices: int = Field(ge=0, description="EFA devices a node of this family must have.")
    gpu_name: str | None = Field(default=None, description="Substring expected in the GPU name (warn if different).")
    minimums: RaisedMinimumsConfig = Field(default_factory=RaisedMinimumsConfig,
                                           description="Minimum versions this hardware raises above the base.")
    sources: dict[str, str] = Field(default_factory=dict, description="Component -> where its raised minimum comes from.")


class RequirementsConfig(_Strict):
    """The requirements table (``requirements.yaml``)."""

    version: int = Field(description="Table format version (1).")
    minimums: MinimumsConfig = Field(description="Minimum versions on every instance type.")
    sources: dict[str, str] = Field(default_factory=dict, description="Component -> where its base minimum comes from.")
    families: dict[str, FamilyConfig] = Field(description="Per instance family (p5e) or type (p5e.48xlarge); 'default'.")
    shared_mounts: list[str] = Field(description="Shared file system mount points (glob patterns).")
    scratch_mounts: list[str] = Field(description="Node-local scratch mount points (glob patterns).")
    roles: dict[Role, dict[str, Level]] = Field(description="Per role: check name -> level.")


@dataclass(frozen=True)
class Minimum:
    version: str
    source: str


def load_requirements(path: str | Path | None = None) -> RequirementsConfig:
    p = Path(path) if path else DEFAULT_REQUIREMENTS
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ValidateError(f"{p}: cannot read requirements table ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ValidateError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    try:
        return RequirementsConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ValidateError(f"{p}: {loc}: {err['msg']}; see clustertrain/validate/requirements.yaml for the layout") from None


def family_entry(req: RequirementsConfig, instance_type: str | None) -> tuple[str, FamilyConfig]:
    """``(key, entry)``: the exact type's entry, else its family's, else ``default``."""
    for key in (instance_type, (instance_type or "").split(".")[0]):
        if key and key in req.families:
            return key, req.families[key]
    return "default", req.families.get("default") or FamilyConfig(gpus=1, efa_devices=1)


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
