"""Feasibility of one model on a number of GPUs, and the allocation of a cluster's nodes across
models so that they finish as close together as possible.

Time: training FLOPs = flops_per_token x tokens (the trainer's MFU formula); time on g GPUs =
FLOPs / (g x peak x MFU). Allocation: every model gets a count of whole nodes (or GPUs with
node sharing) that is valid for it — world size divisible by tp x pp, global_batch divisible by
micro_batch x dp, memory fits, deadline met; the smallest makespan T is found over all candidate
finish times (the least T for which the per-model minimum counts fit the cluster); nodes still
free then go one valid step at a time to the model that finishes last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clustertrain.plan.frameworks import BUILTIN, Framework
from clustertrain.plan.memory import GiB, Layout, MemoryEstimate, estimate_memory, memory_budget, structure_problems
from clustertrain.plan.shape import ModelShape

DAY = 86400.0


@dataclass(frozen=True)
class ModelSpec:
    """Everything the planner needs about one model, as plain values (no project file needed)."""

    name: str
    shape: ModelShape
    tokens: int
    global_batch: int
    micro_batch: int = 1
    tp: int = 1
    pp: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    flash_attention: bool = True
    precision: str = "bf16"
    bf16_weights: str = "bf16"
    mfu: float = 0.40
    fixed_nodes: int | None = None
    deadline_days: float | None = None
    framework: Framework = BUILTIN

    @property
    def total_flops(self) -> float:
        return self.shape.flops_per_token() * self.tokens


@dataclass(frozen=True)
class Hardware:
    gpus_per_node: int                 # ranks per node (CPU workers when there is no GPU)
    gpu_memory_gib: float | None       # per rank; None = unknown (no memory check)
    peak_flops: float | None           # per rank; None = unknown (no time estimate)
    headroom: float = 0.10
    framework_gib: float = 3.0


@dataclass
class Evaluation:
    """One model on ``gpus`` ranks: layout, memory, time, and why it is infeasible (if it is)."""

    gpus: int
    layout: Layout | None
    memory: MemoryEstimate | None
    budget_bytes: int | None
    seconds: float | None
    step_seconds: float | None
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons


def evaluate(spec: ModelSpec, hw: Hardware, gpus: int) -> Evaluation:
    reasons = structure_problems(spec.shape, spec.tp, spec.pp)
    mp = spec.tp * spec.pp
    nodes = gpus / hw.gpus_per_node
    where = f"{nodes:g} node(s) x {hw.gpus_per_node} = {gpus} GPUs"
    layout = None
    if gpus % mp:
        reasons.append(f"world size {where} is not divisible by tp x pp = {mp}")
    else:
        dp = gpus // mp
        if spec.global_batch % (spec.micro_batch * dp):
            reasons.append(
                f"global_batch {spec.global_batch} is not a multiple of micro_batch x dp = {spec.micro_batch} x {dp} on {where}"
            )
        layout = Layout(
            tp=spec.tp, pp=spec.pp, dp=dp, micro_batch=spec.micro_batch,
            grad_accum=max(1, spec.global_batch // (spec.micro_batch * dp)), zero_stage=spec.zero_stage,
            recompute=spec.recompute, sequence_parallel=spec.sequence_parallel and spec.tp > 1,
            flash_attention=spec.flash_attention, precision=spec.precision, bf16_weights=spec.bf16_weights,
        )
    memory = budget = None
    if layout is not None and not structure_problems(spec.shape, spec.tp, spec.pp):
        memory = estimate_memory(spec.shape, layout, hw.framework_gib)
        if hw.gpu_memory_gib is not None:
            budget = memory_budget(hw.gpu_memory_gib, hw.headroom)
            if memory.total_bytes > budget:
                reasons.append(
                    f"does not fit: needs {memory.total_bytes / GiB:.1f} GiB per GPU (pipeline stage {memory.stage}) but "
                    f"{budget / GiB:.1f} GiB is usable ({hw.gpu_memory_gib:g} GiB less {hw.headroom:.0%} headroom); "
                    f"{_memory_hint(spec)}"
                )
    seconds = step = None
    if hw.peak_flops:
        seconds = spec.total_flops / (gpus * hw.peak_flops * spec.mfu)
        step = spec.shape.flops_per_token() * spec.global_batch * spec.shape.seq_len / (gpus * hw.peak_flops * spec.mfu)
        if spec.deadline_days is not None and seconds > spec.deadline_days * DAY:
            reasons.append(f"takes {seconds / DAY:.1f} days on {where}, over the deadline of {spec.deadline_days:g} days")
    return Evaluation(gpus, layout, memory, budget, seconds, step, reasons)


def _memory_hint(spec: ModelSpec) -> str:
    """What could make the model fit, among what its framework implements."""
    fw = spec.framework
    tips = []
    if any(z > spec.zero_stage for z in fw.zero_stages):
        tips.append(f"zero_stage {min(z for z in fw.zero_stages if z > spec.zero_stage)}")
    if spec.recompute != "full" and any(r not in ("none", spec.recompute) for r in fw.recompute):
        tips.append("recompute: " + ("selective" if spec.recompute == "none" and "selective" in fw.recompute else "full"))
    if any(t > spec.tp for t in fw.tp):
        tips.append(f"tp {min(t for t in fw.tp if t > spec.tp)}")
    elif any(p > spec.pp for p in fw.pp):
        tips.append(f"pp {min(p for p in fw.pp if p > spec.pp)}")
    if spec.micro_batch > 1:
        tips.append("a smaller micro_batch")
    if tips:
        return "try " + ", ".join(tips)
    lacks = fw.lacks()
    return (f"the {fw.name} framework has no {lacks}: " if lacks else "") + "use a smaller model or GPUs with more memory"


@dataclass
class Allocation:
    units: dict[str, int]                   # model name -> units (nodes, or GPUs with node sharing)
    evaluations: dict[str, Evaluation]
    infeasible: dict[str, list[str]]        # model name -> reasons
    problems: list[str]                     # plan-level problems
    idle_units: int


def _why_never(spec: ModelSpec, evals: dict[int, Evaluation], total: int, unit: str) -> list[str]:
    structural = structure_problems(spec.shape, spec.tp, spec.pp)
    if structural:
        return structural
    memory_only = [u for u, ev in evals.items() if all(r.startswith("does not fit") for r in ev.reasons)]
    if memory_only:
        ev = evals[max(memory_only)]
        return [f"{ev.reasons[0]} (even on {max(memory_only)} {unit}s, the largest count that divides evenly)"]
    deadline_only = [u for u, ev in evals.items() if all("deadline" in r for r in ev.reasons)]
    if deadline_only:
        return [f"{evals[max(deadline_only)].reasons[0]}; the cluster has {total} {unit}s"]
    return [f"no count from 1 to {total} {unit}s is valid: {evals[total].reasons[0]}"]


def allocate(specs: list[ModelSpec], hw: Hardware, total_units: int, unit_gpus: int) -> Allocation:
    """Allocate ``total_units`` units of ``unit_gpus`` GPUs (a node, or 1 GPU with node sharing)."""
    unit = "node" if unit_gpus == hw.gpus_per_node else "GPU"
    valid: dict[str, dict[int, Evaluation]] = {}
    infeasible: dict[str, list[str]] = {}
    problems: list[str] = []
    for spec in specs:
        if spec.fixed_nodes is not None:
            units = spec.fixed_nodes * hw.gpus_per_node // unit_gpus
            if units > total_units:
                infeasible[spec.name] = [f"plan.nodes={spec.fixed_nodes} is more nodes than the cluster has ({total_units * unit_gpus // hw.gpus_per_node})"]
                continue
            ev = evaluate(spec, hw, units * unit_gpus)
            if ev.ok:
                valid[spec.name] = {units: ev}
            else:
                infeasible[spec.name] = ev.reasons
            continue
        evals = {u: evaluate(spec, hw, u * unit_gpus) for u in range(1, total_units + 1)}
        ok = {u: ev for u, ev in evals.items() if ev.ok}
        if ok:
            valid[spec.name] = ok
        else:
            infeasible[spec.name] = _why_never(spec, evals, total_units, unit)

    names = list(valid)
    minimum = {n: min(valid[n]) for n in names}
    if sum(minimum.values()) > total_units:
        need = ", ".join(f"{n} {u}" for n, u in minimum.items())
        problems.append(
            f"the feasible models need at least {sum(minimum.values())} {unit}s together ({need}) but the cluster has {total_units}"
        )
        return Allocation({}, {}, infeasible, problems, total_units)

    def finish(name: str, u: int) -> float:
        s = valid[name][u].seconds
        return s if s is not None else 0.0

    def counts_for(limit: float) -> dict[str, int] | None:
        out = {}
        for n in names:
            fits = [u for u in sorted(valid[n]) if finish(n, u) <= limit * (1 + 1e-9)]
            if not fits:
                return None
            out[n] = fits[0]
        return out if sum(out.values()) <= total_units else None

    candidates = sorted({finish(n, u) for n in names for u in valid[n]})
    lo, hi = 0, len(candidates) - 1
    chosen = dict(minimum)
    while lo <= hi and candidates:
        mid = (lo + hi) // 2
        got = counts_for(candidates[mid])
        if got is not None:
            chosen, hi = got, mid - 1
        else:
            lo = mid + 1
    free = total_units - sum(chosen.values())
    while free > 0:
        growable = [(finish(n, chosen[n]), n) for n in names
                    if any(chosen[n] < u <= chosen[n] + free for u in valid[n])]
        if not growable:
            break
        _, n = max(growable)
        nxt = min(u for u in valid[n] if u > chosen[n])
        free -= nxt - chosen[n]
        chosen[n] = nxt
    return Allocation(chosen, {n: valid[n][chosen[n]] for n in names}, infeasible, problems, free)

