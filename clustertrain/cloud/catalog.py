"""The cloud stage's view of the instance catalog: what configuration checks need (vCPUs, NVIDIA GPUs,
EFA support, local NVMe, where a type is offered, the AWS region names).

The facts live in ``clustertrain/plan/instances.yaml`` (format: :mod:`clustertrain.plan.catalog`);
this module holds none of its own. A compute type not in the catalog is rejected for queues.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from clustertrain.plan.catalog import CATALOG_PATH, INSTANCE_TYPE_RE, CatalogFile, read_catalog

__all__ = ["CATALOG_PATH", "INSTANCE_TYPE_RE", "InstanceCatalog", "InstanceFacts", "cloud_view", "load_catalog"]


@dataclass(frozen=True)
class InstanceFacts:
    name: str
    vcpus: int
    memory_gib: float
    gpus: int
    gpu: str | None
    efa: bool
    nvme_gb: int
    regions: tuple[str, ...] | None


@dataclass(frozen=True)
class InstanceCatalog:
    instances: dict[str, InstanceFacts]
    regions: tuple[str, ...]

    def get(self, instance_type: str) -> InstanceFacts | None:
        return self.instances.get(instance_type)

    def offered(self, instance_type: str, region: str) -> bool | None:
        """True/False when the catalog knows where the type is offered, None when it does not."""
        facts = self.get(instance_type)
        if facts is None or facts.regions is None:
            return None
        return region in facts.regions

    def suggest(self, instance_type: str) -> list[str]:
        family = instance_type.split(".")[0]
        same = [n for n in self.instances if n.split(".")[0] == family]
        return same or sorted(n for n in self.instances if self.instances[n].gpus)


def cloud_view(catalog: CatalogFile) -> InstanceCatalog:
    """The facts configuration checks use, for every type in ``catalog``."""
    instances = {
        name: InstanceFacts(name=name, vcpus=i.vcpus, memory_gib=i.memory_gib, gpus=i.gpus, gpu=i.gpu, efa=i.efa,
                            nvme_gb=i.nvme_gb, regions=tuple(i.regions) if i.regions is not None else None)
        for name, i in catalog.instances.items()
    }
    return InstanceCatalog(instances=instances, regions=tuple(catalog.regions))


@lru_cache(maxsize=1)
def load_catalog() -> InstanceCatalog:
    """The bundled catalog's cloud view (read once)."""
    return cloud_view(read_catalog(CATALOG_PATH))
