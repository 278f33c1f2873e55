"""NCCL/EFA environment presets: data in ``nccl_presets.yaml`` (sources documented there), looked up
by instance family, scale and OS, with the project's ``launch.env`` applied on top.

The result is a :class:`RankEnvironment`: ``set`` (name -> value, exported as given) and ``prepend``
(name -> directories put in front of the node's existing value, e.g. ``LD_LIBRARY_PATH``). Directories
are prepended only for jobs on the host whose OS is known (``aws.os``): a container brings its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from clustertrain.errors import ConfigError
from clustertrain.launch.config import LaunchConfig

PRESETS_FILE = Path(__file__).with_name("nccl_presets.yaml")
PRESETS_VERSION = 2
_FAMILY_RE = re.compile(r"^(?:ml\.)?([a-z]+[0-9]+[a-z]*)\.")


@dataclass(frozen=True)
class RankEnvironment:
    """What the batch script exports before ``srun``; insertion order is kept (the script is stable)."""

    set: dict[str, str] = field(default_factory=dict)
    prepend: dict[str, list[str]] = field(default_factory=dict)
    family: str | None = None
    scale: str | None = None
    efa: bool = False
    os: str | None = None


@lru_cache(maxsize=4)
def load_presets(path: Path = PRESETS_FILE) -> dict:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("version") != PRESETS_VERSION or "families" not in data:
        raise ConfigError(f"{path}: not a version-{PRESETS_VERSION} NCCL preset file "
                          "(keys version, small_max_nodes, os_layout, efa_common, families, discouraged)")
    return data


def family_of(instance_type: str | None) -> str | None:
    """``p5e.48xlarge`` -> ``p5e``; ``None`` or an unparsable name -> ``None``."""
    if not instance_type:
        return None
    m = _FAMILY_RE.match(instance_type.strip().lower())
    return m.group(1) if m else None


def scale_of(nodes: int, presets: dict | None = None) -> str:
    presets = presets or load_presets()
    return "small" if nodes <= int(presets.get("small_max_nodes", 2)) else "large"


def discouraged(presets: dict | None = None) -> dict[str, str]:
    """Variable name -> why ``launch.env`` should not set it (the plugin sets it itself, or it harms)."""
    return dict((presets or load_presets()).get("discouraged") or {})


def rank_environment(instance_type: str | None, nodes: int, launch: LaunchConfig | None = None,
                     presets: dict | None = None, os: str | None = None, container: bool = False) -> RankEnvironment:
    """The preset of ``instance_type`` at ``nodes`` nodes on ``os`` (``aws.os``; None = unknown), with
    ``launch.env`` over it. ``container``: the ranks run in a container image (nothing is prepended)."""
    presets = presets or load_presets()
    family = family_of(instance_type)
    spec = presets["families"].get(family) if family else None
    values: dict[str, str] = {}
    prepend: dict[str, list[str]] = {}
    scale = None
    layout = (presets.get("os_layout") or {}).get(os) if os else None
    if spec is not None:
        scale = scale_of(nodes, presets)
        layers = [presets.get("efa_common", {})] if spec.get("efa") else []
        layers += [spec.get("all") or {}, spec.get(scale) or {}]
        for layer in layers:
            values.update({k: str(v) for k, v in (layer.get("env") or {}).items()})
            if layout and not container:
                for k, dirs in ((layer.get("prepend_by_os") or {}).get(layout) or {}).items():
                    prepend[k] = [str(d) for d in dirs]
    for key, value in (launch.env if launch else {}).items():
        if value is None:
            values.pop(key, None)
            prepend.pop(key, None)
        else:
            prepend.pop(key, None)  # an explicit value replaces the prepended directories too
            values[key] = value
    return RankEnvironment(values, prepend, family, scale, bool(spec and spec.get("efa")), os)
