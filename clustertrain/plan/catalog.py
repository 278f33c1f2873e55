"""The instance catalog: ``instances.yaml`` beside this module is the one place clustertrain keeps
instance and GPU facts, each written once with its source. Its format (version 1) is documented at
the top of that file and by :class:`CatalogFile` below; :func:`read_catalog` loads and checks it.

Every stage reads a view of it, never a copy:

* plan — :func:`load_catalog` / :func:`find_instance`: the GPU instances the planner can compute with
  (a GPU with usable memory and a bf16 peak), merged with the project's ``plan.instances`` overrides
  and ``plan.price``;
* cloud — :mod:`clustertrain.cloud.catalog` (vCPUs, GPUs, EFA, NVMe, regions for queue checks);
* validate — :mod:`clustertrain.validate.requirements` (GPU and EFA counts a node must show);
* launch — :mod:`clustertrain.launch.presets` (which NCCL/EFA preset an instance type gets);
* train — :mod:`clustertrain.train.metrics` (the GPU's bf16 peak for MFU, :meth:`CatalogFile.gpu_for_device`).

This module imports only pydantic, PyYAML and clustertrain's leaf modules, so compute nodes can read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from clustertrain.core.errors import ConfigError
from clustertrain.plan.config import PlanConfig, PriceConfig
from clustertrain.core.schema import StrictModel, load_yaml_model

CATALOG_PATH = Path(__file__).with_name("instances.yaml")
#: an EC2 instance type name (``p5e.48xlarge``, ``t3.micro``, ``c7g.metal-48xl``)
INSTANCE_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.(nano|micro|small|medium|large|xlarge|\d+xlarge|metal(-\d+xl)?)$")
DEFAULT_MFU = 0.40
REQUIRED = ("gpus", "gpu_model", "gpu_memory_gib", "peak_bf16_tflops", "vcpus", "memory_gib")


class GpuSpec(StrictModel):
    """One GPU model (the key is its name as the planner shows it, e.g. ``H100 80GB``)."""

    names: list[str] = Field(min_length=1, description="Substrings of the CUDA / nvidia-smi device name that identify this GPU (e.g. `H100`).")
    memory_gib: float | None = Field(None, gt=0, description="Usable memory per GPU in GiB (nvidia-smi memory.total); absent = not known here.")
    memory_source: str | None = Field(None, description="Key in `sources` for memory_gib (required with it).")
    peak_bf16_tflops: float | None = Field(None, gt=0, description="Dense (no sparsity) bf16 peak TFLOP/s per GPU; absent = no bf16.")
    nvlink_gbps: float = Field(0, ge=0, description="NVLink bandwidth per GPU in GB/s (0 = PCIe only).")
    source: str = Field(description="Key in `sources` for the peak and NVLink figures.")


class NetworkSpec(StrictModel):
    efa_interfaces: int = Field(ge=0, description="EFA network interfaces per instance (0 = no EFA).")
    gbps: float | None = Field(None, gt=0, description="Network bandwidth per instance in Gbit/s; absent = not known here.")
    source: str = Field(description="Key in `sources` for these figures.")


class InstanceSpec(StrictModel):
    """One instance type (the key is its EC2 name)."""

    gpu: str | None = Field(None, description="Key in `gpus` (absent = no NVIDIA GPU).")
    gpus: int = Field(ge=0, description="NVIDIA GPUs per instance.")
    vcpus: int = Field(ge=1, description="vCPUs per instance.")
    memory_gib: float = Field(gt=0, description="Host memory per instance in GiB.")
    nvme_gb: int = Field(ge=0, description="Local instance-store NVMe in decimal GB (0 = none).")
    nvme_source: str | None = Field(None, description="Key in `sources` for nvme_gb when it is not `source`.")
    architecture: Literal["x86_64", "arm64"] = Field(description="CPU architecture.")
    source: str = Field(description="Key in `sources` for the hardware figures (gpus, vcpus, memory, NVMe).")
    network: NetworkSpec = Field(description="EFA interfaces and bandwidth, with their source.")
    nccl_preset: str | None = Field(None, description="Family in launch/nccl_presets.yaml whose NCCL/EFA settings apply (absent = none).")
    assumed_mfu: float | None = Field(None, gt=0, le=1, description="Planning default for model FLOPs utilisation (an assumption, not a fact).")
    price: PriceConfig | None = Field(None, description="Hourly price with region, date and source.")
    regions: list[str] | None = Field(None, description="The only regions offering this type (absent = not known here, no check).")

    @property
    def efa(self) -> bool:
        return self.network.efa_interfaces > 0


class CatalogFile(StrictModel):
    """``instances.yaml``: sources, region names, GPU models and instance types."""

    version: Literal[1] = Field(description="Catalog format version (1).")
    sources: dict[str, str] = Field(description="Source key -> where the facts that name it come from.")
    regions: list[str] = Field(min_length=1, description="Every AWS region name.")
    gpus: dict[str, GpuSpec] = Field(description="GPU model -> its facts.")
    instances: dict[str, InstanceSpec] = Field(description="Instance type -> its facts.")

    @model_validator(mode="after")
    def _consistent(self) -> CatalogFile:
        def need_source(where: str, key: str | None) -> None:
            if key is not None and key not in self.sources:
                raise ValueError(f"{where}: source {key!r} is not in sources (known: {', '.join(self.sources)}); "
                                 "add it there or use `unverified`")

        for name, g in self.gpus.items():
            need_source(f"gpus.{name}.source", g.source)
            need_source(f"gpus.{name}.memory_source", g.memory_source)
            if (g.memory_gib is None) != (g.memory_source is None):
                raise ValueError(f"gpus.{name}: memory_gib and memory_source go together; give both or neither")
        for name, i in self.instances.items():
            where = f"instances.{name}"
            if not INSTANCE_TYPE_RE.match(name):
                raise ValueError(f"{where}: not an EC2 instance type name (e.g. p5e.48xlarge)")
            for field, key in (("source", i.source), ("nvme_source", i.nvme_source), ("network.source", i.network.source)):
                need_source(f"{where}.{field}", key)
            if i.gpu is not None and i.gpu not in self.gpus:
                raise ValueError(f"{where}.gpu: {i.gpu!r} is not in gpus (known: {', '.join(self.gpus)})")
            if (i.gpu is None) != (i.gpus == 0):
                raise ValueError(f"{where}: gpu and gpus disagree; name the GPU model exactly when gpus > 0")
            if i.nccl_preset is not None and not i.efa:
                raise ValueError(f"{where}.nccl_preset: the NCCL/EFA presets are for EFA instances; network.efa_interfaces is 0")
            if i.price is not None and not i.price.source:
                raise ValueError(f"{where}.price.source: every catalog price says where it comes from")
            unknown = sorted(set(i.regions or ()) - set(self.regions))
            if unknown:
                raise ValueError(f"{where}.regions: {', '.join(unknown)} not in regions")
        return self

    def gpu_of(self, instance_type: str) -> GpuSpec | None:
        """The GPU of a catalog instance type (None: not in the catalog, or no NVIDIA GPU)."""
        inst = self.instances.get(instance_type)
        return self.gpus[inst.gpu] if inst is not None and inst.gpu is not None else None

    def plannable(self, instance_type: str) -> bool:
        """The planner can compute with this type: a GPU with usable memory and a bf16 peak."""
        gpu = self.gpu_of(instance_type)
        return gpu is not None and gpu.memory_gib is not None and gpu.peak_bf16_tflops is not None

    def gpu_for_device(self, device_name: str | None) -> GpuSpec | None:
        """The GPU a CUDA device name (``NVIDIA H100 80GB HBM3``) is; the longest matching name wins
        (``L40S`` before ``L4``); None when no GPU matches."""
        if not device_name:
            return None
        upper = device_name.upper()
        hits = [(len(n), g) for g in self.gpus.values() for n in g.names if n.upper() in upper]
        return max(hits, key=lambda h: h[0])[1] if hits else None


@lru_cache(maxsize=4)
def read_catalog(path: Path = CATALOG_PATH) -> CatalogFile:
    """The catalog file, validated (read once per path); a mistake in it is one ConfigError line."""
    return load_yaml_model(path, CatalogFile, error=ConfigError)


# --- the planner's view --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instance:
    """One instance type with every field resolved (what the planner computes with)."""

    name: str
    gpus: int
    gpu_model: str
    gpu_memory_gib: float
    peak_bf16_tflops: float
    nvlink_gbps: float
    vcpus: int
    memory_gib: float
    efa_adapters: int
    network_gbps: float | None
    nvme_tb: float
    assumed_mfu: float
    price: PriceConfig | None


def _plan_fields(catalog: CatalogFile, name: str) -> dict:
    inst, gpu = catalog.instances[name], catalog.gpu_of(name)
    assert gpu is not None
    fields = {
        "gpus": inst.gpus, "gpu_model": inst.gpu, "gpu_memory_gib": gpu.memory_gib, "peak_bf16_tflops": gpu.peak_bf16_tflops,
        "nvlink_gbps": gpu.nvlink_gbps, "vcpus": inst.vcpus, "memory_gib": inst.memory_gib,
        "efa_adapters": inst.network.efa_interfaces, "network_gbps": inst.network.gbps, "nvme_tb": inst.nvme_gb / 1000,
        "assumed_mfu": inst.assumed_mfu, "price": inst.price.model_dump() if inst.price else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


def load_catalog(plan: PlanConfig | None = None, path: Path = CATALOG_PATH) -> dict[str, Instance]:
    """The instance types the planner can use, with the project's additions/overrides (partial entries merge)."""
    catalog = read_catalog(path)
    entries = {name: _plan_fields(catalog, name) for name in catalog.instances if catalog.plannable(name)}
    for name, override in (plan.instances if plan else {}).items():
        merged = dict(entries.get(name, {}))
        merged.update(override.model_dump(exclude_none=True))
        missing = [k for k in REQUIRED if k not in merged]
        if missing:
            raise ConfigError(
                f"plan.instances.{name}: not in the catalog, so it needs {', '.join(missing)}; "
                f"catalog types: {', '.join(sorted(entries))}"
            )
        entries[name] = merged
    out = {}
    for name, f in entries.items():
        price = f.get("price")
        out[name] = Instance(
            name=name, gpus=f["gpus"], gpu_model=f["gpu_model"], gpu_memory_gib=f["gpu_memory_gib"],
            peak_bf16_tflops=f["peak_bf16_tflops"], nvlink_gbps=f.get("nvlink_gbps", 0.0), vcpus=f["vcpus"],
            memory_gib=f["memory_gib"], efa_adapters=f.get("efa_adapters", 0), network_gbps=f.get("network_gbps"),
            nvme_tb=f.get("nvme_tb", 0.0), assumed_mfu=f.get("assumed_mfu", DEFAULT_MFU),
            price=PriceConfig.model_validate(price) if isinstance(price, dict) else price,
        )
    return out


def find_instance(catalog: dict[str, Instance], name: str, plan: PlanConfig | None = None) -> Instance:
    """The catalog entry for ``name`` with ``plan.price`` applied; ConfigError naming the choices if unknown."""
    if name not in catalog:
        raise ConfigError(
            f"cluster.instance_type: {name!r} is not in the instance catalog; known: {', '.join(sorted(catalog))} "
            f"(or describe it under plan.instances.{name})"
        )
    inst = catalog[name]
    if plan is not None and plan.price is not None:
        inst = replace(inst, price=plan.price)
    return inst
