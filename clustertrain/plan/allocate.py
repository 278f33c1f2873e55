"""Feasibility of one model on a number of GPUs, and the allocation of a cluster's nodes across
models so that they finish as close together as possible.

A model is planned with its ``models[].parallelism`` section — the one the trainer reads — resolved
for each candidate world size by :func:`clustertrain.core.parallel_layout.resolve_layout`. A count is *valid*
for a model when its framework implements the section, the layout splits the model
(``structure_problems``) and fits a node (``node_problems``) and the world (``world_problems``: world
size divisible by tp x pp, a fixed ``dp`` matching), ``global_batch`` is divisible by
``micro_batch x dp``, a pipeline schedule gets the micro-batches it needs (``microbatch_problems``: 1F1B at
least pp, interleaved a multiple of pp), the memory fits (:mod:`clustertrain.plan.memory`) and the deadline
is met. Layout problems name their field, e.g. ``models[6].parallelism.tp: ...``; the built-in trainer's
pipeline splits any layer count into up to that many stages (``clustertrain.core.parallel_layout.pipeline_problems``)
but cannot tie the embeddings across stages, Megatron's only layer counts pp divides.

Memory: the built-in trainer's model (:func:`clustertrain.plan.memory.estimate_memory`: its most loaded pipeline
rank with pp > 1), or for a Megatron-LM model Megatron's (:func:`clustertrain.plan.megatron_memory.estimate_megatron_memory`:
distributed optimizer, pipeline stages and the micro-batches they hold in flight). A model that does not fit gets a
hint naming the fields to set (:func:`_memory_hint`): each setting is tried with the memory estimate on the same GPU
count and named only when it fits (for the built-in trainer pp with the memory it leaves); when none fits alone, all
of them together; when that does not fit either, the hint says no setting fits.

Time: training FLOPs = flops_per_token x tokens (the trainer's MFU formula); time on g GPUs =
FLOPs / (g x peak x MFU), times 1 + the pipeline bubble (pp - 1) / (vp x m) with pp > 1
(m = global_batch / (micro_batch x dp) micro-batches per step); the built-in trainer's data-parallel traffic per step
(:mod:`clustertrain.plan.traffic`) is reported beside it, not added to it; for FSDP2 with ``grad_sync: per_microbatch``
and m > 1 also what ``per_step`` would hold and send (:class:`PerStep`), which the plan suggests where it fits. Allocation: the smallest makespan T is found over all candidate finish
times (the least T for which the per-model minimum counts fit the cluster); nodes still free then go
one valid step at a time to the model that finishes last.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from clustertrain.plan.frameworks import BUILTIN, MEGATRON, Framework
from clustertrain.plan.megatron_memory import (
    estimate_megatron_memory,
    megatron_layout,
    megatron_layout_text,
    pipeline_problems,
)
from clustertrain.plan.memory import GiB, MemoryEstimate, estimate_memory, memory_budget, microbatches, pipeline_bubble
from clustertrain.core.model_shape import ModelShape
from clustertrain.plan.traffic import Traffic, data_parallel_traffic
from clustertrain.train.config import ArchConfig, ParallelismConfig, builtin_problems, microbatch_problems
from clustertrain.core.parallel_layout import (
    ParallelLayout,
    node_problems,
    param_dtype_for,
    resolve_layout,
    structure_problems,
    world_problems,
)
from clustertrain.core.parallel_layout import pipeline_problems as split_problems

DAY = 86400.0


@dataclass(frozen=True)
class ModelSpec:
    """Everything the planner needs about one model, as plain values (no project file needed)."""

    name: str
    shape: ModelShape
    tokens: int
    global_batch: int
    micro_batch: int = 1
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    arch: ArchConfig | None = None     # the project's model section (default: built from ``shape``)
    on_gpu: bool = True                # decides param_dtype: auto
    flash_attention: bool = True
    mfu: float = 0.40
    fixed_nodes: int | None = None
    fixed_gpus: int | None = None      # a share of one node (models[].plan.gpus below a node's; clustertrain.plan.packing)
    deadline_days: float | None = None
    framework: Framework = BUILTIN
    index: int | None = None           # position in the project's models: problems name models[index].<field>

    @property
    def total_flops(self) -> float:
        return self.shape.flops_per_token() * self.tokens

    @property
    def param_dtype(self) -> str:
        return param_dtype_for(self.parallelism, self.on_gpu)

    @property
    def megatron(self) -> bool:
        """Planned with Megatron-LM's memory and pipeline arithmetic."""
        return self.framework.name == MEGATRON.name

    @property
    def builtin(self) -> bool:
        """Trained by the built-in trainer (its own rules: :func:`clustertrain.train.config.builtin_problems`)."""
        return self.framework.name == BUILTIN.name

    def path(self, name: str) -> str:
        """``models[i].<name>`` (``<name>`` when the spec has no project index)."""
        return name if self.index is None else f"models[{self.index}].{name}"

    def architecture(self) -> ArchConfig:
        if self.arch is not None:
            return self.arch
        sh = self.shape
        return ArchConfig(layers=sh.layers, hidden=sh.hidden, heads=sh.heads, seq_len=sh.seq_len, vocab=sh.vocab,
                          ffn_hidden=sh.ffn_dim, mlp=sh.mlp, norm=sh.norm, tie_embeddings=sh.tie_embeddings,
                          dropout=sh.dropout, kv_heads=sh.kv_heads, position=sh.position, bias=sh.bias)


