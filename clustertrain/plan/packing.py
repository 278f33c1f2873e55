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
