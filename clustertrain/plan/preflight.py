"""``plan_findings(project)``: the planner's part of ``clustertrain check`` — is each model feasible for
what its framework implements, and what did the plan have to assume?

======================================================  =======  ========================================
finding                                                 level    path
======================================================  =======  ========================================
a model is infeasible (memory, batch divisibility,      error    the field behind the reason, e.g.
tp/pp split, deadline, pinned node count)                        ``models[6].model``, ``models[0].training.global_batch``
the models do not fit the cluster together              error    ``plan.cluster_nodes``
a share of a node with ``plan.node_sharing`` (Slurm     error    ``plan.node_sharing``
jobs run on whole nodes)
a planned setting the framework lacks (planned with     warning  the setting, e.g. ``plan.zero_stage``
the framework's own instead)
no instance type to plan a GPU project with             warning  ``cluster.instance_type``
no price for the project's region                       warning  ``plan.price``
======================================================  =======  ========================================

:func:`submit_blockers` is the subset ``submit`` refuses on: the errors of the models it submits.
No network, no file written; a project file mistake becomes an error finding, never an exception.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustertrain.errors import ClusterTrainError
from clustertrain.findings import Finding

if TYPE_CHECKING:
    from clustertrain.plan.plan import Plan
    from clustertrain.project import Project

#: reason prefix -> the field (relative to models[i]) that it is about
_REASON_FIELDS = (
    ("does not fit", "model", "shrink the model (model.layers/hidden) or micro_batch, use GPUs with more memory, or a "
                              "framework that shards or splits the model; `clustertrain plan PROJECT` shows the memory per GPU"),
    ("global_batch", "training.global_batch", "make global_batch a multiple of micro_batch x dp for the planned node count"),
    ("world size", "plan.tp", "choose tp x pp that divides the GPUs of the planned node count"),
    ("tp=", "plan.tp", "choose a tp that divides heads and ffn_dim"),
    ("pp=", "plan.pp", "choose a pp that divides layers"),
    ("takes ", "plan.deadline_days", "raise the deadline, the node count or the MFU assumption"),
    ("plan.nodes=", "plan.nodes", "lower models[].plan.nodes to at most plan.cluster_nodes"),
    ("no count from", "plan", "`clustertrain plan PROJECT` lists why each count fails"),
)


def reason_field(index: int, reason: str) -> tuple[str, str]:
    """(project-file field, fix) for one infeasibility reason of model ``index``."""
    for prefix, field, fix in _REASON_FIELDS:
        if reason.startswith(prefix):
            return f"models[{index}].{field}", fix
    return f"models[{index}]", "see the reason; `clustertrain plan PROJECT` shows the plan"


def plan_findings(project: "Project", plan: "Plan | None" = None) -> list[Finding]:
    """Every finding of the plan of ``project`` (table in the module docstring)."""
    if plan is None:
        try:
            from clustertrain.plan.plan import make_plan

            plan = make_plan(project)
        except ClusterTrainError as err:
            return [Finding("error", "plan", str(err), "fix the field it names")]
    out: list[Finding] = []
    index = {m.name: i for i, m in enumerate(project.models)}
    for m in plan.models:
        i = index[m.name]
        for reason in m.reasons:
            field, fix = reason_field(i, reason)
            out.append(Finding("error", field, f"{m.name} is infeasible for its framework ({m.framework}): {reason}", fix))
        out += _fraction(project, i, m)
    for problem in plan.problems:
        if problem.startswith("cluster.instance_type"):
            out.append(Finding("warning", "cluster.instance_type", problem.split(";")[0],
                               "set cluster.instance_type, e.g. p5e.48xlarge, to check memory, time and cost"))
        else:
            out.append(Finding("error", "plan.cluster_nodes", problem, "raise plan.cluster_nodes or train fewer models at once"))
    grouped: dict[tuple, list[str]] = {}
    for adj in plan.adjustments:
        grouped.setdefault((adj.field, str(adj.asked), str(adj.used), adj.framework), []).append(adj.model)
    for (field, _, used, framework), models in grouped.items():
        adj = next(a for a in plan.adjustments if a.field == field)
        whom = "every model" if len(models) == len(plan.models) > 1 else ", ".join(models)
        out.append(Finding("warning", field, f"{adj} ({whom})",
                           f"remove {field} (the {framework} framework trains with {used}), or use a framework that implements it"))
    if plan.cluster.price_note:
        out.append(Finding("warning", "plan.price", plan.cluster.price_note.split("; set ")[0],
                           f"set plan.price (per_hour, region: {plan.cluster.region}, date, source) from your price list"))
    return out


def _fraction(project: "Project", index: int, m) -> list[Finding]:
    if project.cluster.backend != "slurm" or m.nodes is None or float(m.nodes).is_integer() or project.models[index].plan.nodes:
        return []
    return [Finding("error", "plan.node_sharing", f"{m.name} is planned on {m.gpus} GPUs ({m.nodes:g} nodes), but a Slurm "
                    "job of clustertrain runs on whole nodes", "set plan.node_sharing: false, or pin models[].plan.nodes")]


def submit_blockers(project: "Project", models: list[str] | None = None, plan: "Plan | None" = None) -> list[Finding]:
    """The errors that stop ``submit`` for ``models`` (default: all): each infeasible model, a model's share
    of a node, and plan-level errors (the models do not fit the cluster together)."""
    chosen = set(models or [m.name for m in project.models])
    names = {f"models[{i}]": m.name for i, m in enumerate(project.models)}
    out = []
    for f in plan_findings(project, plan):
        if f.level != "error":
            continue
        owner = next((name for prefix, name in names.items() if f.path == prefix or f.path.startswith(prefix + ".")), None)
        if owner is None or owner in chosen:
            out.append(f)
    return out
