"""The instance catalog: ``catalog.yaml`` next to this module (format documented at its top),
merged with the project's ``plan.instances`` overrides and ``plan.price``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from clustertrain.errors import ConfigError
from clustertrain.plan.config import InstanceConfig, PlanConfig, PriceConfig

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")
REQUIRED = ("gpus", "gpu_model", "gpu_memory_gib", "peak_bf16_tflops", "vcpus", "memory_gib")


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


def load_catalog(plan: PlanConfig | None = None, path: Path = CATALOG_PATH) -> dict[str, Instance]:
    """The bundled catalog with the project's additions/overrides (partial entries merge) and price."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    entries: dict[str, dict] = {}
    for name, fields in (raw.get("instances") or {}).items():
        entries[name] = InstanceConfig.model_validate(fields).model_dump(exclude_none=True)
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
            nvme_tb=f.get("nvme_tb", 0.0), assumed_mfu=f.get("assumed_mfu", 0.40),
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
        inst = Instance(**{**inst.__dict__, "price": plan.price})
    return inst
