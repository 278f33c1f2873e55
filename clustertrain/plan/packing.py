"""Models that share nodes: what a shared-node job asks Slurm for (:func:`job_share`), and which models share which
node (:func:`pack`).

A model with ``models[].plan.gpus`` below a node's runs on a *share* of one node
(:meth:`clustertrain.project.Project.shares_node`). Its job asks Slurm for exactly that share, so that Slurm can
place other shares beside it (memory-based scheduling, ``SlurmSettings.EnableMemoryBasedScheduling``):

* GPUs: ``plan.gpus`` (``--gres=gpu:N``; one rank per GPU);
* host memory: the node's schedulable memory in proportion to the GPUs, ``floor(RealMemory x gpus / gpus_per_node)``
  MB, where ParallelCluster's ``RealMemory`` is 95 % of the instance's memory (:data:`REAL_MEMORY_FRACTION`);
* CPUs: ``vCPUs / gpus_per_node`` per GPU (``--cpus-per-gpu``).

The shares of one node then add up to at most the node, whatever shares are packed together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clustertrain.project import ModelEntry, Project

#: ParallelCluster's Slurm node lines declare RealMemory = 95 % of the instance's memory (without the compute
#: resource's SchedulableMemory): aws/aws-parallelcluster-cookbook cookbooks/aws-parallelcluster-slurm/attributes/
#: slurm_attributes.rb ``default['cluster']['realmemory_to_ec2memory_ratio'] = 0.95``; with EnableMemoryBasedScheduling
#: its slurm_parallelcluster.conf template sets ``SelectTypeParameters=CR_CPU_Memory`` (else CR_CPU)
REAL_MEMORY_FRACTION = 0.95


@dataclass(frozen=True)
class NodeCapacity:
    """What one node offers Slurm: GPUs (rank slots with CPU workers), schedulable memory (MB) and CPUs."""

    gpus: int
    mem_mb: int | None      # None: the instance type is not in the catalog (nothing to ask --mem from)
    cpus: int | None


@dataclass(frozen=True)
class JobShare:
    """What a shared-node job asks Slurm for: ``--gres=gpu:<gpus>`` (rank slots on CPU workers), ``--mem=<mem_mb>M``,
    ``--cpus-per-gpu=<cpus_per_gpu>``; mem_mb / cpus_per_gpu are None when the instance type is unknown."""

    gpus: int
    mem_mb: int | None
    cpus_per_gpu: int | None


def node_capacity(project: "Project") -> NodeCapacity:
    """One node of ``cluster.instance_type`` (the catalog's vCPUs and memory; None where the type is unknown)."""
    from clustertrain.plan.catalog import load_catalog

    c = project.cluster
    slots = c.ranks_per_node
    inst = load_catalog(project.plan).get(c.instance_type) if c.instance_type else None
    if inst is None:
        return NodeCapacity(slots, None, None)
    return NodeCapacity(slots, int(inst.memory_gib * 1024 * REAL_MEMORY_FRACTION), inst.vcpus)


def job_share(project: "Project", entry: "ModelEntry", node: NodeCapacity | None = None) -> JobShare | None:
    """The share of a node ``entry``'s job asks for; None for a model on whole nodes."""
    if not project.shares_node(entry):
        return None
    node = node or node_capacity(project)
    gpus = project.job_gpus(entry)
    mem = node.mem_mb * gpus // node.gpus if node.mem_mb is not None else None
    cpus = node.cpus // node.gpus if node.cpus is not None else None
    return JobShare(gpus, mem, cpus)


@dataclass(frozen=True)
class Share:
    """One model's share of a shared node: what its job asks for, and its part of the node's hourly cost."""

    model: str
    gpus: int
    mem_mb: int | None
    cpus: int | None
    cost_per_hour: float | None  # the node's price x gpus / the GPUs used on the node (idle GPUs are paid by its models)


@dataclass(frozen=True)
class SharedNode:
    """A node that shares its GPUs between models (1-based ``index`` among the shared nodes)."""

    index: int
    shares: tuple[Share, ...]
    capacity: NodeCapacity

    @property
    def models(self) -> list[str]:
        return [s.model for s in self.shares]

    @property
    def gpus_used(self) -> int:
        return sum(s.gpus for s in self.shares)

    @property
    def mem_mb_used(self) -> int | None:
        return None if any(s.mem_mb is None for s in self.shares) else sum(s.mem_mb for s in self.shares)

    @property
    def cpus_used(self) -> int | None:
        return None if any(s.cpus is None for s in self.shares) else sum(s.cpus for s in self.shares)

    def overflow(self) -> list[str]:
        """What the shares ask for beyond the node: GPUs, host memory, CPUs (empty when they fit)."""
        out, c, who = [], self.capacity, " + ".join(f"{s.model} ({s.gpus})" for s in self.shares)
        if self.gpus_used > c.gpus:
            out.append(f"GPUs {who} = {self.gpus_used} > {c.gpus} per node")
        if c.mem_mb is not None and self.mem_mb_used is not None and self.mem_mb_used > c.mem_mb:
            out.append(f"host memory {self.mem_mb_used} MB > the node's schedulable {c.mem_mb} MB ({who})")
        if c.cpus is not None and self.cpus_used is not None and self.cpus_used > c.cpus:
            out.append(f"CPUs {self.cpus_used} > {c.cpus} per node ({who})")
        return out


@dataclass(frozen=True)
class Packing:
    """The shared nodes of a project and how its sub-node models fill them (:func:`pack`)."""

    nodes: tuple[SharedNode, ...]
    lower_bound: int             # ceil(the shares' GPUs / GPUs per node): no packing uses fewer nodes
    price_per_hour: float | None

    @property
    def count(self) -> int:
        return len(self.nodes)

    def node_of(self, model: str) -> SharedNode | None:
        return next((n for n in self.nodes if model in n.models), None)

    def share_of(self, model: str) -> Share | None:
        node = self.node_of(model)
        return next(s for s in node.shares if s.model == model) if node is not None else None

    def problems(self) -> list[str]:
        return [f"shared node {n.index} ({', '.join(n.models)}): {p}" for n in self.nodes for p in n.overflow()]


def pack(project: "Project", price_per_hour: float | None = None) -> Packing:
    """Pack the models with ``models[].plan.gpus`` below a node's onto shared nodes: **first-fit decreasing** by
    GPUs (then host memory, then the project's order).

    Why FFD: every share fits one node by construction (a share's memory and CPUs are its GPUs' proportion of the
    node, :func:`job_share`), so packing is one-dimensional bin packing in GPUs, where FFD never needs more than
    11/9 OPT + 6/9 nodes (Dósa 2007) and is optimal in the common shapes (a few shares of 1-8 GPUs): the plan reports
    the lower bound ``ceil(sum of GPUs / GPUs per node)`` beside it, so a packing above the bound is visible. FFD also
    keeps the user's grouping where it is already tight (the seeds' example 8 | 4 + 4 | 2 + 3 + 3 packs as written).
    ``price_per_hour`` (one node's) splits into the shares of each node in proportion to their GPUs."""
    cap = node_capacity(project)
    shares = [(e, job_share(project, e, cap)) for e in project.models if project.shares_node(e)]
    order = sorted(range(len(shares)), key=lambda i: (-shares[i][1].gpus, -(shares[i][1].mem_mb or 0), i))
    bins: list[list[int]] = []
    for i in order:
        g = shares[i][1].gpus
        for b in bins:
            if sum(shares[j][1].gpus for j in b) + g <= cap.gpus:
                b.append(i)
                break
        else:
            bins.append([i])
    nodes = []
    for k, b in enumerate(bins, start=1):
        used = sum(shares[j][1].gpus for j in b)
        items = []
        for j in sorted(b):  # the project's order within a node
            entry, js = shares[j]
            cpus = js.cpus_per_gpu * js.gpus if js.cpus_per_gpu is not None else None
            cost = price_per_hour * js.gpus / used if price_per_hour is not None else None
            items.append(Share(entry.name, js.gpus, js.mem_mb, cpus, cost))
        nodes.append(SharedNode(k, tuple(items), cap))
    total = sum(js.gpus for _, js in shares)
    return Packing(tuple(nodes), -(-total // cap.gpus) if total else 0, price_per_hour)
