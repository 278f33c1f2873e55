"""When ParallelCluster runs each custom action, and what exists on the node at that moment — as data.

Boot sequence of a ParallelCluster 3.16 node (read from aws-parallelcluster 3.16.1: compute nodes
``pcluster/resources/compute_node/user_data.sh``; head node ``pcluster/templates/cluster_stack.py``,
cfn-init configSet ``default``; and the cookbook ``aws-parallelcluster-environment/recipes/config.rb``,
``aws-parallelcluster-slurm/recipes/config/config_head_node.rb``)::

    init              cinc  aws-parallelcluster-entrypoints::init
    OnNodeStart       fetch_and_run -preinstall      (custom action)
    config            cinc  aws-parallelcluster-entrypoints::config: RAID/mount of the instance store at
                      EphemeralVolume.MountDir, SharedStorage mounts (FSx, EBS, EFS), /opt/slurm;
                      on the head node slurmctld is started here
    OnNodeConfigured  fetch_and_run -postinstall     (custom action)
    finalize          cinc  aws-parallelcluster-entrypoints::finalize: slurmd starts on compute nodes
    OnNodeUpdated     fetch_and_run -postupdate      (head node, after `pcluster update-cluster`)

AWS docs: OnNodeStart runs "before any node deployment bootstrap action is started". An OnNodeStart
script that waits for ``/scratch`` or an FSx mount therefore never sees it, and the node is replaced.

:data:`PHASES` says what each phase adds per node kind; :data:`ACTIONS` says, for each script that
clustertrain generates, what it needs, what must not exist yet, and the hook it is attached to.
:func:`phase_findings` checks every ``CustomActions`` entry of a cluster config against both tables;
``build_cluster_config`` takes each hook from :data:`ACTIONS`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from clustertrain.core.findings import Finding

NodeKind = Literal["head", "compute"]

HEAD_SCRIPT = "head-node.sh"
COMPUTE_SCRIPT = "compute-node.sh"
SETUP_DIRS_SCRIPT = "setup-dirs.sh"

#: what can exist on a node during boot
RESOURCES = {
    "instance_role": "the instance profile's credentials (S3 through IAM)",
    "ephemeral_nvme": "the instance store mounted at LocalStorage.EphemeralVolume.MountDir",
    "shared_storage": "the SharedStorage mounts (FSx for Lustre, EBS, EFS)",
    "slurm_config": "/opt/slurm and its configuration",
    "slurmctld": "slurmctld running (head node)",
    "slurmd": "slurmd running: the node accepts jobs (compute node)",
}


@dataclass(frozen=True)
class Phase:
    name: str
    hook: str | None                 # the CustomActions key that runs in this phase, None for pcluster's own phases
    head: frozenset[str] = frozenset()     # what this phase adds on the head node
    compute: frozenset[str] = frozenset()  # ... and on a compute node

    def adds(self, node: NodeKind) -> frozenset[str]:
        return self.head if node == "head" else self.compute


PHASES: tuple[Phase, ...] = (
    Phase("init", None, head=frozenset({"instance_role"}), compute=frozenset({"instance_role"})),
    Phase("OnNodeStart", "OnNodeStart"),
    Phase("config", None,
          head=frozenset({"ephemeral_nvme", "shared_storage", "slurm_config", "slurmctld"}),
          compute=frozenset({"ephemeral_nvme", "shared_storage", "slurm_config"})),
    Phase("OnNodeConfigured", "OnNodeConfigured"),
    Phase("finalize", None, compute=frozenset({"slurmd"})),
    Phase("OnNodeUpdated", "OnNodeUpdated"),
)
HOOKS = tuple(p.hook for p in PHASES if p.hook)


@dataclass(frozen=True)
class NodeAction:
    """A generated script run as a custom action."""

    script: str
    node: NodeKind
    hook: str
    needs: frozenset[str]             # must exist when the script runs
    before: frozenset[str]            # must not exist yet (the script prepares for it)
    does: str


ACTIONS: tuple[NodeAction, ...] = (
    NodeAction(HEAD_SCRIPT, "head", "OnNodeConfigured",
               needs=frozenset({"instance_role", "shared_storage", "slurm_config", "slurmctld"}), before=frozenset(),
               does="enables Pyxis with container_scope=job in the NFS-shared /opt/slurm/etc (scontrol reconfigure), "
                    "fetches setup-dirs.sh from S3 and creates the job directories on the shared file systems, installs "
                    "Docker for image builds"),
    NodeAction(COMPUTE_SCRIPT, "compute", "OnNodeConfigured",
               needs=frozenset({"ephemeral_nvme"}), before=frozenset({"slurmd"}),
               does="puts Enroot's paths and the containers' cache directory on the local NVMe before slurmd accepts "
                    "container jobs"),
)
ACTION_BY_SCRIPT = {a.script: a for a in ACTIONS}


def action(script: str) -> NodeAction:
    return ACTION_BY_SCRIPT[script]


def available(node: NodeKind, hook: str, has: set[str] | frozenset[str] | None = None) -> frozenset[str]:
    """What exists on ``node`` when ``hook`` runs; ``has`` limits it to what the node's config provides
    (no EphemeralVolume: no ``ephemeral_nvme``; no SharedStorage: no ``shared_storage``)."""
    out: set[str] = set()
    for phase in PHASES:
        if phase.hook == hook:
            break
        out |= phase.adds(node)
    else:
        raise KeyError(f"unknown custom action hook {hook!r}; known: {', '.join(HOOKS)}")
    if has is not None:
        out = {r for r in out if r not in CONDITIONAL or r in has}
    return frozenset(out)


#: resources that exist only when the node's config asks for them
CONDITIONAL = ("ephemeral_nvme", "shared_storage")


def _phase_of(resource: str, node: NodeKind) -> str:
    return next((p.name for p in PHASES if resource in p.adds(node)), "never")


def _d(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _nodes(config: dict) -> Iterator[tuple[NodeKind, str, dict, set[str]]]:
    """(kind, YAML path, CustomActions, conditional resources the node's config provides) per node group."""
    shared = {"shared_storage"} if config.get("SharedStorage") else set()
    head = _d(config.get("HeadNode"))
    eph = {"ephemeral_nvme"} if "EphemeralVolume" in _d(head.get("LocalStorage")) else set()
    yield "head", "HeadNode.CustomActions", _d(head.get("CustomActions")), shared | eph
    queues = _d(config.get("Scheduling")).get("SlurmQueues")
    for i, q in enumerate(queues if isinstance(queues, list) else []):
        q = _d(q)
        local = _d(_d(q.get("ComputeSettings")).get("LocalStorage"))
        eph = {"ephemeral_nvme"} if "EphemeralVolume" in local else set()
        yield "compute", f"Scheduling.SlurmQueues[{i}].CustomActions", _d(q.get("CustomActions")), shared | eph


def _scripts(entry: Any) -> list[str]:
    """Script URLs of one hook entry: ``{Script: ...}`` or ``{Sequence: [{Script: ...}, ...]}``."""
    entry = _d(entry)
    items = [entry] + [_d(x) for x in (entry.get("Sequence") or []) if isinstance(entry.get("Sequence"), list)]
    return [x["Script"] for x in items if isinstance(x.get("Script"), str)]


def phase_findings(config: dict[str, Any]) -> list[Finding]:
    """Every custom action that is one of our scripts, checked against :data:`PHASES` and :data:`ACTIONS`."""
    out: list[Finding] = []
    for kind, base, hooks, has in _nodes(config):
        for hook, entry in hooks.items():
            if hook not in HOOKS:
                continue  # the schema reports unknown keys
            for url in _scripts(entry):
                act = ACTION_BY_SCRIPT.get(url.rsplit("/", 1)[-1])
                if act is None:
                    continue  # not a clustertrain script: we do not know what it needs
                path = f"{base}.{hook}"
                if act.node != kind:
                    out.append(Finding("error", path, f"{act.script} is the {act.node} node's script but runs on a {kind} node",
                                       f"attach it under {'HeadNode' if act.node == 'head' else 'Scheduling.SlurmQueues[i]'}.CustomActions.{act.hook}"))
                    continue
                there = available(kind, hook, has)
                for need in sorted(act.needs - there):
                    when = _phase_of(need, kind)
                    why = (f"ParallelCluster provides it in the {when} phase" if need not in CONDITIONAL or need in has
                           else "this node's config does not provide it")
                    fix = (f"attach it to {act.hook}" if act.hook != hook and need in available(kind, act.hook, has)
                           else "add LocalStorage.EphemeralVolume to this queue or do not attach the script to it"
                           if need == "ephemeral_nvme" else "add SharedStorage" if need == "shared_storage" else f"attach it to {act.hook}")
                    out.append(Finding("error", path, f"{act.script} ({act.does}) needs {RESOURCES[need]}, which does not exist "
                                       f"at {hook}: {why}", fix))
                for early in sorted(act.before & there):
                    out.append(Finding("error", path, f"{act.script} must run before {RESOURCES[early]} "
                                       f"(the {_phase_of(early, kind)} phase), but {hook} runs after it", f"attach it to {act.hook}"))
    return out
