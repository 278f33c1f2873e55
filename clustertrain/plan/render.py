"""``render_plan(plan, format)``: a Plan as a rich table, JSON or Markdown (a string in each case).

JSON format (``version: 2``): ``{"version", "project", "feasible", "cluster": ClusterTotals fields,
"models": [ModelPlan fields + "feasible"], "problems": [...], "assumptions": [...]}``; each model's
``architecture`` is its shape in words (the table's and Markdown's "architecture" lines, models that share one
listed together: layers, widths, Llama-style / GPT-style / custom and each option); bytes are
integers, times in seconds/days, money in USD. Each model carries ``framework``, ``parallelism`` (its
section as written, ``param_dtype`` resolved), ``layout`` (the resolved ``ParallelLayout`` on its
planned node count: world, dp, tp, pp, zero_stage, ... — null when no count is valid), ``layout_text``
and ``memory`` (rank 0: ``params`` elements and bytes of weights, grads, optimizer, activations,
buffers, framework, total); the cluster carries ``region`` and ``price_note`` (why no price applies,
when none does). Version 2 replaced version 1's ``tp``/``pp``/``zero_stage``/``recompute``/
``bf16_weights``/``adjustments`` by ``parallelism`` and ``layout``. A Megatron-LM model (``framework:
"megatron"``) also carries ``microbatches`` (per step and data-parallel rank), ``pipeline_bubble`` (a fraction
of the step's compute, included in its step time) and ``memory_stage`` (the most loaded pipeline stage whose
``memory`` is shown: ``first`` or ``last``); its ``layout`` adds ``virtual_stages`` and its ``layout_text`` is in
Megatron's words. A built-in trainer's model with ``pp > 1`` carries ``microbatches``, ``pipeline_bubble`` and
``memory_pp_rank`` (the most loaded pipeline rank, whose ``memory`` is shown; its ``layout_text`` names its stages,
layers and micro-batches in flight); with dp > 1 ``dp_traffic`` (:mod:`clustertrain.plan.traffic`: what its
data-parallel collectives bring into each node per step, the seconds at the node's network bandwidth and the step's
compute seconds; ``grad_sync``: ``per_microbatch`` or ``per_step``), and for a FSDP2 model without pipeline stages
planned with ``grad_sync: per_microbatch`` ``per_step`` (what ``per_step`` would need — ``memory_bytes``, ``fits`` — and
send: ``node_bytes``, ``seconds``; the table suggests it where it fits and sends less). The table and Markdown add a ``framework`` column when a model is not the built-in trainer's,
and under "time per step" a line for each Megatron or pipelined model (compute + bubble) and each model whose
data-parallel group crosses nodes (its traffic against its compute).

A project without GPUs (``cluster.gpus_per_node: 0``, CPU workers) is shown in its own units in the table and Markdown:
``ranks`` for ``GPUs``, ``GiB/rank`` for ``GiB/GPU``, ``CPU-h`` (ranks x wall-clock hours) for ``GPU-h`` and "memory
per rank" for "memory per GPU"; the JSON keys stay (``gpus``, ``gpu_hours``: ranks and CPU-hours there). The table is
``width`` characters wide (:data:`TABLE_WIDTH` by default; ``clustertrain plan`` passes :func:`terminal_width`),
its cells wrapped, never cut.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from typing import Literal

from clustertrain.plan.plan import ModelPlan, Plan

Format = Literal["table", "json", "markdown"]
FORMATS = ("table", "json", "markdown")
GiB = 1024**3
#: the table's width when none is given (and ``plan``'s on a pipe or file without ``COLUMNS``)
TABLE_WIDTH = 160


def render_plan(plan: Plan, format: Format = "table", width: int | None = None) -> str:
    if format == "json":
        return _json(plan)
    if format == "markdown":
        return _markdown(plan)
    if format == "table":
        return _table(plan, width or TABLE_WIDTH)
    raise ValueError(f"unknown format {format!r}; valid: {', '.join(FORMATS)}")


def _json(plan: Plan) -> str:
    models = []
    for m in plan.models:
        d = dataclasses.asdict(m)
        d["feasible"] = m.feasible
        models.append(d)
    doc = {"version": 2, "project": plan.project, "feasible": plan.feasible, "cluster": dataclasses.asdict(plan.cluster),
           "models": models, "shared_nodes": plan.shared_nodes, "problems": plan.problems, "assumptions": plan.assumptions}
    return json.dumps(doc, indent=2)


def _num(x: float | None, fmt: str = ",.0f", none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def _memory_text(gib: float | None) -> str:
    if gib is None:
        return "-"
    return f"{gib / 1024:,.0f} TiB ({gib:,.0f} GiB)" if gib >= 10 * 1024 else f"{gib:,.0f} GiB"


def cluster_lines(plan: Plan) -> list[tuple[str, str]]:
    c = plan.cluster
    rows = [
        ("instance", f"{c.instance_type or '(not set)'} x {c.nodes} node(s)" + (f" ({c.gpu_model})" if c.gpu_model else "")),
        ("GPUs", f"{c.gpus:,}" + (f" ({c.gpus_per_node} per node, {c.gpu_memory_gib:g} GiB each)" if c.gpu_memory_gib else "")
         if c.gpus_per_node else f"none: {c.ranks_per_node} CPU worker(s) per node (gloo)"),
        ("vCPUs", _num(c.vcpus)),
        ("memory", _memory_text(c.memory_gib)),
        ("price", f"${c.cost_per_hour:,.2f}/h (${c.price_per_hour:,.2f}/h per node, {c.price_region}, {c.price_date})"
         if c.cost_per_hour is not None else (c.price_note or "-")),
        ("mode", "models train at the same time" if c.mode == "concurrent" else "models train one after another"),
    ]
    if c.mode == "concurrent":
        rows.append(("idle nodes", f"{c.idle_nodes:g}"))
    if c.days is not None:
        cost = f", ${c.cost_usd:,.0f} for the cluster" if c.cost_usd is not None else ""
        weeks = f" ({c.days / 7:.1f} weeks)" if c.days >= 7 else ""
        rows.append(("duration", f"{duration(c.days)}{weeks} until the last model finishes{cost}"))
    return rows


def architecture_lines(plan: Plan) -> list[str]:
    """One line per architecture: the models that share it, then :meth:`ModelShape.describe
    <clustertrain.core.model_shape.ModelShape.describe>` (``model-1, model-2: 32 layers, hidden 4096, 32 heads, ffn
    14336; Llama-style: rope, GQA 8 kv heads, RMSNorm, SwiGLU, no bias, untied``)."""
    shared: dict[str, list[str]] = {}
    for m in plan.models:
        if m.architecture:
            shared.setdefault(m.architecture, []).append(m.name)
    return [f"{', '.join(names)}: {text}" for text, names in shared.items()]


def shared_node_lines(plan: Plan) -> list[str]:
    """One line per shared node (models on shares of a node, :func:`clustertrain.plan.packing.pack`): its models with
    their GPUs and hourly cost shares, the GPUs, memory and CPUs they ask for against the node's; then the cost shares'
    sum beside the cluster's hourly cost."""
    out = []
    for n in plan.shared_nodes:
        costs = n["cost_per_hour"]
        who = ", ".join(f"{name} ({m.gpus} GPU{'s' if m.gpus != 1 else ''}"
                        + (f", ${costs[name]:,.2f}/h" if costs.get(name) is not None else "") + ")"
                        for name in n["models"] for m in [plan.model(name)])
        used = [f"GPUs {n['gpus_used']}/{n['gpus']}"]
        if n["mem_mb"] is not None and n["mem_mb_used"] is not None:
            used.append(f"memory {n['mem_mb_used'] / 1024:,.0f}/{n['mem_mb'] / 1024:,.0f} GiB")
        if n["cpus"] is not None and n["cpus_used"] is not None:
            used.append(f"vCPUs {n['cpus_used']}/{n['cpus']}")
        out.append(f"shared node {n['node']}: {who}; {', '.join(used)}")
    shares = [m.cost_per_hour for m in plan.models if m.cost_per_hour is not None]
    if out and shares and plan.cluster.cost_per_hour is not None:
        idle = plan.cluster.cost_per_hour - sum(shares)
        out.append(f"cost shares: ${sum(shares):,.2f}/h of the cluster's ${plan.cluster.cost_per_hour:,.2f}/h"
                   + (f" (${idle:,.2f}/h idle nodes)" if idle > 0.005 else ""))
    return out


