"""Instance facts for configuration checks: EFA support, NVIDIA GPUs, vCPUs, local NVMe, regions.

The data lives in ``instances.yaml`` beside this module (its format is documented at its top).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

INSTANCES_FILE = Path(__file__).with_name("instances.yaml")
INSTANCE_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.(nano|micro|small|medium|large|xlarge|\d+xlarge|metal(-\d+xl)?)$")


@dataclass(frozen=True)
class InstanceFacts:
    name: str
    vcpus: int
    memory_gib: int
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


def parse_catalog(raw: dict) -> InstanceCatalog:
    if not isinstance(raw, dict) or raw.get("version") != 1:
        raise ValueError("instance catalog: expected a mapping with version: 1")
    instances = {}
    for name, v in raw["instances"].items():
        regions = v.get("regions")
        instances[name] = InstanceFacts(
            name=name, vcpus=int(v["vcpus"]), memory_gib=int(v["memory_gib"]), gpus=int(v["gpus"]), gpu=v.get("gpu"),
            efa=bool(v["efa"]), nvme_gb=int(v.get("nvme_gb", 0)), regions=tuple(regions) if regions is not None else None,
        )
    return InstanceCatalog(instances=instances, regions=tuple(raw["regions"]))


@lru_cache(maxsize=1)
def load_catalog() -> InstanceCatalog:
    """The bundled catalog (read once)."""
    return parse_catalog(yaml.safe_load(INSTANCES_FILE.read_text(encoding="utf-8")))
