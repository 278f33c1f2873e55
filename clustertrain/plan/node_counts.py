"""``nodes_for(project) -> {model: nodes}``: how many nodes each model's job runs on — the one rule that
``submit`` (``#SBATCH --nodes``), the batch script's NCCL preset scale and the launch checks share.

In order:

1. ``models[].plan.nodes`` — a model that pins its node count gets it; ``models[].plan.gpus`` (a share of one
   node, :mod:`clustertrain.plan.packing`) is 1;
2. with ``plan.cluster_nodes`` (models train at the same time on a shared cluster): the planner's
   allocation (:func:`clustertrain.plan.allocate.allocate`), e.g. 6 x 11 + 1 x 14 of 80 nodes;
3. otherwise ``cluster.nodes``.

A model the plan cannot place (infeasible, or a fraction of a node with ``plan.node_sharing``) keeps
``cluster.nodes`` here; :func:`clustertrain.plan.preflight.submit_blockers` is what refuses it.
Nothing here imports torch: a plan of seven models takes a few milliseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clustertrain.plan.plan import Plan
    from clustertrain.project import Project


def nodes_for(project: "Project", plan: "Plan | None" = None) -> dict[str, int]:
    """Node count of every model's job (rules in the module docstring); ``plan``: an already made plan."""
    out: dict[str, int] = {}
    concurrent = project.plan.cluster_nodes is not None
    if concurrent and plan is None and any(m.plan.nodes is None and m.plan.gpus is None for m in project.models):
        from clustertrain.plan.plan import make_plan

        plan = make_plan(project)
    for entry in project.models:
        if entry.plan.nodes is not None or entry.plan.gpus is not None:  # pinned, or a share of one node
            out[entry.name] = project.job_nodes(entry)
            continue
        planned = plan.model(entry.name).nodes if (concurrent and plan is not None) else None
        if planned is not None and float(planned).is_integer() and planned >= 1:
            out[entry.name] = int(planned)
        else:
            out[entry.name] = project.cluster.nodes
    return out