@dataclass(frozen=True)
class Hardware:
    gpus_per_node: int                 # ranks per node (CPU workers when there is no GPU)
    gpu_memory_gib: float | None       # per rank; None = unknown (no memory check)
    peak_flops: float | None           # per rank; None = unknown (no time estimate)
    headroom: float = 0.10
    framework_gib: float = 3.0
    network_gbps: float | None = None  # per node (EFA on p4/p5); None = unknown (no network time)


@dataclass(frozen=True)
class PerStep:
    """What ``grad_sync: per_step`` would need and send for a FSDP2 model planned with ``per_microbatch``: the most
    loaded rank's memory, whether it fits the budget, and its data-parallel traffic per step."""

    memory_bytes: int
    fits: bool
    traffic: Traffic | None


@dataclass
class Evaluation:
    """One model on ``gpus`` ranks: layout, memory, time, and why it is infeasible (if it is)."""

    gpus: int
    layout: ParallelLayout | None
    memory: MemoryEstimate | None
    budget_bytes: int | None
    seconds: float | None
    step_seconds: float | None
    reasons: list[str] = field(default_factory=list)
    microbatches: int | None = None    # per step and data-parallel rank: global_batch / (micro_batch x dp)
    bubble: float = 0.0                # pipeline bubble, a fraction of the step's compute (pp > 1)
    traffic: Traffic | None = None     # the built-in trainer's data-parallel collectives per step (dp > 1)
    per_step: PerStep | None = None    # grad_sync per_microbatch: what per_step would hold and send (its suggestion)

    @property
    def ok(self) -> bool:
        return not self.reasons


def layout_problems(spec: ModelSpec, hw: Hardware) -> list[str]:
    """Why the model's parallelism cannot work on any node count: what its framework lacks, a tp that
    does not split the model or does not fit a node, pipeline stages it cannot split into — each naming its field."""
    found = spec.framework.problems(spec.parallelism, spec.param_dtype)
    found += structure_problems(spec.architecture(), spec.parallelism)
    found += node_problems(spec.parallelism, hw.gpus_per_node)
    if spec.megatron:
        found += pipeline_problems(spec.shape, spec.parallelism.pp, spec.parallelism.virtual_stages)
    elif spec.builtin:  # its pipeline split, tied embeddings across stages, ...: what the trainer refuses
        named = {f for f, _ in found}
        found += [(f, message) for f, message in builtin_problems(spec.parallelism, spec.architecture()) if f not in named]
    return [f"{spec.path(f)}: {message}" for f, message in found]