def _allocation_summary(plan: Plan) -> str:
    counts: dict[float, int] = {}
    for m in plan.models:
        if m.shared_node is not None:
            continue
        if m.nodes is not None:
            counts[m.nodes] = counts.get(m.nodes, 0) + 1
    return " + ".join(f"{n} x {nodes:g}" for nodes, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


MODEL_COLUMNS = ("model", "params", "tokens", "nodes", "GPUs", "layout", "GiB/GPU", "fits", "step", "time", "GPU-h", "cost")
MEMORY_COLUMNS = ("model", "layout", "params", "grads", "AdamW", "activations", "buffers", "framework", "total", "usable")


def size(n: float | None) -> str:
    """Bytes as ``1.2 GiB`` / ``34.5 MiB`` / ``120 KiB``."""
    if n is None:
        return "-"
    if n == 0:
        return "0"
    for unit, scale in (("GiB", GiB), ("MiB", 1024**2)):
        if n >= scale or unit == "MiB" and n >= 1024**2 / 10:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1024:.0f} KiB"


def duration(days: float | None) -> str:
    if days is None:
        return "-"
    if days >= 1:
        return f"{days:.1f} d"
    if days * 24 >= 1:
        return f"{days * 24:.1f} h"
    return f"{days * 1440:.1f} min"


