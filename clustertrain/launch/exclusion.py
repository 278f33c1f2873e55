"""Which nodes a job of the project leaves out (``sbatch --exclude``): the project's suspect list
(:mod:`clustertrain.monitor.suspects`) as Slurm sees the cluster at submit time.

:func:`exclusions` reads the active entries and asks Slurm once (``scontrol show node -o``; the default partition
from ``scontrol show partition -o`` when ``cluster.partition`` is unset). Each entry then:

* a node Slurm does not know is dropped with a note (``sbatch --exclude`` refuses the whole job for an unknown
  name: "Invalid node name specified");
* a node whose ``NodeHostName`` differs from the host recorded when it was blamed is dropped with a note: on
  ParallelCluster a node name is a slot, and a replacement instance (a static node replaced, a dynamic node
  powered down and up again) took it over (:func:`clustertrain.monitor.suspects.still_applies`);
* the rest are excluded, unless that would leave the job's partition fewer nodes than the job needs (sbatch
  would refuse it: "Requested node configuration is not available"); then nothing is excluded and one note
  names the suspects and ``clustertrain nodes clear``.

Where Slurm cannot be asked (no client, no controller), every active suspect is excluded unchecked, with a note.
Nothing is written; the notes are one line each, for ``submit`` to print.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clustertrain.core.errors import LaunchError
from clustertrain.launch.slurm_query import parse_kv_line
from clustertrain.launch.slurmcli import run_slurm
from clustertrain.core.storage_layout import storage_layout
from clustertrain.monitor.suspects import Suspect, active_suspects, still_applies

if TYPE_CHECKING:
    from clustertrain.project import Project

#: seconds to wait for the controller (submit asks it right before sbatch, which fails the same way)
SCONTROL_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Exclusion:
    """The nodes to pass to ``sbatch --exclude`` (sorted) and one line per decision worth telling the user."""

    exclude: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SlurmNode:
    """What the exclusion needs of one ``scontrol show node -o`` line."""

    host: str
    partitions: tuple[str, ...]


def exclusions(project: "Project", env: Mapping[str, str] | None = None, nodes_needed: int = 1,
               now: float | None = None) -> Exclusion:
    """The exclusion for a job of ``project`` that needs ``nodes_needed`` nodes (rules in the module docstring);
    ``env``: the Slurm client variables (``SLURM_CONF``...), over ``os.environ``."""
    active = active_suspects(storage_layout(project).suspects_file(), now)
    if not active:
        return Exclusion()
    try:
        nodes = slurm_nodes(env)
        partition = project.cluster.partition or default_partition(env)
    except LaunchError as err:
        return Exclusion(sorted(active), [f"excluding suspect node(s) {', '.join(active)} unchecked: Slurm could not "
                                          f"be asked whether they are still the machines blamed ({err})"])
    return decide(active, nodes, partition, nodes_needed)


def decide(active: Mapping[str, Suspect], nodes: Mapping[str, SlurmNode], partition: str | None,
           nodes_needed: int) -> Exclusion:
    """The rules of the module docstring on what Slurm said: ``nodes`` by name, ``partition`` the job's (None:
    every node counts)."""
    notes: list[str] = []
    keep: list[Suspect] = []
    for name, suspect in sorted(active.items()):
        node = nodes.get(name)
        if node is None:
            notes.append(f"suspect node {name} is not a node of this Slurm cluster: not excluded "
                         f"(`clustertrain nodes clear PROJECT {name}` removes it)")
        elif not still_applies(suspect, node.host):
            notes.append(f"suspect node {name} not excluded: Slurm runs it on {node.host} now, not on {suspect.host} "
                         f"that was blamed ({describe(suspect)}): the instance was replaced")
        else:
            keep.append(suspect)
    if not keep:
        return Exclusion([], notes)
    names = [s.node for s in keep]
    members = [n for n, node in nodes.items() if partition is None or partition in node.partitions]
    left = len(set(members) - set(names))
    if left < nodes_needed:
        where = f"partition {partition}" if partition else "the cluster"
        notes.append(f"suspect node(s) {', '.join(names)} not excluded: {where} has {len(members)} nodes, "
                     f"{left} without them, and the job needs {nodes_needed}; check them, then "
                     f"`clustertrain nodes clear PROJECT {' '.join(names)}`")
        return Exclusion([], notes)
    notes.append("excluding suspect node(s): " + "; ".join(f"{s.node} ({describe(s)})" for s in keep))
    return Exclusion(names, notes)


def describe(suspect: Suspect) -> str:
    """``hang, job 42: <reason>`` — what blamed the node, in a few words."""
    job = f", job {suspect.job}" if suspect.job else ""
    return f"{suspect.source}{job}: {suspect.reason}" if suspect.reason else f"{suspect.source}{job}"


def slurm_nodes(env: Mapping[str, str] | None = None) -> dict[str, SlurmNode]:
    """Every node of ``scontrol show node -o``: its NodeHostName and partitions."""
    text = run_slurm(["scontrol", "show", "node", "-o"], env, timeout=SCONTROL_TIMEOUT_S).stdout
    return parse_node_hosts(text)


def parse_node_hosts(text: str) -> dict[str, SlurmNode]:
    out: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        kv = parse_kv_line(line)
        if "NodeName" in kv:
            parts = tuple(p for p in kv.get("Partitions", "").split(",") if p)
            out[kv["NodeName"]] = SlurmNode(kv.get("NodeHostName") or kv["NodeName"], parts)
    return out


def default_partition(env: Mapping[str, str] | None = None) -> str | None:
    """The partition a job without ``--partition`` goes to (``Default=YES``), None when there is none."""
    text = run_slurm(["scontrol", "show", "partition", "-o"], env, timeout=SCONTROL_TIMEOUT_S).stdout
    for line in text.splitlines():
        kv = parse_kv_line(line)
        if kv.get("Default") == "YES":
            return kv.get("PartitionName")
    return None