def evaluate(spec: ModelSpec, hw: Hardware, gpus: int) -> Evaluation:
    structural = layout_problems(spec, hw)
    reasons = list(structural)
    par = spec.parallelism
    nodes = gpus / hw.gpus_per_node
    where = f"{nodes:g} node(s) x {hw.gpus_per_node} = {gpus} GPUs"
    layout = None
    m = None
    bubble = 0.0
    world = world_problems(par, gpus)
    if world:
        reasons += [f"{spec.path(f)}: {message} ({where})" for f, message in world]
    else:
        layout = resolve_layout(par, gpus, spec.on_gpu)
        if spec.megatron:
            layout = megatron_layout(layout, par.reduce_dtype)
        m = microbatches(spec.global_batch, spec.micro_batch, layout.dp)
        bubble = pipeline_bubble(layout.pp, par.virtual_stages, m)
        if spec.global_batch % (spec.micro_batch * layout.dp):
            reasons.append(f"global_batch {spec.global_batch} is not a multiple of micro_batch x dp = "
                           f"{spec.micro_batch} x {layout.dp} on {where}")
        elif not spec.megatron:  # torch's schedules; Megatron's 1F1B runs fewer micro-batches than stages too
            reasons += [f"{spec.path(f)}: {message} ({where})" for f, message in microbatch_problems(par, m)]
    memory = budget = None
    if layout is not None and not structural:
        memory = _memory(spec, hw, layout, m)
        if hw.gpu_memory_gib is not None:
            budget = memory_budget(hw.gpu_memory_gib, hw.headroom)
            if memory.total_bytes > budget:
                described = megatron_layout_text(layout, par.virtual_stages) if spec.megatron else layout.describe()
                reasons.append(
                    f"does not fit: needs {memory.total_bytes / GiB:.1f} GiB per GPU ({described}) but "
                    f"{budget / GiB:.1f} GiB is usable ({hw.gpu_memory_gib:g} GiB less {hw.headroom:.0%} headroom); "
                    f"{_memory_hint(spec, hw, gpus, budget, memory.total_bytes)}"
                )
    seconds = step = None
    if hw.peak_flops:
        seconds = spec.total_flops / (gpus * hw.peak_flops * spec.mfu) * (1 + bubble)
        step = (spec.shape.flops_per_token() * spec.global_batch * spec.shape.seq_len / (gpus * hw.peak_flops * spec.mfu)
                * (1 + bubble))
        if spec.deadline_days is not None and seconds > spec.deadline_days * DAY:
            reasons.append(f"takes {seconds / DAY:.1f} days on {where}, over the deadline of {spec.deadline_days:g} days")
    traffic = per_step = None
    if layout is not None and not structural and spec.builtin:
        traffic = data_parallel_traffic(spec.shape, layout, m, hw.gpus_per_node, hw.network_gbps)
        if traffic is not None and layout.grad_sync == "per_microbatch" and m > 1 and budget is not None:
            per_step = _per_step(spec, hw, layout, m, budget)
    return Evaluation(gpus, layout, memory, budget, seconds, step, reasons, m, bubble, traffic, per_step)


def _per_step(spec: ModelSpec, hw: Hardware, layout: ParallelLayout, m: int, budget: int) -> PerStep:
    """``grad_sync: per_step`` on the same layout: one reduce-scatter per step instead of m, every block gathered with
    an unsharded gradient until the step's end (:mod:`clustertrain.plan.memory`)."""
    other = replace(layout, grad_sync="per_step")
    needs = _memory(spec, hw, other, m).total_bytes
    return PerStep(needs, needs <= budget, data_parallel_traffic(spec.shape, other, m, hw.gpus_per_node, hw.network_gbps))


