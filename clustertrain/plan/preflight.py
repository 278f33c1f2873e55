"""``plan_findings(project)``: the planner's part of ``clustertrain check`` — is each model feasible with
its ``parallelism`` section, and what did the plan have to assume?

======================================================  =======  ========================================
finding                                                 level    path
======================================================  =======  ========================================
an impossible layout (a setting the framework lacks,    error    the field it names, e.g.
tp not splitting the model or a node, world size                 ``models[6].parallelism.tp``
≠ dp x tp)
a model does not fit in memory                          error    ``models[i].parallelism`` (the hint says
                                                                 what to set), or ``models[i].model``
                                                                 when no layout setting is left to try
other infeasibility (batch divisibility, deadline,      error    ``models[0].training.global_batch``,
pinned node count)                                               ``models[i].plan.deadline_days``...
the models do not fit the cluster together              error    ``plan.cluster_nodes``
a share of a node with ``plan.node_sharing`` (Slurm     error    ``plan.node_sharing``
jobs run on whole nodes)
no instance type to plan a GPU project with             warning  ``cluster.instance_type``
no price for the project's region                       warning  ``plan.price``
plan.tokens vs max_steps x global_batch x seq_len;      warning  (:mod:`clustertrain.plan.model_rules`)
identical models; no warmup at a large model's lr
======================================================  =======  ========================================

:func:`submit_blockers` is the subset ``submit`` refuses on: the errors of the models it submits.
No network, no file written; a project file mistake becomes an error finding, never an exception.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clustertrain.core.errors import ClusterTrainError
from clustertrain.core.findings import Finding

if TYPE_CHECKING:
    from clustertrain.plan.plan import Plan
    from clustertrain.project import Project

#: reason prefix -> the field (relative to models[i]) that it is about
_REASON_FIELDS = (
    ("global_batch", "training.global_batch", "make global_batch a multiple of micro_batch x dp for the planned node count"),
    ("takes ", "plan.deadline_days", "raise the deadline, the node count or the MFU assumption"),
    ("plan.nodes=", "plan.nodes", "lower models[].plan.nodes to at most plan.cluster_nodes"),
    ("no count from", "plan", "`clustertrain plan PROJECT` lists why each count fails"),
)


def reason_field(index: int, reason: str) -> tuple[str, str]:
    """(project-file field, fix) for one infeasibility reason of model ``index``."""
    if reason.startswith(f"models[{index}]."):  # a layout problem names its field: "models[6].parallelism.tp: ..."
        return reason.split(":", 1)[0], "change the field as the message says; `clustertrain plan PROJECT` shows the layout"
    if reason.startswith("does not fit"):
        if "try parallelism." in reason or "try these together: parallelism." in reason:  # settings that make it fit
            return f"models[{index}].parallelism", ("set what the message suggests in models[].parallelism; "
                                                     "`clustertrain plan PROJECT` shows the memory per GPU")
        return f"models[{index}].model", ("shrink the model (model.layers/hidden) or micro_batch, or use GPUs with more "
                                          "memory; `clustertrain plan PROJECT` shows the memory per GPU")
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
            out.append(Finding("error", field, f"{m.name} is infeasible ({m.framework} framework): {reason}", fix))
        out += _fraction(project, i, m)
    for problem in plan.problems:
        if problem.startswith("cluster.instance_type"):
            out.append(Finding("warning", "cluster.instance_type", problem.split(";")[0],
                               "set cluster.instance_type, e.g. p5e.48xlarge, to check memory, time and cost"))
        else:
            out.append(Finding("error", "plan.cluster_nodes", problem, "raise plan.cluster_nodes or train fewer models at once"))
    if plan.cluster.price_note:
        out.append(Finding("warning", "plan.price", plan.cluster.price_note.split("; set ")[0],
                           f"set plan.price (per_hour, region: {plan.cluster.region}, date, source) from your price list"))
    from clustertrain.plan.model_rules import model_rule_findings

    return out + model_rule_findings(project, plan)


def _fraction(project: "Project", index: int, m) -> list[Finding]:
    entry = project.models[index]
    if (project.cluster.backend != "slurm" or m.nodes is None or float(m.nodes).is_integer() or entry.plan.nodes
            or entry.plan.gpus is not None):
        return []
    return [Finding("error", "plan.node_sharing", f"{m.name} is planned on {m.gpus} GPUs ({m.nodes:g} nodes), but the "
                    "allocator's GPU counts are not jobs: a share of a node is asked for with models[].plan.gpus",
                    f"set models[{index}].plan.gpus: {m.gpus} (a share of one node), or plan.node_sharing: false")]


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
