"""The emulated cluster's shape, read from the ParallelCluster config clustertrain generates for the project.

Everything comes from :func:`clustertrain.cloud.pcluster.build_cluster_config` (what ``clustertrain cluster
config`` writes) and the node scripts of :func:`clustertrain.cloud.scripts.render_node_scripts`, so the
rehearsal boots what the real cluster would boot:

* one Slurm partition per ``SlurmQueues[]`` entry, with its own name; per ``ComputeResources[]`` entry the
  nodes ParallelCluster names ``<queue>-st-<resource>-<i>`` (``MinCount`` static nodes) and
  ``<queue>-dy-<resource>-<i>`` (the rest of ``MaxCount``, emulated as if powered up);
* each node declares its instance type's vCPUs, 95% of its memory and its GPUs from the instance catalog
  (``SlurmdParameters=config_overrides`` lets an emulated node claim what this machine lacks) and gets
  ``Gres=gpu:<type>:<n>`` backed by fake device files;
* ``CustomActions`` of the head node and of each queue, hook by hook, in order; the script URL's file is
  the rendered script (``R/s3/<bucket>/<key>``: the upload the user runs, ``upload_command``);
* ``SharedStorage`` mount directories, and the queue's ``EphemeralVolume.MountDir``.

:func:`with_nodes` (``clustertrain rehearse --nodes N``) resizes the queue the jobs run in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clustertrain.core.errors import LaunchError
from clustertrain.launch.slurm_cluster import NodeGroup
from clustertrain.plan.packing import REAL_MEMORY_FRACTION

if TYPE_CHECKING:
    from clustertrain.project import Project

#: the most nodes one machine emulates (measured: see docs/rehearse.md; each node is a slurmd and a mount namespace)
MAX_NODES = 200
HOOKS = ("OnNodeStart", "OnNodeConfigured")
# ParallelCluster's node lines: RealMemory = REAL_MEMORY_FRACTION (95 %) of the instance's memory, defined once, with
# its source, in clustertrain.plan.packing


@dataclass(frozen=True)
class Action:
    """One custom action: the hook it runs in, the script (file name and URL) and its arguments."""

    hook: str
    name: str
    url: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Queue:
    name: str
    groups: tuple[NodeGroup, ...]
    instance_type: str
    ephemeral: str | None
    actions: tuple[Action, ...]

    @property
    def nodes(self) -> list[str]:
        return [n for g in self.groups for n in g.names]


@dataclass(frozen=True)
class Shape:
    queues: tuple[Queue, ...]
    head_actions: tuple[Action, ...]
    shared: dict[str, str]                    # SharedStorage Name -> MountDir
    user: str | None                          # the OS's default user (ec2-user on alinux2023)
    scripts: dict[str, str] = field(default_factory=dict)   # script URL -> text
    #: Scheduling.SlurmSettings.EnableMemoryBasedScheduling: the emulated slurm.conf has CR_CPU_Memory
    memory_scheduling: bool = False

    @property
    def groups(self) -> list[NodeGroup]:
        return [g for q in self.queues for g in q.groups]

    @property
    def node_count(self) -> int:
        return sum(g.count for g in self.groups)

    def queue(self, name: str) -> Queue | None:
        return next((q for q in self.queues if q.name == name), None)


def gpu_type(gpu: str | None) -> str:
    """``H200 141GB`` -> ``h200`` (the gres type ParallelCluster's nodes report)."""
    word = (gpu or "gpu").split()[0].lower()
    return re.sub(r"[^a-z0-9_.-]", "", word) or "gpu"


def _actions(entry: Any, scripts: dict[str, str]) -> tuple[Action, ...]:
    out: list[Action] = []
    hooks = entry if isinstance(entry, dict) else {}
    for hook in HOOKS:
        spec = hooks.get(hook)
        if not isinstance(spec, dict):
            continue
        items = spec.get("Sequence") if isinstance(spec.get("Sequence"), list) else [spec]
        for item in items:
            url = item.get("Script")
            if not isinstance(url, str):
                continue
            if url not in scripts:
                raise LaunchError(f"CustomActions.{hook}: {url} is not a script clustertrain generates; the rehearsal "
                                  "runs only its own node scripts (clustertrain cluster scripts)")
            out.append(Action(hook, url.rsplit("/", 1)[-1], url, tuple(str(a) for a in item.get("Args") or ())))
    return tuple(out)


def cluster_shape(project: "Project", config: dict[str, Any] | None = None, scripts: dict[str, str] | None = None) -> Shape:
    """The shape of ``project``'s cluster (see the module docstring); ``config``/``scripts``: already built ones
    (a test moves a script to another hook this way)."""
    from clustertrain.cloud.catalog import load_catalog
    from clustertrain.cloud.limits import OS_DEFAULT_USER
    from clustertrain.cloud.pcluster import build_cluster_config, scripts_uri
    from clustertrain.cloud.scripts import render_node_scripts

    if project.aws is None:
        raise LaunchError("the project has no aws: section: `clustertrain rehearse` emulates the ParallelCluster it "
                          "describes (queues, FSx mounts, node scripts); add one (examples/p5e-80x7.yaml)")
    config = config if config is not None else build_cluster_config(project)
    if scripts is None:
        base = scripts_uri(project).rstrip("/")
        scripts = {f"{base}/{name}": text for name, text in render_node_scripts(project, allow_off_mount=True).items()}
    catalog = load_catalog()
    queues = []
    for q in config["Scheduling"]["SlurmQueues"]:
        groups = []
        for cr in q["ComputeResources"]:
            facts = catalog.get(cr["InstanceType"])
            if facts is None:
                raise LaunchError(f"aws.queues: instance type {cr['InstanceType']} is not in the instance catalog; "
                                  "the rehearsal needs its vCPUs, memory and GPUs")
            static, total = int(cr.get("MinCount", 0)), int(cr["MaxCount"])
            shape = dict(cpus=facts.vcpus, memory_mb=int(facts.memory_gib * 1024 * REAL_MEMORY_FRACTION), gpus=facts.gpus,
                         gpu_type=gpu_type(facts.gpu))
            if static:
                groups.append(NodeGroup(q["Name"], f"{q['Name']}-st-{cr['Name']}-", static, **shape))
            if total > static:
                groups.append(NodeGroup(q["Name"], f"{q['Name']}-dy-{cr['Name']}-", total - static, **shape))
        local = ((q.get("ComputeSettings") or {}).get("LocalStorage") or {})
        eph = (local.get("EphemeralVolume") or {}).get("MountDir") if "EphemeralVolume" in local else None
        if "EphemeralVolume" in local and not eph:
            eph = "/scratch"  # ParallelCluster's default MountDir
        queues.append(Queue(q["Name"], tuple(groups), q["ComputeResources"][0]["InstanceType"], eph,
                            _actions(q.get("CustomActions"), scripts)))
    shared = {s["Name"]: s["MountDir"] for s in config.get("SharedStorage") or []}
    user = OS_DEFAULT_USER.get(project.aws.os)
    memory = bool(((config["Scheduling"].get("SlurmSettings") or {}).get("EnableMemoryBasedScheduling")))
    return Shape(tuple(queues), _actions(config["HeadNode"].get("CustomActions"), scripts), shared, user, scripts,
                 memory)


def with_nodes(project: "Project", nodes: int) -> "Project":
    """``project`` on a cluster of ``nodes`` nodes (``clustertrain rehearse --nodes N``): the job partition's queue
    gets ``max_count: N`` (``min_count`` and ``cluster.nodes`` at most N) and the plan ``cluster_nodes: N``, so that the plan, the
    cluster config and the emulated cluster agree."""
    import yaml

    from clustertrain.project import apply_override, dump_project
    from clustertrain.resolve import project_from_mapping

    if project.aws is None:
        return project
    index = next((i for i, q in enumerate(project.aws.queues) if q.name == project.cluster.partition), None)
    if index is None:
        raise LaunchError(f"cluster.partition {project.cluster.partition!r} is none of the aws.queues "
                          f"({', '.join(q.name for q in project.aws.queues)}); --nodes resizes the queue the jobs run in")
    raw = yaml.safe_load(dump_project(project))
    apply_override(raw, f"aws.queues.{index}.max_count={nodes}")
    if project.aws.queues[index].min_count is not None:
        apply_override(raw, f"aws.queues.{index}.min_count={min(nodes, project.aws.queues[index].min_count)}")
    if project.cluster.nodes > nodes:
        apply_override(raw, f"cluster.nodes={nodes}")
    if project.plan.cluster_nodes is not None:
        apply_override(raw, f"plan.cluster_nodes={nodes}")
    return project_from_mapping(raw, source=f"{project.name} with --nodes {nodes}")