def terminal_width(default: int = TABLE_WIDTH) -> int:
    """The width ``clustertrain plan`` fits its tables to, as ``status`` does: the terminal's; on a pipe or file
    ``COLUMNS`` when it is set, else ``default``."""
    from rich.console import Console

    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return console.width
    return default


#: the columns whose words a narrow table wraps (the others keep their figures on one line)
WRAPPED = ("model", "layout", "fits")
#: the order a table too wide for the terminal leaves columns out in (as ``status`` does), the first first; the
#: columns not named here (model, GPUs, GiB/GPU, time, GPU-h, cost, total, usable; a CPU project's ranks, GiB/rank,
#: CPU-h) always stay
DROP_ORDER = ("tokens", "params", "step", "framework", "fits", "nodes", "layout", "grads", "buffers", "AdamW",
              "activations")


def fit_table(title: str, columns: "tuple[str, ...]", rows: list[list[str]], width: int):
    """A rich table of ``rows`` no wider than ``width``: the words of :data:`WRAPPED` columns wrap; when the figures
    still do not fit on one line each, columns are left out in :data:`DROP_ORDER` and named in the caption."""
    from rich.table import Table

    def need(i: int) -> int:  # a column's narrowest width: its longest word (wrapped) or cell, plus its padding
        cells = [columns[i], *(r[i] for r in rows)]
        if columns[i] in WRAPPED:
            return max(len(w) for c in cells for w in c.split()) + 3
        return max(len(c) for c in cells) + 3

    shown = list(range(len(columns)))
    for name in DROP_ORDER:
        if sum(need(i) for i in shown) + 1 <= width:
            break
        shown = [i for i in shown if columns[i] != name]
    hidden = [c for i, c in enumerate(columns) if i not in shown]
    caption = f"not shown at this width: {', '.join(hidden)} (widen the terminal, or --format json)" if hidden else None
    # every column at its narrowest, then the room left widens the wrapped ones a character at a time, up to their
    # longest cell (rich's own shrinking can overshoot the width by a character)
    widths = {i: need(i) - 3 for i in shown}
    room = width - 1 - sum(need(i) for i in shown)
    longest = {i: max(len(c) for c in (columns[i], *(r[i] for r in rows))) for i in shown}
    while room > 0 and any(widths[i] < longest[i] for i in shown if columns[i] in WRAPPED):
        for i in shown:
            if room > 0 and columns[i] in WRAPPED and widths[i] < longest[i]:
                widths[i] += 1
                room -= 1
    table = Table(title=title, caption=caption, caption_justify="left")
    for i in shown:
        table.add_column(columns[i], overflow="fold", no_wrap=columns[i] not in WRAPPED, width=widths[i])
    for r in rows:
        table.add_row(*(r[i] for i in shown))
    return table