def _memory(spec: ModelSpec, hw: Hardware, layout: ParallelLayout, m: int) -> MemoryEstimate:
    """The most loaded rank's memory of ``spec`` on ``layout`` (``m`` micro-batches per step)."""
    if spec.megatron:
        return estimate_megatron_memory(spec.shape, layout, spec.micro_batch, m, spec.parallelism.virtual_stages,
                                        spec.flash_attention, hw.framework_gib)
    return estimate_memory(spec.shape, layout, spec.micro_batch, spec.flash_attention, hw.framework_gib, m)


_SHARE = {2: "half the", 3: "a third of the", 4: "a quarter of the"}


def _pp_tip(spec: ModelSpec, hw: Hardware, gpus: int, budget: int, needs: int) -> str | None:
    """The built-in trainer's pp hint: the smallest pp above the model's that fits on ``gpus`` GPUs, with the memory of
    its most loaded rank — ``parallelism.pp: 2 (each rank then holds half the layers: 61.2 GiB)``; with tied
    embeddings, also untying them (the trainer cannot tie across stages). Under 1F1B the first stage still holds L
    blocks' activations, and with FSDP2 a stage keeps its blocks gathered with unsharded gradients, so pp may not
    help: None when no pp that runs on ``gpus`` GPUs fits (a hint names only layouts that fit)."""
    par = spec.parallelism
    untie = {"tie_embeddings": False} if spec.shape.tie_embeddings else {}
    shape = replace(spec.shape, **untie)
    arch = spec.architecture().model_copy(update=untie)
    untied = " with model.tie_embeddings: false" if untie else ""
    for pp in range(par.pp + 1, spec.shape.layers // par.virtual_stages + 1):
        trial = par.model_copy(update={"pp": pp})
        if split_problems(arch, trial) or world_problems(trial, gpus):
            continue
        layout = resolve_layout(trial, gpus, spec.on_gpu)
        m = microbatches(spec.global_batch, spec.micro_batch, layout.dp)
        if spec.global_batch % (spec.micro_batch * layout.dp) or microbatch_problems(trial, m):
            continue
        mem = estimate_memory(shape, layout, spec.micro_batch, spec.flash_attention, hw.framework_gib, m)
        if mem.total_bytes >= needs or mem.total_bytes > budget:
            continue
        layers = spec.shape.layers
        if layers % pp:
            share = f"the most loaded rank then holds {mem.layers} of the {layers} layers"
        else:
            share = f"each rank then holds {_SHARE.get(pp, f'{layers // pp} of the {layers}')} layers"
        return f"parallelism.pp: {pp} ({share}: {mem.total_bytes / GiB:.1f} GiB){untied}"
    return None


def _trial_bytes(spec: ModelSpec, hw: Hardware, gpus: int, update: dict, micro_batch: int | None = None,
                 untie: bool = False) -> int | None:
    """The most loaded rank's memory of ``spec`` with its parallelism section ``update``d (and ``micro_batch``, and
    with ``untie`` its embeddings untied) on ``gpus`` GPUs; None when that layout does not run there (its framework
    lacks it, it does not split the model or the world, the batch does not divide)."""
    trial = replace(spec, parallelism=spec.parallelism.model_copy(update=update),
                    micro_batch=micro_batch or spec.micro_batch)
    if untie and spec.shape.tie_embeddings:
        trial = replace(trial, shape=replace(spec.shape, tie_embeddings=False),
                        arch=spec.architecture().model_copy(update={"tie_embeddings": False}))
    par = trial.parallelism
    if layout_problems(trial, hw) or world_problems(par, gpus):
        return None
    layout = resolve_layout(par, gpus, trial.on_gpu)
    if trial.megatron:
        layout = megatron_layout(layout, par.reduce_dtype)
    m = microbatches(trial.global_batch, trial.micro_batch, layout.dp)
    if trial.global_batch % (trial.micro_batch * layout.dp) or (not trial.megatron and microbatch_problems(par, m)):
        return None
    return _memory(trial, hw, layout, m).total_bytes


def _tp_options(spec: ModelSpec, hw: Hardware) -> list[int]:
    """The tps above the model's that its framework offers, split the model and fit a node, smallest first."""
    par, arch = spec.parallelism, spec.architecture()
    out = []
    for tp in range(par.tp + 1, hw.gpus_per_node + 1):
        if not spec.framework.offers_tp(tp):
            break
        trial = par.model_copy(update={"tp": tp})
        if not structure_problems(arch, trial) and not node_problems(trial, hw.gpus_per_node):
            out.append(tp)
    return out


def _memory_hint(spec: ModelSpec, hw: Hardware, gpus: int | None = None, budget: int | None = None,
                 needs: int | None = None) -> str:
    """What makes the model fit, among what its framework implements (fields of models[i]). With ``gpus`` and
    ``budget`` each setting is tried alone on that many GPUs with the memory estimate and named only when it fits
    (tp and pp: the smallest that fits; for the built-in trainer pp with the memory it leaves); when none fits alone,
    all of them together, else the hint says no setting fits. Without a count, the settings that exist."""
    fw, par = spec.framework, spec.parallelism
    tips: list[tuple[str, dict, int | None]] = []   # (text, parallelism update, micro_batch)
    if par.grad_sync == "per_step" and par.zero_stage == 3 and par.pp == 1 and spec.builtin:
        tips.append(("parallelism.grad_sync: per_microbatch", {"grad_sync": "per_microbatch"}, None))
    if par.zero_stage == 0 and spec.megatron:
        tips.append(("parallelism.zero_stage: 1 (the distributed optimizer)", {"zero_stage": 1}, None))
    elif par.zero_stage == 0 and 3 in fw.zero_stages:
        tips.append(("parallelism.zero_stage: 3", {"zero_stage": 3}, None))
    elif par.zero_stage == 3 and not par.reshard_after_forward and not spec.megatron and par.pp == 1:
        tips.append(("parallelism.reshard_after_forward: true", {"reshard_after_forward": True}, None))  # pp > 1: gathered anyway
    if par.recompute != "full" and len(fw.recompute) > 1:
        want = "selective" if par.recompute == "none" and "selective" in fw.recompute else "full"
        if want in fw.recompute:
            tips.append((f"parallelism.recompute: {want}", {"recompute": want}, None))
    tps = _tp_options(spec, hw) if 3 in fw.zero_stages else []
    sp = {"sequence_parallel": True} if fw.sequence_parallel else {}
    tp_text = " with sequence_parallel: true" if fw.sequence_parallel else ""
    pps = []
    if spec.megatron and fw.pp is None:
        pps = [pp for pp in range(par.pp + 1, spec.shape.layers + 1) if spec.shape.layers % pp == 0]
    checked = gpus is not None and budget is not None and needs is not None
    if not checked:  # no count to try them on: the smallest of each
        texts = [t for t, _, _ in tips] + ([f"parallelism.tp: {tps[0]}{tp_text}"] if tps else [])
        texts += ([f"parallelism.pp: {pps[0]}"] if pps else []) + ["a smaller training.micro_batch"] * (spec.micro_batch > 1)
        return "try " + ", ".join(texts) if texts else "use a smaller model or GPUs with more memory"

    def fits(update: dict, micro_batch: int | None = None) -> bool:
        got = _trial_bytes(spec, hw, gpus, update, micro_batch)
        return got is not None and got <= budget

    tried = [t for t, _, _ in tips]
    fitting = [t for t, update, mb in tips if fits(update, mb)]
    if tps:
        tried.append(f"parallelism.tp{tp_text}")
        tp = next((tp for tp in tps if fits({"tp": tp, **sp})), None)
        if tp is not None:
            fitting.append(f"parallelism.tp: {tp}{tp_text}")
    if pps:
        tried.append("parallelism.pp")
        pp = next((pp for pp in pps if fits({"pp": pp})), None)
        if pp is not None:
            fitting.append(f"parallelism.pp: {pp}")
    elif not spec.megatron and fw.pp is None:
        tried.append("parallelism.pp")
        pp_tip = _pp_tip(spec, hw, gpus, budget, needs)
        if pp_tip is not None:
            if len(tried) == 1:
                pp_tip += f": the only layout setting left ({_exhausted(spec, hw)})"
            fitting.append(pp_tip)
    if spec.micro_batch > 1:
        tried.append("training.micro_batch: 1")
        if fits({}, 1):
            fitting.append("a smaller training.micro_batch")
    if fitting:
        return "try " + ", ".join(fitting)
    together = {k: v for _, update, _ in tips for k, v in update.items()}
    named = [t for t, _, _ in tips]
    if tps:
        together.update({"tp": tps[-1], **sp})
        named.append(f"parallelism.tp: {tps[-1]}{tp_text}")
    mb = 1 if spec.micro_batch > 1 else None
    named += ["training.micro_batch: 1"] * (mb is not None)
    if len(named) > 1:
        got = _trial_bytes(spec, hw, gpus, together, mb)
        if got is not None and got <= budget:
            return f"try these together: {', '.join(named)} ({got / GiB:.1f} GiB)"
    untie = not spec.megatron and spec.shape.tie_embeddings
    if "parallelism.pp" in tried and named:  # and the most pipeline stages that run on these GPUs with the rest
        for pp in reversed(pps or range(par.pp + 1, spec.shape.layers // par.virtual_stages + 1)):
            got = _trial_bytes(spec, hw, gpus, {**together, "pp": pp}, mb, untie)
            if got is None:
                continue
            if got <= budget:
                untied = " with model.tie_embeddings: false" if untie else ""
                named.insert(len(named) - (mb is not None), f"parallelism.pp: {pp}{untied}")
                return f"try these together: {', '.join(named)} ({got / GiB:.1f} GiB)"
            break
    if tried:
        how = " alone and together" if len(named) > 1 or (named and "parallelism.pp" in tried) else ""
        return (f"no setting makes it fit on {gpus} GPUs (tried {', '.join(tried)}{how}); use a smaller model or GPUs "
                "with more memory")
    return "use a smaller model or GPUs with more memory"


def _exhausted(spec: ModelSpec, hw: Hardware) -> str:
    """Why no other layout setting is left: ``zero_stage 3 shards every state, recompute full, tp 8 = a node's GPUs``."""
    par = spec.parallelism
    out = ["zero_stage 3 already shards every state over dp" if par.zero_stage == 3 else f"zero_stage {par.zero_stage}",
           f"recompute {par.recompute}"]
    if par.tp == hw.gpus_per_node:
        out.append(f"tp {par.tp} is a node's GPUs")
    else:
        out.append(f"no tp above {par.tp} splits the model within a node")
    return ", ".join(out)


@dataclass
class Allocation:
    units: dict[str, int]                   # model name -> units (nodes, or GPUs with node sharing)
    evaluations: dict[str, Evaluation]
    infeasible: dict[str, list[str]]        # model name -> reasons
    problems: list[str]                     # plan-level problems
    idle_units: int


def _why_never(spec: ModelSpec, hw: Hardware, evals: dict[int, Evaluation], total: int, unit: str) -> list[str]:
    structural = layout_problems(spec, hw)
    if structural:
        return structural
    layout_only = [ev for ev in evals.values() if ev.reasons and all(r.startswith(spec.path("parallelism.")) for r in ev.reasons)]
    if len(layout_only) == len(evals):  # e.g. a fixed dp no count matches: name the field
        return [f"{evals[total].reasons[0]}; no count from 1 to {total} {unit}s suits it"]
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
            infeasible[spec.name] = _why_never(spec, hw, evals, total_units, unit)

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

