"""NCCL/EFA environment presets: data in ``nccl_presets.yaml`` (format version 5 and sources documented
there), looked up by the instance type's preset family, the scale and the OS, with the project's
``launch.env`` applied on top.

Which preset family an instance type gets (``nccl_preset``) and whether it has EFA are instance facts:
they come from the instance catalog (``clustertrain/plan/instances.yaml``, :mod:`clustertrain.plan.catalog`).
A type that is not in the catalog, or has no ``nccl_preset``, gets no preset.

The result is a :class:`RankEnvironment`: ``set`` (name -> value, exported as given) and ``prepend``
(name -> directories put in front of the node's existing value, e.g. ``LD_LIBRARY_PATH``). Directories
are prepended only for jobs on the host whose OS is known (``aws.os``): a container brings its own. ``on_node``
(name -> a rule of :data:`NODE_RULES`) holds what the batch script computes on the node: ``GLOO_SOCKET_IFNAME``, beside
``NCCL_SOCKET_IFNAME`` wherever the preset sets that one. NCCL takes ``^docker,lo,veth`` (exclude prefixes); gloo does
not: torch's ``ProcessGroupGloo`` (``torch/csrc/distributed/c10d/init.cpp``) splits ``GLOO_SOCKET_IFNAME`` at ``,`` and
opens each part as an interface name, so ``^docker`` fails with "Unable to find address for: ^docker"
(tests/unit/launch/test_presets.py shows it). The same intent (the real network interface, never docker, loopback or
veth) as a name is the interface of the node's default route; without ``GLOO_SOCKET_IFNAME`` gloo binds the address
the host name resolves to, which is loopback where ``/etc/hosts`` maps the name to 127.0.1.1 (Debian/Ubuntu images).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from clustertrain.core.errors import ConfigError
from clustertrain.launch.config import LaunchConfig
from clustertrain.plan.catalog import read_catalog
from clustertrain.core.schema import read_yaml

PRESETS_FILE = Path(__file__).with_name("nccl_presets.yaml")
PRESETS_VERSION = 5
#: rule name -> the shell command that prints the value on the node (the batch script runs it, ``$(...)``)
NODE_RULES: dict[str, str] = {
    # The interface of the default route with the lowest metric, from the kernel's routing table (/proc/net/route:
    # Iface, Destination 00000000 = default, ..., Metric in column 7); needs no `ip` binary. Empty: no default route.
    "default_route_interface":
        "awk 'NR > 1 && $2 == \"00000000\" {print $7, $1}' /proc/net/route 2>/dev/null | sort -n | awk 'NR == 1 {print $2}'",
}


@dataclass(frozen=True)
class RankEnvironment:
    """What the batch script exports before ``srun``; insertion order is kept (the script is stable)."""

    set: dict[str, str] = field(default_factory=dict)
    prepend: dict[str, list[str]] = field(default_factory=dict)
    family: str | None = None   # the preset family applied (None: no preset)
    scale: str | None = None
    efa: bool = False           # the EFA layer (efa_common) applied
    os: str | None = None
    on_node: dict[str, str] = field(default_factory=dict)  # name -> NODE_RULES rule the batch script evaluates


def node_env_lines(env: RankEnvironment) -> list[str]:
    """The batch-script lines that compute and export ``env.on_node`` (a variable whose rule prints nothing is left
    unset: the library's own default applies)."""
    lines = []
    for name, rule in env.on_node.items():
        lines.append(f"{name}=$({NODE_RULES[rule]})")
        lines.append(f'if [ -n "${name}" ]; then export {name}; else unset {name}; fi')
    return lines


@lru_cache(maxsize=4)
def load_presets(path: Path = PRESETS_FILE) -> dict:
    data = read_yaml(path)
    if not isinstance(data, dict) or data.get("version") != PRESETS_VERSION or "families" not in data:
        raise ConfigError(f"{path}: not a version-{PRESETS_VERSION} NCCL preset file "
                          "(keys version, small_max_nodes, os_layout, efa_common, within_node, families, discouraged)")
    return data


def preset_of(instance_type: str | None) -> tuple[str | None, bool]:
    """``(preset family, has EFA)`` of an instance type, from the instance catalog (a SageMaker ``ml.``
    name reads as the EC2 type); ``(None, False)`` for a type the catalog does not know."""
    name = (instance_type or "").strip().lower().removeprefix("ml.")
    inst = read_catalog().instances.get(name)
    return (inst.nccl_preset, inst.efa) if inst is not None else (None, False)


def scale_of(nodes: int, presets: dict | None = None) -> str:
    presets = presets or load_presets()
    return "small" if nodes <= int(presets.get("small_max_nodes", 2)) else "large"


def discouraged(presets: dict | None = None) -> dict[str, str]:
    """Variable name -> why ``launch.env`` should not set it (the plugin sets it itself, or it harms)."""
    return dict((presets or load_presets()).get("discouraged") or {})


#: the scale of a job on a share of one node (``models[].plan.gpus``): the file's ``within_node`` layer only
WITHIN_NODE = "within_node"


def rank_environment(instance_type: str | None, nodes: int, launch: LaunchConfig | None = None,
                     presets: dict | None = None, os: str | None = None, container: bool = False,
                     within_node: bool = False) -> RankEnvironment:
    """The preset of ``instance_type`` at ``nodes`` nodes on ``os`` (``aws.os``; None = unknown), with
    ``launch.env`` over it. ``container``: the ranks run in a container image (nothing is prepended).
    ``within_node``: the job runs on a share of one node (:meth:`clustertrain.project.Project.shares_node`): its
    collectives never leave the node (NCCL's P2P/NVLink and SHM transports), so neither the EFA layer nor the
    family's scale blocks apply, only the file's ``within_node`` layer (scale ``within_node``, ``efa`` False)."""
    presets = presets or load_presets()
    preset, efa = preset_of(instance_type)
    spec = presets["families"].get(preset) if preset else None
    efa = efa and spec is not None and not within_node
    values: dict[str, str] = {}
    prepend: dict[str, list[str]] = {}
    on_node: dict[str, str] = {}
    scale = None
    layout = (presets.get("os_layout") or {}).get(os) if os else None
    if spec is not None:
        scale = WITHIN_NODE if within_node else scale_of(nodes, presets)
        layers = [presets.get("efa_common", {})] if efa else []
        layers += [presets.get(WITHIN_NODE) or {}] if within_node else [spec.get("all") or {}, spec.get(scale) or {}]
        for layer in layers:
            values.update({k: str(v) for k, v in (layer.get("env") or {}).items()})
            on_node.update({k: str(v) for k, v in (layer.get("on_node") or {}).items()})
            if layout and not container:
                for k, dirs in ((layer.get("prepend_by_os") or {}).get(layout) or {}).items():
                    prepend[k] = [str(d) for d in dirs]
    for key, value in (launch.env if launch else {}).items():
        on_node.pop(key, None)  # an explicit value (or null) replaces the rule
        if value is None:
            values.pop(key, None)
            prepend.pop(key, None)
        else:
            prepend.pop(key, None)  # an explicit value replaces the prepended directories too
            values[key] = value
    unknown = sorted(set(on_node.values()) - set(NODE_RULES))
    if unknown:
        raise ConfigError(f"{PRESETS_FILE}: on_node rule(s) {', '.join(unknown)} unknown (known: {', '.join(NODE_RULES)})")
    return RankEnvironment(values, prepend, preset if spec is not None else None, scale, efa, os, on_node)