#: a CPU project's words for the GPU columns (:data:`MODEL_COLUMNS`)
CPU_WORDS = {"GPUs": "ranks", "GiB/GPU": "GiB/rank", "GPU-h": "CPU-h"}


def _cpu(plan: Plan) -> bool:
    return plan.cluster.gpus_per_node == 0


def model_columns(plan: Plan) -> tuple[str, ...]:
    """:data:`MODEL_COLUMNS`, with ``framework`` after ``model`` when a model is not the built-in trainer's, in a CPU
    project's words (:data:`CPU_WORDS`) when it has no GPUs."""
    columns = tuple(CPU_WORDS.get(c, c) for c in MODEL_COLUMNS) if _cpu(plan) else MODEL_COLUMNS
    if _framework_column(plan):
        return (columns[0], "framework", *columns[1:])
    return columns


def _framework_column(plan: Plan) -> bool:
    return any(m.framework != "builtin" for m in plan.models)


def _row(plan: Plan, m: ModelPlan) -> list[str]:
    row = model_row(m)
    return [row[0], m.framework, *row[1:]] if _framework_column(plan) else row


def _memory_title(plan: Plan) -> str:
    per = "rank" if _cpu(plan) else "GPU"
    if _framework_column(plan) or any(m.parallelism.get("pp", 1) > 1 for m in plan.models):
        return f"memory per {per} (the most loaded rank)"
    return f"memory per {per} (rank 0, the most loaded)"


def time_lines(plan: Plan) -> list[str]:
    """A Megatron or pipelined model's step: compute at the assumed MFU plus the pipeline bubble (pp - 1) / (vp x m);
    a model's data-parallel traffic into each node per step against its compute (when it crosses nodes)."""
    out = []
    for m in plan.models:
        if m.step_time_s is not None and m.pipeline_bubble is not None:
            out.append(_bubble_line(m))
        if m.dp_traffic is not None and m.dp_traffic["seconds"] is not None:
            out.append(_traffic_line(m))
        if m.per_step is not None and m.per_step["fits"] and m.dp_traffic is not None \
                and (m.per_step["node_bytes"] or 0) < m.dp_traffic["node_bytes"]:
            out.append(_per_step_line(m))
    return out


def _per_step_line(m: ModelPlan) -> str:
    """``model-1: try parallelism.grad_sync: per_step — one gradient reduce-scatter per step instead of 14: 36.0 GB into
    each node per step instead of 503.4 GB (0.09s, against 0.43s of compute per micro-batch), 57.5 GiB per GPU (fits)``
    (the flagship's model-1 before it took the suggestion)."""
    t, alt = m.dp_traffic, m.per_step
    secs = ""
    if alt.get("seconds") is not None:  # the one reduce-scatter hides behind the last micro-batch's backward alone
        secs = f" ({alt['seconds']:.2f}s"
        if t.get("compute_seconds"):
            secs += f", against {t['compute_seconds'] / t['reduces']:.2f}s of compute per micro-batch"
        secs += ")"
    return (f"{m.name}: try parallelism.grad_sync: per_step — one gradient reduce-scatter per step instead of "
            f"{t['reduces']}: {alt['node_bytes'] / 1e9:,.1f} GB into each node per step instead of "
            f"{t['node_bytes'] / 1e9:,.1f} GB{secs}, {alt['memory_bytes'] / GiB:.1f} GiB per GPU (fits)")


def _bubble_line(m: ModelPlan) -> str:
    pp, vp = m.parallelism["pp"], m.parallelism.get("virtual_stages", 1)
    name = f"{m.name} (megatron)" if m.framework == "megatron" else m.name
    if pp == 1:
        return (f"{name}: {m.step_time_s:.2f}s per step at {m.mfu:.0%} MFU; no pipeline bubble (pp 1), "
                f"{m.microbatches} micro-batch(es) of {m.micro_batch} per data-parallel rank")
    compute = m.step_time_s / (1 + m.pipeline_bubble)
    return (f"{name}: {m.step_time_s:.2f}s per step = {compute:.2f}s compute at {m.mfu:.0%} MFU + "
            f"{m.step_time_s - compute:.2f}s pipeline bubble (pp {pp} - 1) / ({f'vp {vp} x ' if vp > 1 else ''}"
            f"{m.microbatches} micro-batches) = {m.pipeline_bubble:.1%}")


def _traffic_line(m: ModelPlan) -> str:
    """``model-1: data-parallel traffic 503.4 GB into each node per step (fsdp, 14 all-gathers (bf16) + 14
    reduce-scatters (fp32) over 14 micro-batches of 6.59B tp-local parameters) = 1.26s at 3200 Gbit/s, 21% of its
    6.07s compute`` (the flagship's model-1)."""
    t = m.dp_traffic
    if t["kind"] == "ddp":
        how = "1 all-reduce of the fp32 gradients per step"
    else:
        par = m.parallelism
        per = "per step" if t.get("grad_sync") == "per_step" or par.get("pp", 1) > 1 else f"over {t['reduces']} micro-batches"
        how = (f"{_count(t['gathers'], 'all-gather')} ({par['param_dtype']}) + {_count(t['reduces'], 'reduce-scatter')} "
               f"({par['reduce_dtype']}) {per}")
    share = t["seconds"] / t["compute_seconds"] if t.get("compute_seconds") else None
    return (f"{m.name}: data-parallel traffic {t['node_bytes'] / 1e9:,.1f} GB into each node per step ({t['kind']}, "
            f"{how} of {t['params'] / 1e9:.2f}B tp-local parameters) = {t['seconds']:.2f}s at {t['network_gbps']:g} Gbit/s"
            + (f", {share:.0%} of its {t['compute_seconds']:.2f}s compute" if share is not None else ""))


def _count(n: float, what: str) -> str:
    return f"{n:.3g} {what}" + ("" if n == 1 else "s")


def model_row(m: ModelPlan) -> list[str]:
    mem = m.memory or {}
    total = mem.get("total")
    fits = "-"
    if total is not None and m.memory_budget_bytes:
        margin = (m.memory_budget_bytes - total) / GiB
        fits = f"yes (+{margin:.1f})" if margin >= 0 else f"NO ({margin:.1f})"
    return [
        m.name, f"{m.params / 1e9:.2f}B" if m.params >= 1e8 else f"{m.params / 1e6:.2f}M",
        f"{m.tokens / 1e9:,.1f}B" if m.tokens >= 1e8 else f"{m.tokens:,}",
        (f"share of {m.shared_node}" if m.shared_node is not None else
         "-" if m.nodes is None else f"{m.nodes:g}" + (" (fixed)" if m.fixed else "")), _num(m.gpus),
        short_layout(m),
        "-" if total is None else f"{total / GiB:.1f}", fits,
        "-" if m.step_time_s is None else f"{m.step_time_s:.2f}s", duration(m.days), _num(m.gpu_hours, ",.0f" if (m.gpu_hours or 0) >= 10 else ".2f"),
        "-" if m.cost_usd is None else f"${m.cost_usd:,.0f}",
    ]


def short_layout(m: ModelPlan) -> str:
    """``fsdp 88`` / ``fsdp 44 x tp 2 +sp`` (the planned layout) or, when no count is valid, what was asked."""
    if m.layout_text:
        return m.layout_text.split(", ")[0]
    par = m.parallelism
    if m.framework == "megatron":
        vp = par.get("virtual_stages", 1)
        return f"tp {par['tp']} x pp {par['pp']}" + (f" (vp {vp})" if vp > 1 else "") + " x dp ?"
    kind = "fsdp" if par["zero_stage"] == 3 else "ddp"
    return f"{kind} ?" + (f" x tp {par['tp']}" + (" +sp" if par["sequence_parallel"] else "") if par["tp"] > 1 else "")


def memory_row(m: ModelPlan) -> list[str] | None:
    """Rank 0's memory: the model states counted from the layout's shards, then the allowances."""
    mem = m.memory
    if not mem:
        return None
    cells = [size(mem[k]) for k in ("weights", "grads", "optimizer", "activations", "buffers", "framework", "total")]
    return [m.name, m.layout_text or "-", *cells, size(m.memory_budget_bytes)]


def _verdict(plan: Plan) -> list[str]:
    out = []
    for p in plan.problems:
        out.append(f"problem: {p}")
    for m in plan.models:
        for r in m.reasons:
            out.append(f"infeasible: {m.name}: {r}")
    return out


def _table(plan: Plan, width: int = TABLE_WIDTH) -> str:
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=width, highlight=False, color_system=None, soft_wrap=True)
    console.print(f"plan for project {plan.project}")
    cluster = Table(show_header=False, box=None, pad_edge=False)
    for k, v in cluster_lines(plan):
        cluster.add_row(k, v)
    console.print(cluster)
    console.print(fit_table("models", model_columns(plan), [_row(plan, m) for m in plan.models], width))
    architectures = architecture_lines(plan)
    if architectures:
        console.print("architecture:")
        for line in architectures:
            console.print(f"  - {line}")
    rows = [r for r in (memory_row(m) for m in plan.models) if r]
    if rows:
        console.print(fit_table(_memory_title(plan), MEMORY_COLUMNS, rows, width))
    summary = _allocation_summary(plan)
    if summary:
        console.print(f"allocation: {summary} nodes")
    for line in shared_node_lines(plan):
        console.print(line)
    times = time_lines(plan)
    if times:
        console.print("time per step:")
        for line in times:
            console.print(f"  - {line}")
    for line in _verdict(plan):
        console.print(line)
    console.print("assumptions:")
    for a in plan.assumptions:
        console.print(f"  - {a}")
    console.print("feasible" if plan.feasible else "NOT feasible")
    return buf.getvalue()


def _markdown(plan: Plan) -> str:
    lines = [f"# Plan: {plan.project}", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in cluster_lines(plan)]
    columns = model_columns(plan)
    lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_row(plan, m)) + " |" for m in plan.models]
    architectures = architecture_lines(plan)
    if architectures:
        lines += ["", "Architecture:", ""] + [f"- {a}" for a in architectures]
    rows = [r for r in (memory_row(m) for m in plan.models) if r]
    if rows:
        title = _memory_title(plan)
        lines += ["", f"{title[0].upper()}{title[1:]}:", "", "| " + " | ".join(MEMORY_COLUMNS) + " |",
                  "|" + "---|" * len(MEMORY_COLUMNS)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    summary = _allocation_summary(plan)
    if summary:
        lines += ["", f"Allocation: {summary} nodes"]
    shared = shared_node_lines(plan)
    if shared:
        lines += ["", "Shared nodes:", ""] + [f"- {line}" for line in shared]
    times = time_lines(plan)
    if times:
        lines += ["", "Time per step:", ""] + [f"- {t}" for t in times]
    verdict = _verdict(plan)
    if verdict:
        lines += [""] + [f"- {v}" for v in verdict]
    lines += ["", "Assumptions:", ""] + [f"- {a}" for a in plan.assumptions]
    lines += ["", "**feasible**" if plan.feasible else "**NOT feasible**", ""]
    return "\n".join(lines)
